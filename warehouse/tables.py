"""The logical tables: which record each holds, its key, and the few columns added to it.

Large tables are partitioned by `task_family`: where the record has a `family` field, that
field becomes the partition column; otherwise `task_family` is added from outside the record.
Small tables that span families (`runs`, `datasets`) are not partitioned.

Timestamps are ISO 8601 strings in the records and TIMESTAMP columns (UTC) in the warehouse; a
table names its timestamp fields in `timestamps`. `lineage` columns (nullable) follow the record's:
what the warehouse knows about a row that the record does not say, such as the run that landed it.

Besides what the records say about their own fields (types, nullability, value sets, bounds),
a table declares what the quality gates check across rows and tables: value `bounds` the
record does not state, and `references` to the rows of other tables (see warehouse.quality).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Sequence

import pyarrow as pa

from gymfoundry.envs.records import (DatasetManifest, DatasetRow, FamilyAudit, HoldoutLock, Record, Rollout, Run, Step, StepScore,
                          TaskRejection, TaskSpec, TrainingRun, Verdict)
from gymfoundry.warehouse.schema import Column, arrow_schema, from_row, model_columns, to_arrays, to_row

PARTITION = "task_family"
REWARD_RANGE = (-1.0, 1.0)
TIMESTAMP = pa.timestamp("us")  # UTC, without a zone: what DuckDB's TIMESTAMP is


def to_timestamp(text: str | None, where: str = "timestamp") -> datetime | None:
    """An ISO 8601 string as a UTC datetime without zone (naive text is UTC already); "" is NULL."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise ValueError(f"{where} is no ISO 8601 timestamp: {text!r}") from None
    return value.astimezone(timezone.utc).replace(tzinfo=None) if value.tzinfo else value


def from_timestamp(value: datetime | str | None) -> str:
    """A stored timestamp as the records write it (`2026-05-01T12:00:00+00:00`); NULL is ""."""
    if value is None or isinstance(value, str):
        return value or ""
    return value.replace(tzinfo=timezone.utc).isoformat(timespec="microseconds" if value.microsecond else "seconds")


@dataclass(frozen=True)
class Reference:
    """Every row's `columns` name a row of `table` (its key columns, in order)."""

    columns: tuple[str, ...]
    table: str


@dataclass(frozen=True)
class Table:
    name: str
    model: type[Record]
    key: tuple[str, ...]
    added: tuple[Column, ...] = ()          # key columns the record itself does not carry
    exclude: frozenset[str] = frozenset()   # record fields stored in another table
    family_field: str | None = "family"     # record field that becomes the partition column
    derived: tuple[str, ...] = ()            # SQL expressions the view adds for analysis
    partitioned: bool = True
    bounds: tuple[tuple[str, float | None, float | None], ...] = ()  # (column, min, max), inclusive
    references: tuple[Reference, ...] = ()
    content_id: str | None = None  # key the record computes from its content: re-checked per row
    timestamps: tuple[str, ...] = ()        # str fields of the record holding ISO 8601 times
    lineage: tuple[Column, ...] = ()        # nullable columns after the record's, not part of it

    def row(self, record: Record, **added: Any) -> dict[str, Any]:
        """The record as a row of this table; `added` fills the added and lineage columns."""
        row = to_row(record, self.exclude)
        if self.family_field:
            row[PARTITION] = row.pop(self.family_field)
        for name in self.timestamps:
            row[name] = to_timestamp(row[name], f"{self.name}.{name}")
        for column in self.lineage:
            row[column.name] = None
        row.update(added)
        return row

    def arrow(self, records: Sequence[Record], **added: Any) -> pa.Table:
        """The records as rows of this table (what `row` makes of each), built a column at a time.
        `added` fills the added and lineage columns: one value for every row, or one per row (a
        list or an Arrow array); a lineage column not given is NULL."""
        arrays = to_arrays(self.model, records, self.exclude)
        if self.family_field:
            arrays[PARTITION] = arrays.pop(self.family_field)
        for name in self.timestamps:
            arrays[name] = pa.array([to_timestamp(v, f"{self.name}.{name}") for v in arrays[name].to_pylist()],
                                    TIMESTAMP)
        unknown = set(added) - {c.name for c in self.columns}
        if unknown:
            raise KeyError(f"{self.name} has no columns {sorted(unknown)}")
        n = len(records)
        for column in (*self.added, *self.lineage):
            value = added.get(column.name)
            if isinstance(value, (pa.Array, pa.ChunkedArray)):
                arrays[column.name] = value
            else:
                arrays[column.name] = pa.array(value if isinstance(value, list) else [value] * n, column.type)
        return pa.Table.from_arrays([arrays[c.name] for c in self.columns], schema=self.schema)

    def record(self, row: dict[str, Any], **fields: Any) -> Record:
        """The record a row holds (pydantic's ValidationError, a ValueError, where it holds none)."""
        if self.family_field:
            row = {**row, self.family_field: row[PARTITION]}
        if self.timestamps:
            row = {**row, **{name: from_timestamp(row.get(name)) for name in self.timestamps}}
        return from_row(self.model, row, self.exclude, **fields)

    @property
    def columns(self) -> list[Column]:
        """The logical columns, `task_family` included, in view order."""
        columns = list(self.added)
        for column in model_columns(self.model, self.exclude):
            if column.name == self.family_field:
                column = Column(PARTITION, pa.string())
            elif column.name in self.timestamps:
                column = Column(column.name, TIMESTAMP, nullable=True)
            columns.append(column)
        return columns + list(self.lineage)

    @property
    def schema(self) -> pa.Schema:
        """The logical columns' Arrow schema (`task_family` included)."""
        return arrow_schema(self.columns)

    @property
    def file_columns(self) -> list[Column]:
        """What a Parquet file holds: the partition column lives in the directory name."""
        return [c for c in self.columns if c.name != PARTITION]

    @property
    def file_schema(self) -> pa.Schema:
        return arrow_schema(self.file_columns)


TABLES: dict[str, Table] = {t.name: t for t in [
    Table("tasks", TaskSpec, key=("task_id",), content_id="task_id",
          derived=("CAST(json_extract(difficulty, '$.level') AS BIGINT) AS difficulty_level",)),
    Table("rollouts", Rollout, key=("rollout_id",), exclude=frozenset({"steps", "subrollouts"}),
          # The run that first landed the rollout (a factory `Run.run_id`) and its Prefect flow run.
          lineage=(Column("run_id", pa.string(), nullable=True), Column("flow_run_id", pa.string(), nullable=True)),
          derived=("termination = 'success' AS success",
                   "json_extract_string(outcome, '$.verifier_id') AS verifier_id",
                   "json_extract_string(outcome, '$.verifier_version') AS verifier_version",
                   "CAST(json_extract(cost, '$.tokens') AS BIGINT) AS tokens"),
          references=(Reference(("task_id",), "tasks"),)),
    Table("steps", Step, key=("rollout_id", "index"), family_field=None,
          added=(Column("rollout_id", pa.string()), Column(PARTITION, pa.string())),
          derived=("json_extract_string(tool_call, '$.name') AS tool_name",),
          bounds=(("reward", *REWARD_RANGE), ("latency_s", 0.0, None)),
          references=(Reference(("rollout_id",), "rollouts"),)),
    Table("step_scores", StepScore, key=("rollout_id", "step_index", "layer", "scorer_id", "scorer_version"),
          family_field=None, added=(Column(PARTITION, pa.string()),),
          bounds=(("score", *REWARD_RANGE),),
          references=(Reference(("rollout_id", "step_index"), "steps"),)),
    Table("task_rejections", TaskRejection, key=("task_id", "stage")),
    Table("runs", Run, key=("run_id",), family_field=None, partitioned=False,
          timestamps=("started_at", "finished_at")),
    Table("holdout_locks", HoldoutLock, key=("family", "holdout_fraction"), family_field=None, partitioned=False),
    Table("datasets", DatasetManifest, key=("dataset_id",), family_field=None, partitioned=False,
          timestamps=("created_at",)),
    Table("dataset_rows", DatasetRow, key=("dataset_id", "row_id"),
          references=(Reference(("dataset_id",), "datasets"), Reference(("task_id",), "tasks"))),
    Table("training_runs", TrainingRun, key=("run_id",), family_field=None, partitioned=False,
          timestamps=("started_at", "finished_at")),
    # Every verifier version's verdict on a rollout, side by side: the factory's own and re-verifications.
    Table("outcomes", Verdict, key=("rollout_id", "verifier_id", "verifier_version"),
          derived=("termination = 'success' AS success",), timestamps=("verified_at",),
          references=(Reference(("rollout_id",), "rollouts"),)),
    # Gameability audits (tasks/stages/audit.py): per family version, adversary and level, next to the oracle.
    # The same audit (its id is its content) run again lands again, at its own time: the newest decides.
    Table("family_audits", FamilyAudit, key=("audit_id", "adversary", "level", "audited_at"),
          timestamps=("audited_at",)),
    # Sub-agents' episodes of a delegating rollout (their family's partition), steps inline: frozen
    # policies' work, kept apart from the rollouts that curricula, success rates and datasets read.
    Table("sub_rollouts", Rollout, key=("rollout_id",), exclude=frozenset({"subrollouts"}),
          derived=("termination = 'success' AS success",),
          references=(Reference(("parent_rollout_id",), "rollouts"),)),
]}
