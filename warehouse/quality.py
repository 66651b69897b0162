"""Quality gates: great-expectations suites derived from the records and the table
declarations, run over every batch before it lands (`Warehouse.land`) and over everything
landed (`Warehouse.check`).

Per table, from the record: not-null for every non-optional field, valid JSON text for the
nested fields, value sets for Enum and Literal fields, bounds from `Field(ge=..., le=...)`;
from the table: unique keys, declared value bounds (rewards in [-1, 1]) and references
(every step has its rollout, every rollout its task, every score its step). A reference is
checked as a value set on the helper column `ref:<table>`: "found" where the referenced row
exists, in the batch itself or among the landed rows, else the dangling key itself.

GX validates pandas frames; its context is ephemeral (in memory) with analytics off.
"""

from __future__ import annotations

import json
import math
import os
import threading
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from typing import Any, Literal, Union, get_args, get_origin

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pydantic_core

from gymfoundry.warehouse.lake import FAMILY_NAME
from gymfoundry.warehouse.tables import PARTITION, TABLES, Reference, Table

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

# Looks up which of `keys` (tuples of the reference's columns) exist in the landed parent table.
LandedKeys = Callable[[Reference, list[tuple]], set[tuple]]
FOUND = "found"


@dataclass
class TableResult:
    table: str
    rows: int
    success: bool
    failures: list[dict[str, Any]] = field(default_factory=list)
    gx_result: Any = field(default=None, repr=False)  # GX's validation result

    @property
    def result(self) -> dict[str, Any]:
        """GX's validation result, as JSON: made when a report asks (a batch that passes needs none)."""
        return _clean(self.gx_result.to_json_dict()) if self.gx_result is not None else {}


@dataclass
class QualityReport:
    tables: dict[str, TableResult]
    files: list[dict[str, Any]] = field(default_factory=list)  # `Warehouse.check`: every file problem found

    @property
    def success(self) -> bool:
        return all(t.success for t in self.tables.values())

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [f for t in self.tables.values() for f in t.failures]

    def summary(self) -> str:
        return "; ".join(f"{f['table']}.{f['column']}: {f['expectation']} ({f['unexpected_count']} rows)"
                         for f in self.failures) or "all expectations met"

    def to_json(self) -> dict[str, Any]:
        return _clean({"success": self.success, "failures": self.failures, "files": self.files,
                       "tables": {name: {"rows": t.rows, "success": t.success, "result": t.result}
                                  for name, t in self.tables.items()}})


def has_null(values: Iterable[Any]) -> bool:
    return any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values)


def reference_key(values: Iterable[Any]) -> str | None:
    values = list(values)
    if has_null(values):
        return None  # a missing reference is the not-null check's to report
    # pandas turns an int column with a null into floats: 3.0 must still name step 3.
    return json.dumps([int(v) if isinstance(v, float) and v.is_integer() else v for v in values])


def validate_batch(frames: dict[str, pd.DataFrame], landed_keys: LandedKeys,
                   identity: dict[str, list[str]] | None = None) -> QualityReport:
    """Validate one batch, a frame per table (its logical columns); references may point into the
    batch itself. `identity` holds, per table whose key is a content hash, its rows' identity
    verdicts where the caller has them (`record_verdicts`); otherwise they come from the rows."""
    results = {}
    for name, frame in frames.items():
        if len(frame) == 0:
            continue
        table = TABLES[name]
        found = {}
        for ref in table.references:
            keys = set(_distinct_keys(frame, ref.columns, dropna=True))
            parent = frames.get(ref.table)
            in_batch = set(_distinct_keys(parent, TABLES[ref.table].key)) if parent is not None else set()
            missing = sorted(keys - in_batch, key=str)
            found[ref] = (keys & in_batch) | (landed_keys(ref, missing) if missing else set())
        verdicts = (identity or {}).get(name)
        if verdicts is None and table.content_id is not None:
            verdicts = identity_verdicts(table, frame.to_dict("records"))
        results[name] = validate_table(table, frame, found, verdicts)
    return QualityReport(results)


def _keys(frame: pd.DataFrame, columns: Iterable[str]) -> list[tuple]:
    return list(zip(*(frame[c].tolist() for c in columns)))


def _distinct_keys(frame: pd.DataFrame, columns: Iterable[str], dropna: bool = False) -> list[tuple]:
    """`_keys` of the frame's distinct rows over `columns` (each key once: 100k steps name 10k
    rollouts); with `dropna`, less the rows with a null among them."""
    columns = list(columns)
    try:
        frame = frame[columns].dropna() if dropna else frame[columns]
        return _keys(frame.drop_duplicates(), columns)
    except TypeError:  # pandas hashes some values Python does not (and the other way round)
        return list({k for k in _keys(frame, columns) if not (dropna and has_null(k))})


def _isin(values: pd.Series, keys: list[Any]) -> np.ndarray:
    """Per value: is it one of `keys` (vectorised in Arrow where both are text; pandas' `isin` on its
    Arrow-backed strings turns every key into an Arrow scalar first)."""
    if not keys:
        return np.zeros(len(values), dtype=bool)
    try:
        array = pa.array(values, from_pandas=True)
        if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
            found = pc.is_in(array, value_set=pa.array(keys, array.type))
            return np.asarray(found.fill_null(False), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        pass
    return np.asarray(values.isin(keys), dtype=bool)


def identity_verdicts(table: Table, rows: list[dict[str, Any]]) -> list[str] | None:
    """Per row of a table whose key is a content hash: FOUND where the row is a valid record whose
    content hashes to its stored id (the record's own rule), else what is wrong with it."""
    if table.content_id is None:
        return None
    verdicts = []
    for row in rows:
        stored = row.get(table.content_id)
        try:
            expected = getattr(table.record({**row, table.content_id: ""}), table.content_id)
        except (ValueError, TypeError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
            verdicts.append(f"{stored}: not a valid {table.model.__name__} ({str(exc).splitlines()[0]})")
            continue
        verdicts.append(FOUND if expected == stored else f"{stored}: its content hashes to {expected}")
    return verdicts


def record_verdicts(table: Table, records: list) -> list[str] | None:
    """`identity_verdicts` of records (the rows `table.arrow` makes of them) without rebuilding
    each record from its row: a record that pydantic validated holds a valid value in every field,
    so only its id is in question, and `compute_id` (the record's own rule) answers that. A record
    whose id is not its content's (a `model_copy(update=...)` or an assignment after validation)
    is judged from its row, which also says when it is no valid record at all."""
    if table.content_id is None:
        return None
    verdicts = []
    for record in records:
        try:
            expected = record.compute_id()
        except Exception:  # a value no serializer takes: the row says what is wrong
            expected = None
        stored = getattr(record, table.content_id)
        verdicts.append(FOUND if expected == stored else identity_verdicts(table, [table.row(record)])[0])
    return verdicts


def tampered(table: Table, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows whose stored id is not their content's."""
    verdicts = identity_verdicts(table, rows) or [FOUND] * len(rows)
    return [row for row, verdict in zip(rows, verdicts) if verdict != FOUND]


FINITE = "finite:"  # the helper column of a float column holding NaN or an infinity


def finite_verdict(value: Any) -> str:
    """FOUND for a null or a finite number; else the value as text (what the report shows)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return FOUND


def validate_table(table: Table, frame: pd.DataFrame, found: dict[Reference, set[tuple]],
                   identity: list[str] | None = None) -> TableResult:
    """Validate one table's rows; `found` holds, per reference, the referenced keys that exist;
    `identity` the rows' `identity_verdicts` where the table's key is a content hash. The column
    rules run as one expectation (`table_expectations(one_pass=True)`); a batch that fails is
    validated again with one expectation per column and rule, whose results the report shows."""
    frame = frame.copy(deep=False)  # the helper columns are this validation's, not the caller's
    checks: list[tuple[str, str, str]] = []  # (helper column, meta key, what its value set checks)
    if identity is not None:
        column = f"id:{table.content_id}"
        frame[column] = identity
        checks.append((column, "rule", f"{table.content_id} is the hash of the content"))
    for column in [c for c in frame.columns if c.startswith(FINITE)]:  # made by staged.frame
        checks.append((column, "rule", f"{column.removeprefix(FINITE)} is a finite number"))
    for ref in table.references:
        column = f"ref:{ref.table}"
        exists = found.get(ref, set())
        # FOUND where the key names a row, else the key itself (so the report shows it; None where a
        # key column is null, which the not-null check reports): a tiny value set. Membership is
        # tested on the key tuples (one column: on the values, vectorised); only a dangling key is rendered.
        if len(ref.columns) == 1:
            values = frame[ref.columns[0]]
            dangling = pd.Series(~_isin(values, [k[0] for k in exists]), index=frame.index)
            frame[column] = pd.Series(FOUND, index=frame.index, dtype=object)
            if dangling.any():
                frame.loc[dangling, column] = [reference_key((v,)) for v in values[dangling].tolist()]
        else:
            frame[column] = [FOUND if k in exists else reference_key(k) for k in _keys(frame, ref.columns)]
        checks.append((column, "reference", f"{','.join(ref.columns)} -> {ref.table}"))
    for column in table.columns:
        if pa.types.is_list(column.type) and column.name in frame and frame[column.name].dtype == object:
            # A list reaches GX as its length (null where the list is): not-null is the only rule on
            # a list, and with no unhashable values GX fingerprints the frame by hashing it rather
            # than pickling it whole. (`staged.frame` hands over the lengths already, from Arrow.)
            frame[column.name] = pd.Series([len(v) if isinstance(v, (list, tuple, np.ndarray)) else v
                                            for v in frame[column.name].tolist()], index=frame.index)

    def suite(one_pass: bool):
        return _gx().ExpectationSuite(name=f"gymfoundry.{table.name}",
                                      expectations=table_expectations(table.name, one_pass, checks))

    one_pass = suite(True)
    # GX fingerprints (hashes) the whole frame it is given: give it the columns its expectations read.
    frame = frame[[c for c in frame.columns if c in _read(one_pass.expectations)]]
    with _LOCK:
        result = _validate(frame, one_pass, "BOOLEAN_ONLY")  # the common case, and cheaper
        if not result.success:  # again, rule by rule, with the offending values for the report
            detailed = _validate(frame, suite(False), "SUMMARY")
            result = detailed if not detailed.success else _validate(frame, suite(True), "SUMMARY")
    failures = [_failure(table.name, r) for r in result.results if not r.success]
    return TableResult(table.name, len(frame), result.success, failures, gx_result=result)


def _validate(frame: pd.DataFrame, suite, result_format: str):
    """GX's validator over the frame: what `Batch.validate` does, less the batch it builds first
    and then builds again inside (each build hashes the whole frame for its fingerprint)."""
    from great_expectations.execution_engine import pandas_execution_engine as engine  # local: GX is heavy
    from great_expectations.validator.v1_validator import Validator  # local: GX is heavy

    validator = Validator(batch_definition=_batch_definition(), batch_parameters={"dataframe": frame},
                          result_format=result_format)
    # GX hashes the whole frame for a fingerprint it only records among the batch's markers (under
    # HASH_THRESHOLD bytes); the gates read no marker. Off while this validation runs (callers hold _LOCK).
    threshold, engine.HASH_THRESHOLD = engine.HASH_THRESHOLD, 0
    try:
        return validator.validate_expectation_suite(suite)
    finally:
        engine.HASH_THRESHOLD = threshold


def _read(expectations: list) -> set[str]:
    """The columns the expectations read."""
    read = set()
    for expectation in expectations:
        config = expectation.configuration.kwargs
        read.update([config["column"]] if "column" in config else config.get("column_list", []))
    return read


def record_rules(name: str) -> dict[str, Any]:
    """What every row of a table must hold, column by column, from its record and declaration:
    `not_null` columns, `json` text columns, `regex` per column (the partition), value `sets` and
    `bounds` ([min, max, strict_min, strict_max]). Nulls meet every rule but `not_null`."""
    table = TABLES[name]
    fields = table.model.model_fields
    rules: dict[str, Any] = {"not_null": [], "json": [], "regex": {}, "sets": {}, "bounds": {}}
    for column in table.columns:
        c = column.name
        if not column.nullable:
            rules["not_null"].append(c)
        if column.is_json:
            rules["json"].append(c)
        if c == PARTITION:
            rules["regex"][c] = FAMILY_NAME.pattern
        info = fields.get(c)
        if info is None or column.is_json:
            continue
        values = _value_set(info.annotation)
        if values is not None:
            rules["sets"][c] = values
        low, high, strict_low, strict_high = _bounds(info.metadata)
        if low is not None or high is not None:
            rules["bounds"][c] = [low, high, strict_low, strict_high]
    rules["bounds"].update({c: [low, high, False, False] for c, low, high in table.bounds})
    return rules


def table_expectations(name: str, one_pass: bool = False,
                       helpers: Iterable[tuple[str, str, str]] = ()) -> list:
    """The expectations of a table (new objects each call: a suite takes ownership of its
    expectations): one per column and rule, the key's uniqueness, and per helper column of the
    batch (`(column, meta key, what it checks)`: `id:<key>`, `ref:<table>`) its value set [FOUND];
    or with `one_pass` all of these as one multicolumn expectation (GX plans and resolves each
    expectation at a fixed cost, then evaluates this one in one pass over the frame)."""
    gx = _gx()
    table = TABLES[name]
    helpers = list(helpers)
    if one_pass:
        rules = record_rules(name)
        rules = {**rules, "sets": {**rules["sets"], **{column: [FOUND] for column, _, _ in helpers}},
                 "unique": list(table.key)}
        # The rules travel as JSON text: GX copies an expectation's arguments every time it looks at
        # its configuration (hundreds of times per validation), and a string is copied for free.
        return [_rules_expectation()(column_list=[c.name for c in table.columns] + [c for c, _, _ in helpers],
                                     rules=json.dumps(rules, sort_keys=True), ignore_row_if="never")]
    rules = record_rules(name)
    out = []
    for c in rules["not_null"]:
        out.append(gx.expectations.ExpectColumnValuesToNotBeNull(column=c))
    for c in rules["json"]:
        out.append(_json_expectation()(column=c))
    for c, regex in rules["regex"].items():
        out.append(gx.expectations.ExpectColumnValuesToMatchRegex(column=c, regex=regex))
    for c, values in rules["sets"].items():
        out.append(gx.expectations.ExpectColumnValuesToBeInSet(column=c, value_set=values))
    for c, (low, high, strict_low, strict_high) in rules["bounds"].items():
        out.append(gx.expectations.ExpectColumnValuesToBeBetween(
            column=c, min_value=low, max_value=high, strict_min=strict_low, strict_max=strict_high))
    if len(table.key) == 1:
        out.append(gx.expectations.ExpectColumnValuesToBeUnique(column=table.key[0]))
    else:
        out.append(gx.expectations.ExpectCompoundColumnsToBeUnique(column_list=list(table.key)))
    out += [gx.expectations.ExpectColumnValuesToBeInSet(column=column, value_set=[FOUND], meta={kind: meaning})
            for column, kind, meaning in helpers]
    return out


def rows_hold(frame: pd.DataFrame, rules: dict[str, Any] | str) -> pd.Series:
    """Per row: does it hold every rule of `record_rules` (what the per-column expectations check),
    and, where `rules` names a `unique` key, is its key the only one of the frame. `rules` may be
    given as JSON text."""
    if isinstance(rules, str):
        rules = _parsed_rules(rules)
    ok = pd.Series(True, index=frame.index)
    for c in rules["not_null"]:
        ok &= frame[c].notna()
    for c in rules["json"]:
        ok &= frame[c].isna() | valid_json(frame[c])
    for c, regex in rules["regex"].items():  # each distinct text matched once (a batch has a few families)
        # by text, as GX matches: values equal but printed apart (0.0 and -0.0) are matched apart
        text = frame[c].dropna().astype(str)
        distinct = text.drop_duplicates()
        bad = distinct[~distinct.str.contains(regex)]  # the regex engine GX's would use
        if len(bad):
            ok &= ~text.isin(bad).reindex(frame.index, fill_value=False)
    for c, values in rules["sets"].items():
        ok &= frame[c].isna() | frame[c].isin(values)
    for c, (low, high, strict_low, strict_high) in rules["bounds"].items():
        values = frame[c]
        within = pd.Series(True, index=frame.index)
        if low is not None:
            within &= values > low if strict_low else values >= low
        if high is not None:
            within &= values < high if strict_high else values <= high
        ok &= values.isna() | within
    key = rules.get("unique")
    if key:
        # What GX's uniqueness expectations check: no two rows share a key (a row whose key columns
        # are all null is not compared; a null key column is the not-null rule's to report).
        keys = frame[key]
        compared = keys.notna().any(axis=1)
        ok &= ~(keys[compared].duplicated(keep=False).reindex(frame.index, fill_value=False))
    return ok

@cache
def _parsed_rules(text: str) -> dict[str, Any]:
    return json.loads(text)


def _value_set(annotation: Any) -> list[str] | None:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            return None
        annotation = args[0]
    if get_origin(annotation) is Literal:
        return sorted(str(v) for v in get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return sorted(str(m.value) for m in annotation)
    return None


def _bounds(metadata: list[Any]) -> tuple[float | None, float | None, bool, bool]:
    low = high = None
    strict_low = strict_high = False
    for m in metadata:
        if getattr(m, "ge", None) is not None:
            low = m.ge
        if getattr(m, "gt", None) is not None:
            low, strict_low = m.gt, True
        if getattr(m, "le", None) is not None:
            high = m.le
        if getattr(m, "lt", None) is not None:
            high, strict_high = m.lt, True
    return low, high, strict_low, strict_high


def _failure(table: str, result) -> dict[str, Any]:
    config = result.expectation_config
    kwargs = {k: v for k, v in config.kwargs.items() if k not in ("batch_id", "value_set")}
    if "value_set" in config.kwargs and len(config.kwargs["value_set"]) <= 20:
        kwargs["value_set"] = config.kwargs["value_set"]
    column = kwargs.get("column") or ",".join(kwargs.get("column_list", []))
    info = result.result or {}
    return _clean({"table": table, "column": column, "expectation": config.type, "kwargs": kwargs,
                   "meta": dict(config.meta or {}), "unexpected_count": info.get("unexpected_count"),
                   "examples": (info.get("partial_unexpected_list") or [])[:10],
                   "error": (result.exception_info or {}).get("exception_message")})


def _clean(value: Any) -> Any:
    """JSON-safe: NaN becomes null; a long value set in a report becomes its size."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: (f"<{len(v)} values>" if k == "value_set" and isinstance(v, list) and len(v) > 20
                    else _clean(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, float):
        return value
    return str(value)


_LOCK = threading.Lock()


@cache
def _gx():
    import great_expectations  # local: great_expectations is heavy (seconds to import)

    return great_expectations


@cache
def _json_expectation():
    """`expect_column_values_to_be_valid_json`: great-expectations' map expectation over a metric that
    parses each value with pydantic's JSON parser (Rust; strict RFC 8259, no NaN), where GX's own
    `expect_column_values_to_be_json_parseable` runs `json.loads` (four times slower per value, and
    it takes NaN). Defined on first use: defining a GX expectation registers it."""
    from great_expectations.execution_engine import PandasExecutionEngine  # local: GX is heavy
    from great_expectations.expectations.expectation import ColumnMapExpectation  # local: GX is heavy
    from great_expectations.expectations.metrics import ColumnMapMetricProvider, column_condition_partial  # local: GX is heavy

    class ColumnValuesValidJson(ColumnMapMetricProvider):
        condition_metric_name = "column_values.valid_json"

        @column_condition_partial(engine=PandasExecutionEngine)
        def _pandas(cls, column, **kwargs):  # GX hands over the non-null values
            return valid_json(column)

    class ExpectColumnValuesToBeValidJson(ColumnMapExpectation):
        """Expect the column's values to be JSON text."""

        map_metric = "column_values.valid_json"

    return ExpectColumnValuesToBeValidJson


@cache
def _rules_expectation():
    """`expect_rows_to_hold_their_record_rules`: great-expectations' multicolumn map expectation over
    a metric that checks every column rule of `record_rules` (passed as the `rules` argument) in one
    pass over the frame (`rows_hold`). GX plans and resolves each expectation at a fixed cost whatever
    the batch's size, and a table has up to 23 column rules: this is one. Defined on first use
    (defining an expectation registers it)."""
    from great_expectations.execution_engine import PandasExecutionEngine  # local: GX is heavy
    from great_expectations.expectations.expectation import MulticolumnMapExpectation  # local: GX is heavy
    from great_expectations.expectations.metrics.map_metric_provider import (MulticolumnMapMetricProvider,  # local: GX is heavy
                                                                             multicolumn_condition_partial)

    class MulticolumnValuesHoldRecordRules(MulticolumnMapMetricProvider):
        condition_metric_name = "multicolumn_values.hold_record_rules"
        condition_domain_keys = ("batch_id", "table", "column_list", "row_condition", "condition_parser",
                                 "ignore_row_if")
        condition_value_keys = ("rules",)

        @multicolumn_condition_partial(engine=PandasExecutionEngine)
        def _pandas(cls, column_list, rules, **kwargs):
            return rows_hold(column_list, rules)

    class ExpectRowsToHoldTheirRecordRules(MulticolumnMapExpectation):
        """Expect every row to hold its record's column rules (not null, JSON, regex, value sets, bounds)."""

        rules: str  # `record_rules` (and the batch's helper columns, the key) as JSON text
        map_metric = "multicolumn_values.hold_record_rules"
        success_keys = ("mostly", "rules")
        args_keys = ("column_list", "rules")

    return ExpectRowsToHoldTheirRecordRules


def valid_json(values: pd.Series) -> pd.Series:
    """Per value: is it JSON text (`_is_json`)? Each distinct text is parsed once: tool calls, costs and
    outcomes repeat across a batch's steps and rollouts."""
    try:
        distinct = pd.unique(values)
    except TypeError:  # an unhashable value (a dict where text belongs): no text at all
        return pd.Series([_is_json(v) for v in values.tolist()], index=values.index, dtype=bool)
    bad = [v for v in distinct.tolist() if not _is_json(v)]
    return ~values.isin(bad) if bad else pd.Series(True, index=values.index)


def _is_json(value: Any) -> bool:
    if not isinstance(value, (str, bytes)):
        return False
    try:
        pydantic_core.from_json(value, allow_inf_nan=False)
    except ValueError:
        return False
    return True


@cache
def _batch_definition():
    gx = _gx()
    from great_expectations.data_context.types.base import (DataContextConfig, InMemoryStoreBackendDefaults,  # local: GX is heavy
                                                            ProgressBarsConfig)

    config = DataContextConfig(store_backend_defaults=InMemoryStoreBackendDefaults(), analytics_enabled=False,
                               progress_bars=ProgressBarsConfig(globally=False))
    context = gx.get_context(mode="ephemeral", project_config=config)
    asset = context.data_sources.add_pandas("gymfoundry").add_dataframe_asset("batch")
    return asset.add_batch_definition_whole_dataframe("whole")


# Checks across tables that `Warehouse.check` runs in SQL; each query counts offending rows.
INTEGRITY_CHECKS = {
    "no_holdout_task_in_a_dataset": """
        SELECT count(*) AS n FROM dataset_rows r JOIN tasks t USING (task_id)
        WHERE t.split = 'holdout' OR t.template_id IN (SELECT template_id FROM tasks WHERE split = 'holdout')""",
    "no_template_group_in_two_splits": """
        SELECT count(*) AS n FROM (SELECT template_id FROM tasks GROUP BY 1 HAVING count(DISTINCT split) > 1)""",
    "dataset_rows_name_landed_rollouts": """
        SELECT count(*) AS n FROM (SELECT DISTINCT unnest(rollout_ids) AS rollout_id FROM dataset_rows)
        ANTI JOIN rollouts USING (rollout_id)""",
    "every_rollout_has_its_steps": """
        SELECT count(*) AS n FROM rollouts r
        LEFT JOIN (SELECT rollout_id, count(*) AS k FROM steps GROUP BY 1) s USING (rollout_id)
        WHERE coalesce(s.k, 0) <> CAST(json_extract(r.cost, '$.steps') AS BIGINT)""",
}


def integrity(count: Callable[[str], int]) -> TableResult:
    failures = []
    for name, sql in INTEGRITY_CHECKS.items():
        try:
            n = count(sql)
        except Exception as exc:  # a broken view is a failure too, not a crash of the check
            failures.append({**error_failure("integrity", exc), "expectation": name})
            continue
        if n:
            failures.append({"table": "integrity", "column": "", "expectation": name, "kwargs": {},
                             "meta": {}, "unexpected_count": n, "examples": [], "error": None})
    return TableResult("integrity", len(INTEGRITY_CHECKS), not failures, failures)


def error_failure(table: str, exc: Exception) -> dict[str, Any]:
    return {"table": table, "column": "", "expectation": "readable", "kwargs": {}, "meta": {},
            "unexpected_count": None, "examples": [], "error": f"{type(exc).__name__}: {exc}"}
