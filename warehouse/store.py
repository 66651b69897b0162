"""`Warehouse`: land records into the lake and read them back through the catalog.

DuckDB allows one writing process per database file: exactly one process opens a data dir's
catalog for writing (the factory flow, or whoever lands results) and workers hand their
records to it. A writer excludes every other process, readers included; any number of
`read_only=True` readers may share the catalog while no writer holds it. So open for writing
only around landing, and read with `read_only=True` (a CLI query needs no write lock).
"""

from __future__ import annotations

import os
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import duckdb
import polars as pl
import pyarrow as pa

from envs.records import Record, Rollout, Step, StepScore, TaskRejection, TaskSpec
from warehouse import catalog
from warehouse.lake import check_family, write_batch
from warehouse.schema import from_row, to_row
from warehouse.tables import PARTITION, TABLES, Table

DEFAULT_DATA_DIR = ".gymfoundry"
CATALOG_FILE = "catalog.duckdb"


class Warehouse:
    """The catalog of one data dir. Usage::

        with Warehouse(".gymfoundry") as wh:
            wh.land_rollouts(rollouts)          # {"rollouts": 2, "steps": 14}
        with Warehouse(".gymfoundry", read_only=True) as wh:
            wh.sql("select task_family, avg(success::int) from rollouts group by all")
            wh.load_rollouts("task_family = ?", ["inventory"])
    """

    def __init__(self, data_dir: str | os.PathLike = DEFAULT_DATA_DIR, read_only: bool = False):
        self.data_dir = Path(data_dir).resolve()
        self.read_only = read_only
        path = self.data_dir / CATALOG_FILE
        if read_only:
            if not path.exists():
                raise FileNotFoundError(f"no warehouse catalog at {path}")
            self.con = duckdb.connect(str(path), read_only=True)
            # The stored views may name the old location of a moved data dir; temp views shadow them.
            catalog.rebuild_views(self.con, self.data_dir, temporary=True)
        else:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.con = duckdb.connect(str(path))
            self.con.execute("BEGIN TRANSACTION")
            self.con.execute(catalog.MANIFEST_DDL)
            catalog.rebuild_views(self.con, self.data_dir)
            self.con.execute("COMMIT")

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # Landing -------------------------------------------------------------------------------

    def land_tasks(self, tasks: Iterable[TaskSpec]) -> dict[str, int]:
        return self._land("tasks", [_row(TABLES["tasks"], t) for t in tasks])

    def land_rollouts(self, rollouts: Iterable[Rollout]) -> dict[str, int]:
        """Land rollouts with their steps. A rollout already landed is skipped with all its steps,
        even if this run of it took different steps."""
        by_id: dict[str, Rollout] = {}
        for rollout in rollouts:
            by_id.setdefault(rollout.rollout_id, rollout)
        rows = self._new_rows(TABLES["rollouts"], [_row(TABLES["rollouts"], r) for r in by_id.values()])
        steps = [_row(TABLES["steps"], step, rollout_id=row["rollout_id"], task_family=row[PARTITION])
                 for row in rows for step in by_id[row["rollout_id"]].steps]
        return self._land("rollouts", rows, steps=steps)

    def land_scores(self, scores: Iterable[StepScore],
                    family_of: Mapping[str, str] | None = None) -> dict[str, int]:
        """Land step scores. A score's family is that of its rollout: from `family_of`
        (rollout_id -> family) where given, else from the rollouts already landed."""
        scores = list(scores)
        families = dict(family_of or {})
        missing = sorted({s.rollout_id for s in scores} - families.keys())
        if missing:
            found = self.con.execute("SELECT rollout_id, task_family FROM rollouts WHERE rollout_id IN "
                                     "(SELECT unnest(?))", [missing]).fetchall()
            families.update(dict(found))
        unknown = sorted({s.rollout_id for s in scores} - families.keys())
        if unknown:
            raise ValueError(f"no task family known for rollouts {unknown}; land them first or pass family_of")
        table = TABLES["step_scores"]
        return self._land("step_scores", [_row(table, s, task_family=families[s.rollout_id]) for s in scores])

    def land_rejections(self, rejections: Iterable[TaskRejection]) -> dict[str, int]:
        return self._land("task_rejections", [_row(TABLES["task_rejections"], r) for r in rejections])

    def _land(self, name: str, rows: list[dict[str, Any]], **more: list[dict[str, Any]]) -> dict[str, int]:
        """Write the rows whose keys are new, one file per table and family, then register every
        file of the call in one transaction. `more` holds rows for further tables (steps)."""
        if self.read_only:
            raise PermissionError("this warehouse was opened read-only")
        new_rows = {table: self._new_rows(TABLES[table], table_rows)
                    for table, table_rows in {name: rows, **more}.items()}
        for row in (row for table_rows in new_rows.values() for row in table_rows):
            check_family(row[PARTITION])  # before any file is written
        batches = []
        for table, table_rows in new_rows.items():
            by_family: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for row in table_rows:
                by_family[row[PARTITION]].append(row)
            batches += [write_batch(self.data_dir, TABLES[table], family, family_rows)
                        for family, family_rows in sorted(by_family.items())]
        catalog.register(self.con, self.data_dir, batches, datetime.now(timezone.utc).replace(tzinfo=None))
        return {table: len(table_rows) for table, table_rows in new_rows.items()}

    def _new_rows(self, table: Table, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Rows whose key is neither registered already nor repeated earlier in `rows`."""
        unique: dict[tuple, dict[str, Any]] = {}
        for row in rows:
            unique.setdefault(tuple(row[k] for k in table.key), row)
        if not unique:
            return []
        key_columns = {c.name: c for c in table.columns if c.name in table.key}
        incoming = pa.table({k: pa.array([key[i] for key in unique], key_columns[k].type)
                             for i, k in enumerate(table.key)})
        keys = ", ".join(catalog.quote_ident(k) for k in table.key)
        self.con.register("incoming_keys", incoming)
        try:
            existing = self.con.execute(f"SELECT {keys} FROM incoming_keys SEMI JOIN {table.name} "
                                        f"USING ({keys})").fetchall()
        finally:
            self.con.unregister("incoming_keys")
        for key in existing:
            unique.pop(tuple(key))
        return list(unique.values())

    # Reading -------------------------------------------------------------------------------

    def sql(self, query: str, params: Sequence[Any] | None = None) -> pa.Table:
        result = self.con.sql(query, params=params)
        return result.to_arrow_table() if result is not None else pa.table({})

    def sql_df(self, query: str, params: Sequence[Any] | None = None) -> pl.DataFrame:
        return pl.from_arrow(self.sql(query, params))

    def load_tasks(self, where: str | None = None, params: Sequence[Any] | None = None) -> list[TaskSpec]:
        return [_record(TABLES["tasks"], row) for row in self._select("tasks", where, params)]

    def load_rollouts(self, where: str | None = None, params: Sequence[Any] | None = None) -> list[Rollout]:
        """Full rollouts, steps included and in order. `where` filters the rollouts view."""
        steps: dict[str, list[Step]] = defaultdict(list)
        subquery = "SELECT rollout_id FROM rollouts" + (f" WHERE {where}" if where else "")
        for row in self._select("steps", f"rollout_id IN ({subquery})", params):
            steps[row["rollout_id"]].append(_record(TABLES["steps"], row))
        return [_record(TABLES["rollouts"], row, steps=steps[row["rollout_id"]])
                for row in self._select("rollouts", where, params)]

    def load_scores(self, where: str | None = None, params: Sequence[Any] | None = None) -> list[StepScore]:
        return [_record(TABLES["step_scores"], row) for row in self._select("step_scores", where, params)]

    def load_rejections(self, where: str | None = None,
                        params: Sequence[Any] | None = None) -> list[TaskRejection]:
        return [_record(TABLES["task_rejections"], row) for row in self._select("task_rejections", where, params)]

    def files(self, table: str) -> list[Path]:
        """The registered files of a table (absolute paths)."""
        return catalog.registered_files(self.con, self.data_dir, table)

    def count(self, table: str) -> int:
        return self.con.execute(f"SELECT count(*) FROM {TABLES[table].name}").fetchall()[0][0]

    def _select(self, name: str, where: str | None, params: Sequence[Any] | None) -> list[dict[str, Any]]:
        table = TABLES[name]
        columns = ", ".join(catalog.quote_ident(c.name) for c in table.columns)
        order = ", ".join(catalog.quote_ident(k) for k in table.key)
        query = f"SELECT {columns} FROM {name}" + (f" WHERE {where}" if where else "") + f" ORDER BY {order}"
        return self.sql(query, params).to_pylist()


def _row(table: Table, record: Record, **added: Any) -> dict[str, Any]:
    row = to_row(record, table.exclude)
    if table.family_field:
        row[PARTITION] = row.pop(table.family_field)
    row.update(added)
    return row


def _record(table: Table, row: dict[str, Any], **fields: Any) -> Record:
    if table.family_field:
        row = {**row, table.family_field: row[PARTITION]}
    return from_row(table.model, row, table.exclude, **fields)
