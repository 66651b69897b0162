"""The logical tables: which record each holds, its key, and the few columns added to it.

Large tables are partitioned by `task_family`: where the record has a `family` field, that
field becomes the partition column; otherwise `task_family` is added from outside the record.
Small tables that span families (`runs`, `datasets`) are not partitioned.

Besides what the records say about their own fields (types, nullability, value sets, bounds),
a table declares what the quality gates check across rows and tables: value `bounds` the
record does not state, and `references` to the rows of other tables (see warehouse.quality).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from envs.records import (DatasetManifest, DatasetRow, HoldoutLock, Record, Rollout, Run, Step, StepScore,
                          TaskRejection, TaskSpec, TrainingRun, Verdict)
from warehouse.schema import Column, arrow_schema, from_row, model_columns

PARTITION = "task_family"
REWARD_RANGE = (-1.0, 1.0)


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

    def record(self, row: dict[str, Any], **fields: Any) -> Record:
        """The record a row holds (pydantic's ValidationError, a ValueError, where it holds none)."""
        if self.family_field:
            row = {**row, self.family_field: row[PARTITION]}
        return from_row(self.model, row, self.exclude, **fields)

    @property
    def columns(self) -> list[Column]:
        """The logical columns, `task_family` included, in view order."""
        columns = list(self.added)
        for column in model_columns(self.model, self.exclude):
            columns.append(Column(PARTITION, pa.string()) if column.name == self.family_field else column)
        return columns

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
    Table("rollouts", Rollout, key=("rollout_id",), exclude=frozenset({"steps"}),
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
    Table("runs", Run, key=("run_id",), family_field=None, partitioned=False),
    Table("holdout_locks", HoldoutLock, key=("family", "holdout_fraction"), family_field=None, partitioned=False),
    Table("datasets", DatasetManifest, key=("dataset_id",), family_field=None, partitioned=False),
    Table("dataset_rows", DatasetRow, key=("dataset_id", "row_id"),
          references=(Reference(("dataset_id",), "datasets"), Reference(("task_id",), "tasks"))),
    Table("training_runs", TrainingRun, key=("run_id",), family_field=None, partitioned=False),
    # Every verifier version's verdict on a rollout, side by side: the factory's own and re-verifications.
    Table("outcomes", Verdict, key=("rollout_id", "verifier_id", "verifier_version"),
          derived=("termination = 'success' AS success",),
          references=(Reference(("rollout_id",), "rollouts"),)),
]}
