"""Staging: everything of a landing that needs no catalog, done where the records are.

"Workers write, one process registers": `stage(data_dir, tasks=..., rollouts=...)` runs in any
process (a rollout worker, a Dask worker). It builds the table rows column-wise into Arrow,
keeps the first row of each key (and a tampered task copy, and every verdict), checks the content
ids, runs the great-expectations gates on the batch and writes the Parquet files into
`<data_dir>/incoming/<stage_id>/` — a folder no reader of the lake and no writer's recovery looks
into. The result, a picklable `Staged`, goes
to the one process that holds the catalog, whose `Warehouse.land_staged` only checks what needs
the catalog (which keys are new, whether the references the batch does not satisfy itself are
landed) and registers the files in one transaction (see catalog.register). A batch with a key
already landed, a reference found nowhere, or a failed gate takes the writer's full path instead
(`Warehouse.land`'s semantics exactly: only new rows land, a rollout already landed is skipped
with all its steps, a failing batch goes whole to quarantine with its report).
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic_core import PydanticSerializationError

from gymfoundry.envs.records import (DatasetManifest, DatasetRow, HoldoutLock, Record, Rollout, Run, StepScore, TaskRejection,
                          TaskSpec, Verdict)
from gymfoundry.warehouse import quality
from gymfoundry.warehouse.lake import BATCH_ID, Batch, file_sha256, lake_file, staging_path, write_batches
from gymfoundry.warehouse.schema import check_lists
from gymfoundry.warehouse.tables import PARTITION, TABLES, Reference, Table

STAGE_ID = re.compile(r"[0-9a-f]{32}")
INCOMING_DIR = "incoming"  # `incoming/<stage_id>/staging/<table>/task_family=<f>/<batch>.parquet`

# One table's rows in a batch: an Arrow table of its logical columns (always, for rows made from
# valid records), or row dicts whose values do not fit those columns (the gates say why).
Part = pa.Table | list[dict[str, Any]]
CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, KeyError, PydanticSerializationError,
                     OverflowError)
# What a valid record may hold that no column can: an int beyond int64, a lone surrogate in text. Such a
# rollout is refused, never its batch (see `refusal`); a value of another type than its field's (a
# record built without validation) still meets the gates, which say why.
UNSTORABLE = (OverflowError, UnicodeError)
# A batch that fails to stage elsewhere on a value (not narrowed to a rollout) goes whole to quarantine
# with why; a full disk (pyarrow's IO errors are OSErrors) or a caller's mistake still raises.
STAGING_ERRORS = (*UNSTORABLE, PydanticSerializationError, pa.ArrowInvalid, pa.ArrowTypeError,
                  pa.ArrowNotImplementedError)
RECORD_KEYWORDS = ("tasks", "rejections", "rollouts", "scores", "runs", "datasets", "dataset_rows", "outcomes",
                   "holdout_locks")
# Rows that belong to a rollout of the same batch: skipped with it when the rollout landed before.
OWNED_BY_ROLLOUT = {"steps": "rollout_id", "sub_rollouts": "parent_rollout_id"}


@dataclass
class Staged:
    """A batch ready to land: its rows per table, the files `stage` wrote (paths under
    `incoming/<stage_id>/`), and what only the catalog can answer. Pickled to another process it
    leaves its rows behind when its files hold them (the writer reads them back if it needs them)."""

    data_dir: str
    stage_id: str
    parts: dict[str, Part] | None
    gate: bool
    passed: bool  # gated (or gates off) and written: the fast path is open
    batches: list[Batch] = field(default_factory=list)  # `path` is the lake path; the file is under incoming
    tables: list[str] = field(default_factory=list)  # every table of the batch, empty ones included
    identity: dict[str, list[str]] = field(default_factory=dict)  # content-id verdicts, aligned with `parts`
    unresolved: list[tuple[Reference, list[tuple]]] = field(default_factory=list)  # not in the batch itself
    derived_outcomes: list[tuple] = field(default_factory=list)  # keys of the rollouts' own verdicts (first rows)
    keys: dict[str, pa.Table] = field(default_factory=dict)  # each table's key columns, for the new-key check
    # What the writer quarantines instead of landing: rows by table (rollouts no column could hold,
    # with their steps and scores; or the whole batch when it could not be staged) and why.
    refused: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    refusals: list[dict[str, Any]] = field(default_factory=list)  # quality-report failures naming the field

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.passed:
            state["parts"], state["identity"] = None, {}  # the files hold the rows (read back in another order)
        return state

    @property
    def folder(self) -> Path:
        return Path(self.data_dir) / INCOMING_DIR / self.stage_id

    def incoming(self, batch: Batch) -> Path:
        """Where `stage` wrote the batch file: the data dir's layout (`staging/...`) under the folder."""
        return self.folder / staging_path(batch.path)

    def rows(self) -> dict[str, Part]:
        """The batch's rows per table: as staged, or read back from the files."""
        if self.parts is not None:
            return self.parts
        parts: dict[str, list[pa.Table]] = {name: [] for name in self.tables}
        for batch in self.batches:
            table = TABLES[batch.table]
            data = pq.read_table(self.incoming(batch), schema=table.file_schema)
            if table.partitioned:
                data = data.append_column(PARTITION, pa.array([batch.task_family] * data.num_rows, pa.string()))
            parts[batch.table].append(data.select(table.schema.names).cast(table.schema))
        return {name: pa.concat_tables(tables) if tables else TABLES[name].schema.empty_table()
                for name, tables in parts.items()}

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def check(self, data_dir: Path) -> None:
        """Refuse a batch that is not what `stage` makes for `data_dir`: it names paths the writer moves
        and removes. (Its gates are not run again: hand `land_staged` only what your own workers staged.)"""
        if Path(self.data_dir).resolve() != data_dir:
            raise ValueError(f"the batch was staged for {self.data_dir}, not for {data_dir}")
        if not STAGE_ID.fullmatch(self.stage_id):
            raise ValueError(f"{self.stage_id!r} is no stage id")
        for batch in self.batches:
            table = TABLES.get(batch.table)
            if table is None or batch.path != lake_file(table, batch.task_family, batch.batch_id) \
                    or not BATCH_ID.fullmatch(batch.batch_id):
                raise ValueError(f"{batch.path!r} is not where a batch of table {batch.table!r} is staged")
        if self.passed and self.batches and not self.folder.is_dir():
            raise ValueError(f"nothing is staged under {self.folder}: the batch landed (or was discarded) already")
        for batch in self.batches if self.passed else []:
            file = self.incoming(batch)
            if not file.is_file() or file_sha256(file) != batch.sha256:
                raise ValueError(f"the staged file {file} is missing or changed since it was staged and gated; "
                                 "nothing of the batch landed: stage it again")


def stage(data_dir: str | os.PathLike, *, tasks: Iterable[TaskSpec] | None = None,
          rejections: Iterable[TaskRejection] | None = None, rollouts: Iterable[Rollout] | None = None,
          scores: Iterable[StepScore] | None = None, runs: Iterable[Run] | None = None,
          datasets: Iterable[DatasetManifest] | None = None, dataset_rows: Iterable[DatasetRow] | None = None,
          family_of: Mapping[str, str] | None = None, outcomes: Iterable[Verdict] | None = None,
          rollout_outcomes: bool = False, holdout_locks: Iterable[HoldoutLock] | None = None, gate: bool = True,
          run_id: str | None = None, flow_run_id: str | None = None) -> Staged:
    """Stage a batch for `Warehouse.land_staged` (the keywords are `Warehouse.land`'s). Needs no
    catalog: a score's family comes from `family_of` or the batch's rollouts."""
    batch = {k: v for k, v in zip(RECORD_KEYWORDS, (tasks, rejections, rollouts, scores, runs, datasets, dataset_rows,
                                                     outcomes, holdout_locks)) if v is not None}
    batch = {k: list(v) for k, v in batch.items()}  # kept whole for quarantine if staging fails
    was_enabled = gc.isenabled()
    gc.disable()  # millions of small containers, no cycles worth collecting (see store._collector_paused)
    try:
        refused: dict[str, list[dict[str, Any]]] = {}
        refusals: list[dict[str, Any]] = []
        parts, derived, task_rows = _parts(
            batch.get("tasks"), batch.get("rejections"), batch.get("rollouts"), batch.get("scores"), batch.get("runs"),
            batch.get("datasets"), batch.get("dataset_rows"), family_of, batch.get("outcomes"), rollout_outcomes,
            batch.get("holdout_locks"), run_id, flow_run_id, refused, refusals)
        staged = _gate_and_write(Path(data_dir).resolve(), parts, derived, gate, task_rows)
        staged.refused, staged.refusals = refused, refusals
        return staged
    except STAGING_ERRORS as exc:
        return _unstaged(Path(data_dir).resolve(), batch, exc, gate)
    finally:
        if was_enabled:
            gc.enable()


def unstageable(exc: BaseException, rows: int) -> dict[str, Any]:
    """The gate failure of a batch no table could take (why, in the exception's words)."""
    return {"table": "batch", "column": "", "expectation": "stageable", "kwargs": {}, "meta": {},
            "unexpected_count": rows, "examples": [], "error": f"{type(exc).__name__}: {exc}"[:1000]}


def _unstaged(data_dir: Path, batch: dict[str, list[Record]], exc: BaseException, gate: bool) -> Staged:
    """A batch staging refused whole: nothing to land; the writer quarantines its records with why."""
    rows = {name: [r.model_dump(mode="json") for r in records] for name, records in batch.items()}
    return Staged(str(data_dir), uuid.uuid4().hex, {}, gate, False, refused=rows,
                  refusals=[unstageable(exc, sum(map(len, rows.values())))])


def refusal(table: Table, record: Record, **added: Any) -> dict[str, Any] | None:
    """Why `table` cannot hold a value of `record` (a gate failure naming the column), or None: Arrow
    is asked for a plain column; a JSON column's text must encode as UTF-8."""
    row = table.row(record, **added)
    for column in table.columns:
        value = row.get(column.name)
        try:
            if column.is_json:
                if value is not None:  # `Table.row`'s JSON is ASCII, a lone surrogate escaped
                    json.dumps(json.loads(value), ensure_ascii=False).encode()
            else:
                pa.array([value], column.type)
        except UNSTORABLE as exc:
            return {"table": table.name, "column": column.name, "expectation": "storable", "kwargs": {}, "meta": {},
                    "unexpected_count": 1, "examples": [], "error": f"{type(exc).__name__}: {exc}"[:500]}
        except CONVERSION_ERRORS:
            pass  # another type than the column's: the gates say why
    return None


def _rollout_parts(rollouts: list[Rollout], run_id: str | None, flow_run_id: str | None) -> dict[str, Part]:
    parts = {"rollouts": arrow_part(TABLES["rollouts"], rollouts, run_id=run_id, flow_run_id=flow_run_id),
             "steps": arrow_part(TABLES["steps"], [step for r in rollouts for step in r.steps],
                                 **_step_owners(rollouts))}
    subs = [sub for r in rollouts for sub in r.subrollouts]
    if subs:  # a delegating rollout's sub-agents' episodes
        parts["sub_rollouts"] = arrow_part(TABLES["sub_rollouts"], subs)
    return parts


def _rollout_refusals(rollouts: list[Rollout], run_id: str | None, flow_run_id: str | None) -> dict[str, dict]:
    """rollout_id -> the first of its rows no column can hold (the failure names the rollout and step)."""
    refused = {}
    for r in rollouts:
        checks = [(TABLES["rollouts"], r, {"run_id": run_id, "flow_run_id": flow_run_id}, {})]
        checks += [(TABLES["steps"], s, {"rollout_id": r.rollout_id, "task_family": r.family}, {"step_index": s.index})
                   for s in r.steps]
        checks += [(TABLES["sub_rollouts"], sub, {}, {"sub_rollout": i}) for i, sub in enumerate(r.subrollouts)]
        for table, record, added, where in checks:
            failure = refusal(table, record, **added)
            if failure is not None:
                refused[r.rollout_id] = {**failure, "meta": {"rollout_id": r.rollout_id, **where},
                                         "examples": [r.rollout_id]}
                break
    return refused


def _parts(tasks, rejections, rollouts, scores, runs, datasets, dataset_rows, family_of, outcomes, rollout_outcomes,
           holdout_locks, run_id, flow_run_id, refused, refusals):
    """The batch's rows per table (first row of each key kept; the tasks' content ids are not checked
    yet: see `_task_verdicts`), the keys of the verdicts derived from the rollouts, and the tasks
    with all their rows (None when the batch has none). A rollout no column can hold is left out,
    with its scores: its rows go to `refused` and why to `refusals`."""
    parts: dict[str, Part] = {}
    task_rows = None
    if tasks is not None:
        tasks = list(tasks)
        part = arrow_part(TABLES["tasks"], tasks)
        keep = first_of_each_key(TABLES["tasks"], part)
        task_rows = (tasks, part, keep)
        parts["tasks"] = take(part, keep)
    if rejections is not None:
        parts["task_rejections"] = arrow_part(TABLES["task_rejections"], list(rejections))
    families = dict(family_of or {})
    verdicts: list[Verdict] = []
    derived: list[tuple] = []
    if rollouts is not None:
        by_id: dict[str, Rollout] = {}
        for rollout in rollouts:
            by_id.setdefault(rollout.rollout_id, rollout)
        families.update({rid: r.family for rid, r in by_id.items()})
        unique = list(by_id.values())
        rollout_parts = _rollout_parts(unique, run_id, flow_run_id)
        if not all(isinstance(part, pa.Table) for part in rollout_parts.values()):
            # Some rollout's values did not convert a column at a time: find any no column can hold.
            failures = _rollout_refusals(unique, run_id, flow_run_id)
            if failures:
                out = [r for r in unique if r.rollout_id in failures]
                unique = [r for r in unique if r.rollout_id not in failures]
                rollout_parts = _rollout_parts(unique, run_id, flow_run_id)
                scores, out_scores = _split_scores(scores, failures)
                _refuse(refused, refusals, out, out_scores, failures, run_id, flow_run_id)
        parts.update(rollout_parts)
        if rollout_outcomes:
            now = datetime.now(timezone.utc).isoformat(timespec="seconds")
            verdicts += [v for v in (Verdict.of_rollout(r, now) for r in unique) if v is not None]
            derived = [(v.rollout_id, v.verifier_id, v.verifier_version) for v in verdicts]
    if outcomes is not None:
        verdicts += list(outcomes)
    if rollout_outcomes and rollouts is not None or outcomes is not None:
        parts["outcomes"] = arrow_part(TABLES["outcomes"], verdicts)
    if scores is not None:
        scores = list(scores)
        unknown = sorted({s.rollout_id for s in scores} - families.keys())
        if unknown:
            raise ValueError(f"no task family known for rollouts {unknown}; land them first or pass family_of")
        parts["step_scores"] = arrow_part(TABLES["step_scores"], scores,
                                          task_family=[families[s.rollout_id] for s in scores])
    for name, records in (("runs", runs), ("datasets", datasets), ("dataset_rows", dataset_rows),
                          ("holdout_locks", holdout_locks)):
        if records is not None:
            parts[name] = arrow_part(TABLES[name], list(records))
    for name, part in parts.items():
        # Outcomes keep every row: a rollout's own verdict (first) and a given one may share a key, and
        # which lands depends on whether the rollout is new, which only the writer knows; a repeated
        # key fails the gates' uniqueness check and sends the batch to the writer's full path.
        if name not in ("tasks", "outcomes"):
            parts[name] = take(part, first_of_each_key(TABLES[name], part))
    return parts, derived, task_rows


def _split_scores(scores: list[StepScore] | None, refused: Mapping[str, Any]):
    if scores is None:
        return None, []
    return [s for s in scores if s.rollout_id not in refused], [s for s in scores if s.rollout_id in refused]


def _refuse(refused: dict[str, list[dict[str, Any]]], refusals: list[dict[str, Any]], rollouts: list[Rollout],
            scores: list[StepScore], failures: dict[str, dict], run_id: str | None, flow_run_id: str | None) -> None:
    """The refused rollouts' rows as `Table.row` makes them (the quarantine keeps them whole)."""
    family = {r.rollout_id: r.family for r in rollouts}
    refused["rollouts"] = [TABLES["rollouts"].row(r, run_id=run_id, flow_run_id=flow_run_id) for r in rollouts]
    refused["steps"] = [TABLES["steps"].row(s, rollout_id=r.rollout_id, task_family=r.family)
                        for r in rollouts for s in r.steps]
    refused["sub_rollouts"] = [TABLES["sub_rollouts"].row(sub) for r in rollouts for sub in r.subrollouts]
    refused["step_scores"] = [TABLES["step_scores"].row(s, task_family=family[s.rollout_id]) for s in scores]
    refusals += list(failures.values())


def _step_owners(rollouts: list[Rollout]) -> dict[str, Any]:
    """The steps' `rollout_id` and `task_family` columns: each rollout's once, repeated over its steps
    by Arrow (as lists where a rollout holds a value of another type: the rows say what is wrong)."""
    try:
        owner = pa.array(np.repeat(np.arange(len(rollouts), dtype=np.int64), [len(r.steps) for r in rollouts]))
        return {"rollout_id": pa.array([r.rollout_id for r in rollouts], pa.string()).take(owner),
                "task_family": pa.array([r.family for r in rollouts], pa.string()).take(owner)}
    except CONVERSION_ERRORS:
        return {"rollout_id": [r.rollout_id for r in rollouts for _ in r.steps],
                "task_family": [r.family for r in rollouts for _ in r.steps]}


def _task_verdicts(parts: dict[str, Part], identity: dict[str, list[str]], task_rows) -> bool:
    """Check every task's id against its content (the record's own rule, from the records: cheaper
    than rebuilding each record from its row) into `identity`, aligned with `parts["tasks"]`. A
    tampered copy is gated (and refused), never dropped as a repeat of its key: where there is
    one, `parts["tasks"]` gains it, and this returns True (the gates fail on it)."""
    if task_rows is None:
        return False
    tasks, part, keep = task_rows
    verdicts = quality.record_verdicts(TABLES["tasks"], tasks)
    tampered = {i for i, verdict in enumerate(verdicts) if verdict != quality.FOUND}
    if tampered:
        keep = sorted(set(keep) | tampered)
        parts["tasks"] = take(part, keep)
    identity["tasks"] = [verdicts[i] for i in keep]
    return bool(tampered)


def _gate_and_write(data_dir: Path, parts: dict[str, Part], derived: list[tuple], gate: bool,
                    task_rows=None) -> Staged:
    identity: dict[str, list[str]] = {}
    staged = Staged(str(data_dir), uuid.uuid4().hex, parts, gate, False, tables=list(parts), identity=identity,
                    derived_outcomes=derived)
    if not all(isinstance(part, pa.Table) for part in parts.values()):
        if gate:
            _task_verdicts(parts, identity, task_rows)
        return staged  # rows that do not fit their columns: the writer's full path says why
    tables = {TABLES[name]: part for name, part in parts.items() if len(part)}
    try:
        return _write_while_gating(staged, parts, tables, gate, identity, task_rows)
    except BaseException:
        staged.discard()  # a check that raised (or an interrupt): nothing it wrote stays in incoming/
        raise


def _write_while_gating(staged: Staged, parts: dict[str, Part], tables: dict[Table, pa.Table], gate: bool,
                        identity: dict[str, list[str]], task_rows) -> Staged:
    with ThreadPoolExecutor(1) as background:
        # The files are invisible until registered: write them while the content ids are checked and
        # the gates run (Parquet encoding and hashing release the GIL), and remove them if the gates
        # fail. A tampered task (which the files may lack: a repeat of its key) always fails them.
        written: Future = background.submit(write_batches, staged.folder, tables)
        if gate:
            tampered = _task_verdicts(parts, identity, task_rows)
            unresolved: list[tuple[Reference, list[tuple]]] = []

            def elsewhere(ref: Reference, keys: list[tuple]) -> set[tuple]:
                unresolved.append((ref, keys))  # the writer checks these against the landed rows
                return set(keys)

            frames = {name: frame(TABLES[name], part) for name, part in parts.items()}
            report = quality.validate_batch(frames, elsewhere, identity)
            staged.unresolved = unresolved
            if not report.success or tampered:
                written.exception()  # wait for the writes, then remove them
                staged.discard()
                return staged
        staged.batches = written.result()
    staged.keys = {name: part.select(list(TABLES[name].key)) for name, part in parts.items() if len(part)}
    staged.passed = True
    return staged


def arrow_part(table: Table, records: list[Record], **added: Any) -> Part:
    """The records as the table's rows, a column at a time; where a record holds a value of another
    type than its field's (`model_copy` does not validate), the rows one by one, as the gates see them."""
    try:
        return table.arrow(records, **added)
    except CONVERSION_ERRORS:
        added = {k: v.to_pylist() if isinstance(v, (pa.Array, pa.ChunkedArray)) else v for k, v in added.items()}
        return [table.row(r, **{k: v[i] if isinstance(v, list) else v for k, v in added.items()})
                for i, r in enumerate(records)]


def rows_part(table: Table, rows: list[dict[str, Any]]) -> Part:
    try:
        for column in table.columns:
            check_lists(column, [row.get(column.name) for row in rows])
        return pa.Table.from_pylist(rows, schema=table.schema)
    except CONVERSION_ERRORS:
        return rows


def first_of_each_key(table: Table, part: Part) -> list[int]:
    """Where the rows are whose key no earlier row of `part` holds (ascending)."""
    if isinstance(part, pa.Table):
        if part.num_rows == 0:
            return []
        keys = pl.from_arrow(part.select(list(table.key)))
        if not isinstance(keys, pl.DataFrame):
            keys = keys.to_frame()
        if not keys.is_duplicated().any():  # the common case, cheaper to find than the first of each
            return list(range(part.num_rows))
        return keys.with_row_index("_row").unique(subset=list(table.key), keep="first",
                                                  maintain_order=True)["_row"].to_list()
    return list(range(len(part)))  # rows that fit no columns: the writer's full path keeps the first of each key


def keys_of(table: Table, rows: list[dict[str, Any]]) -> list[tuple]:
    return [tuple(row.get(k) for k in table.key) for row in rows]


def column_values(part: Part, column: str) -> list[Any]:
    return part[column].to_pylist() if isinstance(part, pa.Table) else [row.get(column) for row in part]


def take(part: Part, indices: list[int]) -> Part:
    if len(indices) == len(part):
        return part  # indices are ascending and distinct: all of it
    if isinstance(part, pa.Table):
        return part.take(pa.array(indices, pa.int64()))
    return [part[i] for i in indices]


def as_rows(part: Part) -> list[dict[str, Any]]:
    return part.to_pylist() if isinstance(part, pa.Table) else part


def frame(table: Table, part: Part) -> pd.DataFrame:
    """What the gates validate (great-expectations takes pandas). pandas holds a float's NaN and a
    null alike, so a float column holding NaN or an infinity (which no record may: `allow_inf_nan`
    is off) gets a `finite:<column>` helper column saying which rows (see quality.validate_table)."""
    if isinstance(part, pa.Table):
        # A list column reaches the gates as its length (null where the list is: not-null is the only
        # rule on a list, see quality.validate_table), counted here in Arrow.
        finite = {}
        for i, name in enumerate(part.column_names):
            kind = part.schema.field(i).type
            if pa.types.is_list(kind):
                part = part.set_column(i, name, pc.list_value_length(part[name]))
            elif pa.types.is_floating(kind) and pc.any(pc.invert(pc.is_finite(part[name]))).as_py():
                finite[name] = [quality.finite_verdict(v) for v in part[name].to_pylist()]
        out = part.to_pandas()
    else:
        out = pd.DataFrame(part, columns=[c.name for c in table.columns])
        finite = {}
        for column in table.columns:
            values = [row.get(column.name) for row in part]
            if pa.types.is_floating(column.type) and any(quality.finite_verdict(v) != quality.FOUND for v in values):
                finite[column.name] = [quality.finite_verdict(v) for v in values]
    for name, verdicts in finite.items():
        out[f"{quality.FINITE}{name}"] = verdicts
    return out


def to_arrow(table: Table, part: Part) -> pa.Table:
    """The rows to write; row dicts that do not fit the columns raise here, as they always did."""
    return part if isinstance(part, pa.Table) else pa.Table.from_pylist(part, schema=table.schema)
