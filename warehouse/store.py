"""`Warehouse`: land records into the lake and read them back through the catalog.

DuckDB allows one writing process per database file: exactly one process opens a data dir's
catalog for writing (the factory flow, or whoever lands results). Workers either hand it their
records (`land`) or stage them themselves (`gymfoundry.warehouse.stage`: rows, gates and Parquet files) and
hand it the `Staged` batch, which it only checks against the catalog and registers (`land_staged`).
A writer excludes every other process, readers included; any number of
`read_only=True` readers may share the catalog while no writer holds it. So open for writing
only around landing, and read with `read_only=True` (a CLI query needs no write lock). A writer
that meets a held lock logs who holds it and retries with backoff for `lock_timeout_s` (default
`lock_wait_s()`, the same for every writer), then raises `CatalogLocked` (`gymfoundry.tasks.stages.land` then
spools the batch, see `gymfoundry.warehouse.spool`).
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from gymfoundry.envs.records import (DatasetManifest, DatasetRow, HoldoutLock, Record, Rollout, Run, Step, StepScore,
                          TaskRejection, TaskSpec, Verdict, content_hash)
from gymfoundry.warehouse import catalog, damage, quality, statements
from gymfoundry.warehouse.lake import LAKE_DIR, file_sha256, staging_path, write_batches
from gymfoundry.warehouse.staged import (OWNED_BY_ROLLOUT, STAGING_ERRORS, Part, Staged, as_rows, column_values, frame, keys_of,
                             rows_part, stage, take, to_arrow, unstageable)
from gymfoundry.warehouse.tables import PARTITION, TABLES, Reference, Table

CATALOG_FILE = "catalog.duckdb"
QUARANTINE_DIR = "quarantine"
log = logging.getLogger("gymfoundry.warehouse")


_PAUSES = threading.Lock()
_paused = {"landings": 0, "was_enabled": True}  # landings in progress that paused the collector


def _collector_paused(land):
    """Run `land` with Python's cyclic garbage collector paused. A landing allocates millions of small
    containers while the batch's records (as many again) are alive; each full collection scans all of
    them, and collections took a third of a landing's time. The landing creates no cycles worth
    collecting; the collector runs again, as it was, once the last landing in progress returns."""
    @functools.wraps(land)
    def paused(*args, **kwargs):
        with _PAUSES:
            if _paused["landings"] == 0:
                _paused["was_enabled"] = gc.isenabled()
            _paused["landings"] += 1
            gc.disable()
        try:
            return land(*args, **kwargs)
        finally:
            with _PAUSES:
                _paused["landings"] -= 1
                if _paused["landings"] == 0 and _paused["was_enabled"]:
                    gc.enable()

    return paused


class Warehouse:
    """The catalog of one data dir, which its caller names (the CLI's and the flows' default,
    `.gymfoundry`, is `gymfoundry.flows.defaults.DEFAULT_DATA_DIR`). Usage::

        with Warehouse(".gymfoundry") as wh:
            landing = wh.land(tasks=tasks, rollouts=rollouts, scores=scores)   # one gated transaction
            landing.counts                      # {"tasks": 1, "rollouts": 2, "steps": 14, ...}
            wh.land_rollouts(rollouts)          # one table; raises QuarantinedBatch if the gates fail
        with Warehouse(".gymfoundry", read_only=True) as wh:
            wh.sql("select task_family, avg(success::int) from rollouts group by all")
            wh.load_rollouts("task_family = ?", ["inventory"])
    """

    def __init__(self, data_dir: str | os.PathLike, read_only: bool = False,
                 lock_timeout_s: float | None = None):
        self.data_dir = Path(data_dir).resolve()
        self.read_only = read_only
        lock_timeout_s = lock_wait_s() if lock_timeout_s is None else lock_timeout_s
        path = self.data_dir / CATALOG_FILE
        if read_only:
            if not path.exists():
                raise FileNotFoundError(f"no warehouse catalog at {path}")
            self.con = _connect(path, True, lock_timeout_s)
            # The stored views name the lake relative to the working directory; these name this dir's.
            catalog.rebuild_views(self.con, self.data_dir, temporary=True)
            confine(self.con, self.data_dir)
        else:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            backup = catalog.downgrade(path, lambda: _connect(path, False, lock_timeout_s))
            if backup is not None:
                log.warning("warehouse %s: the catalog was in a storage version the DuckDB CLI cannot read; "
                            "copied it into storage version %s (the old file is kept as %s)",
                            self.data_dir, catalog.STORAGE_VERSION, backup.name)
            self.con = _connect(path, False, lock_timeout_s)
            catalog.bind(self.con, self.data_dir)
            self.con.execute("BEGIN TRANSACTION")
            self.con.execute(catalog.MANIFEST_DDL)
            self.con.execute(catalog.QUARANTINE_DDL)
            notes = catalog.migrate_manifest(self.con, self.data_dir)
            notes += catalog.recover_staging(self.con, self.data_dir)
            catalog.rebuild_views(self.con, self.data_dir)
            self.con.execute("COMMIT")
            catalog.rebuild_views(self.con, self.data_dir, temporary=True)
            for note in notes:
                log.warning("warehouse %s: %s", self.data_dir, note)
        self.skipped: list[dict[str, Any]] = []  # rows a `load_*` could not read back (see `_records`)

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # Landing -------------------------------------------------------------------------------

    @_collector_paused
    def land(self, *, tasks: Iterable[TaskSpec] | None = None, rejections: Iterable[TaskRejection] | None = None,
             rollouts: Iterable[Rollout] | None = None, scores: Iterable[StepScore] | None = None,
             runs: Iterable[Run] | None = None, datasets: Iterable[DatasetManifest] | None = None,
             dataset_rows: Iterable[DatasetRow] | None = None, family_of: Mapping[str, str] | None = None,
             outcomes: Iterable[Verdict] | None = None, rollout_outcomes: bool = False,
             holdout_locks: Iterable[HoldoutLock] | None = None, gate: bool = True,
             run_id: str | None = None, flow_run_id: str | None = None) -> Landing:
        """Land one batch: every table given, in one transaction, after the quality gates
        (`stage` here, then `land_staged`).

        Only rows with new keys land (a rollout already landed is skipped with all its steps).
        A score's family is that of its rollout: from `family_of` (rollout_id -> family), the
        rollouts of this batch, or the rollouts already landed. A batch that fails a gate goes
        to quarantine whole (`Landing.quarantine`) and nothing of it reaches the tables.

        `outcomes` are verdicts to land in `outcomes`; with `rollout_outcomes`, each rollout new in
        this batch also lands its own outcome there as the factory's verdict (`Verdict.of_rollout`).
        `run_id` and `flow_run_id` (the factory run and its Prefect flow run) are written on the
        rollouts new in this batch: a rollout landed before keeps the run that first landed it."""
        if self.read_only:
            raise PermissionError("this warehouse was opened read-only")
        if scores is not None:
            scores = list(scores)
            if rollouts is not None:
                rollouts = list(rollouts)
            family_of = self._families({**{r.rollout_id: r.family for r in rollouts or []}, **(family_of or {})},
                                       {s.rollout_id for s in scores})
        staged = stage(self.data_dir, tasks=tasks, rejections=rejections, rollouts=rollouts, scores=scores, runs=runs,
                       datasets=datasets, dataset_rows=dataset_rows, family_of=family_of, outcomes=outcomes,
                       rollout_outcomes=rollout_outcomes, holdout_locks=holdout_locks, gate=gate, run_id=run_id,
                       flow_run_id=flow_run_id)
        try:
            return self.land_staged(staged)
        finally:
            staged.discard()  # landed, quarantined or failed: the caller holds the records

    @_collector_paused
    def land_staged(self, staged: Staged) -> Landing:
        """Land a batch `gymfoundry.warehouse.stage` made, in this process or another: when every key is new,
        every reference the batch does not satisfy itself names a landed row and the gates passed,
        only register its files (one transaction); otherwise land its rows as `land` would (only
        new rows; a failed gate sends the batch to quarantine). The incoming files are gone after.
        What staging refused goes to quarantine with why: rollouts no column could hold, with their
        steps and scores (`Landing.refused`; the rest lands), or a batch it could not stage at all."""
        if self.read_only:
            raise PermissionError("this warehouse was opened read-only")
        staged.check(self.data_dir)
        refused = self._refuse(staged) if staged.refusals else None
        if not staged.tables:  # an empty batch, or staging refused all of it: nothing else to land
            staged.discard()
            return Landing({}) if refused is None else Landing({}, quarantine=refused.quarantine,
                                                               report=refused.report)
        landing = self._land_staged(staged)
        landing.refused = refused.quarantine if refused else None
        return landing

    def _refuse(self, staged: Staged) -> Landing:
        """Quarantine what staging refused (rollouts no column could hold, or a whole batch), with why."""
        report = quality.QualityReport({f["table"]: quality.TableResult(
            f["table"], len(staged.refused.get(f["table"], [])), False) for f in staged.refusals})
        for failure in staged.refusals:
            report.tables[failure["table"]].failures.append(failure)
        landing = self._quarantine(staged.refused, report)
        log.error("quarantined what could not be stored (%s): %s", report.summary(), landing.quarantine)
        return landing

    def _land_staged(self, staged: Staged) -> Landing:
        if staged.passed and self._all_new(staged) and all(
                self._landed_keys(ref, keys) == set(keys) for ref, keys in staged.unresolved):
            moved = []
            try:
                for batch in staged.batches:
                    target = self.data_dir / staging_path(batch.path)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(staged.incoming(batch), target)
                    moved.append((target, staged.incoming(batch)))
                catalog.register(self.con, self.data_dir, staged.batches, _utcnow(), before_commit=_landing_hook)
            except BaseException:
                # Only what the manifest did not register goes back (to be landed again): after the commit
                # (a full disk while the views are rebuilt) the batch landed, and the error is that one.
                registered = _registered_paths(self.con)
                for (target, source), batch in zip(moved, staged.batches):
                    if batch.path not in registered and target.exists():
                        os.replace(target, source)
                raise
            staged.discard()
            counts = dict.fromkeys(staged.tables, 0)
            for batch in staged.batches:
                counts[batch.table] += batch.row_count
            return Landing(counts)
        in_memory = staged.parts is not None
        parts = self._without_landed_rollouts(staged.rows(), staged.derived_outcomes, in_memory)
        landing = self._land(parts, staged.gate, staged.identity if in_memory else {})
        staged.discard()
        return landing

    def _all_new(self, staged: Staged) -> bool:
        """No key of the batch is landed already."""
        for name, keys in staged.keys.items():
            table = TABLES[name]
            columns = ", ".join(catalog.quote_ident(k) for k in table.key)
            self.con.register("incoming_keys", keys)
            try:
                if self._execute(f"SELECT count(*) FROM incoming_keys SEMI JOIN {table.name} USING ({columns})")[0][0]:
                    return False
            finally:
                self.con.unregister("incoming_keys")
        return True

    def _without_landed_rollouts(self, parts: dict[str, Part], derived: list[tuple],
                                 in_order: bool) -> dict[str, Part]:
        """The batch less what belongs to its rollouts that landed before: their steps, sub-agents'
        episodes and their own verdicts (`derived`: the first rows of `outcomes` when the parts are
        `in_order` as staged, else told apart by key) are skipped with them, whatever this run did."""
        rollouts = parts.get("rollouts")
        if rollouts is None or not len(rollouts):
            return parts
        ids = column_values(rollouts, "rollout_id")
        landed = set(ids) - {ids[i] for i in self._new_indices(TABLES["rollouts"], rollouts)}
        if not landed:
            return parts
        out = dict(parts)
        for name, column in OWNED_BY_ROLLOUT.items():
            if name in parts:
                owners = column_values(parts[name], column)
                out[name] = take(parts[name], [i for i, owner in enumerate(owners) if owner not in landed])
        if "sub_rollouts" in out and not len(out["sub_rollouts"]):
            del out["sub_rollouts"]  # a part only where a new rollout delegated
        if "outcomes" in parts and derived:
            keys = list(zip(*(column_values(parts["outcomes"], k) for k in TABLES["outcomes"].key)))
            if in_order:
                drop = {i for i, key in enumerate(keys[:len(derived)]) if key[0] in landed}
            else:  # read back from files: the gates passed, so every key is once in the batch
                skip = {key for key in derived if key[0] in landed}
                drop = {i for i, key in enumerate(keys) if key in skip}
            out["outcomes"] = take(parts["outcomes"], [i for i in range(len(keys)) if i not in drop])
        return out

    def land_rows(self, rows: Mapping[str, list[dict[str, Any]]], gate: bool = True) -> Landing:
        """Land table rows (as `Table.row` makes them) as one batch; see `land`. Rows that do not hold
        their columns' types still meet the gates, which say what is wrong with them."""
        return self._land({name: rows_part(TABLES[name], list(table_rows)) for name, table_rows in rows.items()},
                          gate, {})

    def _land(self, parts: dict[str, Part], gate: bool, verdicts: dict[str, list[str] | None]) -> Landing:
        """Keep each table's new rows, gate them, write them and register the files in one transaction.
        `verdicts`: identity verdicts (one per row of `parts`) the caller made from the records."""
        if self.read_only:
            raise PermissionError("this warehouse was opened read-only")
        new: dict[str, Part] = {}
        identity: dict[str, list[str]] = {}
        for name, part in parts.items():
            table = TABLES[name]
            keep = self._new_indices(table, part)
            if gate and table.content_id is not None:
                found = verdicts.get(name) or quality.identity_verdicts(table, as_rows(part))
                # A tampered copy of a landed row is refused, not skipped: it joins the rows gated.
                keep = sorted(set(keep) | {i for i, verdict in enumerate(found) if verdict != quality.FOUND})
                identity[name] = [found[i] for i in keep]
            new[name] = take(part, keep)
        tables = {TABLES[name]: part for name, part in new.items() if len(part)}
        with ThreadPoolExecutor(1) as background:
            staged = None
            if gate and all(isinstance(part, pa.Table) for part in tables.values()):
                # Staged files are invisible until registered: write them while the gates run (Parquet
                # encoding and hashing release the GIL), and remove them if the gates fail.
                staged = background.submit(write_batches, self.data_dir, tables)
            try:
                if gate:
                    frames = {name: frame(TABLES[name], part) for name, part in new.items()}
                    report = quality.validate_batch(frames, self._landed_keys, identity)
                    if not report.success:
                        _discard(self.data_dir, staged)
                        return self._quarantine({name: as_rows(part) for name, part in new.items()}, report)
                # Every family is checked before any file is written; the files are written in parallel.
                batches = staged.result() if staged is not None else \
                    write_batches(self.data_dir, {table: to_arrow(table, part) for table, part in tables.items()})
            except STAGING_ERRORS as exc:  # rows holding a value no column can hold (pandas or Arrow said so)
                _discard(self.data_dir, staged)
                rows = {name: as_rows(part) for name, part in new.items()}
                failure = unstageable(exc, sum(map(len, rows.values())))
                return self._quarantine(rows, quality.QualityReport(
                    {"batch": quality.TableResult("batch", failure["unexpected_count"], False, [failure])}))
        catalog.register(self.con, self.data_dir, batches, _utcnow(), before_commit=_landing_hook)
        return Landing({name: len(part) for name, part in new.items()})

    def land_tasks(self, tasks: Iterable[TaskSpec]) -> dict[str, int]:
        return self.land(tasks=tasks).checked()

    def land_rollouts(self, rollouts: Iterable[Rollout]) -> dict[str, int]:
        """Land rollouts with their steps. A rollout already landed is skipped with all its steps,
        even if this run of it took different steps."""
        return self.land(rollouts=rollouts).checked()

    def land_scores(self, scores: Iterable[StepScore],
                    family_of: Mapping[str, str] | None = None) -> dict[str, int]:
        return self.land(scores=scores, family_of=family_of).checked()

    def land_rejections(self, rejections: Iterable[TaskRejection]) -> dict[str, int]:
        return self.land(rejections=rejections).checked()

    def _families(self, known: dict[str, str], rollout_ids: set[str]) -> dict[str, str]:
        """`known` (rollout_id -> family) and the families of the landed rollouts among `rollout_ids`."""
        missing = sorted(rollout_ids - known.keys())
        if missing:
            found = self._execute("SELECT rollout_id, task_family FROM rollouts WHERE rollout_id IN "
                                  "(SELECT unnest(?))", [missing])
            known.update(dict(found))
        return known

    def _new_indices(self, table: Table, part: Part) -> list[int]:
        """Where the rows are whose key is neither registered already nor repeated earlier in `part`."""
        if isinstance(part, pa.Table):
            # One query over the key columns as they are: no key tuples in Python.
            columns = ", ".join(catalog.quote_ident(k) for k in table.key)
            incoming = part.select(list(table.key)).append_column("_row", pa.array(range(part.num_rows), pa.int64()))
            self.con.register("incoming_keys", incoming)
            try:
                with self._damage_explained():
                    found = self.con.execute(
                        f"SELECT _row FROM incoming_keys ANTI JOIN {table.name} USING ({columns}) "
                        f"QUALIFY row_number() OVER (PARTITION BY {columns} ORDER BY _row) = 1 ORDER BY _row")
                    return found.fetchnumpy()["_row"].tolist()
            finally:
                self.con.unregister("incoming_keys")
        first: dict[tuple, int] = {}
        for i, key in enumerate(keys_of(table, part)):
            first.setdefault(key, i)
        for key in self._existing_keys(table, list(first)):
            first.pop(key)
        return list(first.values())  # ascending: the dict keeps the order of first appearance

    def _landed_keys(self, ref: Reference, keys: list[tuple]) -> set[tuple]:
        return self._existing_keys(TABLES[ref.table], keys)

    def _existing_keys(self, table: Table, keys: list[tuple]) -> set[tuple]:
        """Which of `keys` (tuples of the table's key columns) the table holds already."""
        if not keys:
            return set()
        types = {c.name: c.type for c in table.columns}
        try:
            incoming = pa.table({k: pa.array([key[i] for key in keys], types[k]) for i, k in enumerate(table.key)})
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return set()  # keys of the wrong type are new by definition; the gates will say why
        columns = ", ".join(catalog.quote_ident(k) for k in table.key)
        self.con.register("incoming_keys", incoming)
        try:
            return {tuple(k) for k in self._execute(f"SELECT {columns} FROM incoming_keys SEMI JOIN "
                                                    f"{table.name} USING ({columns})")}
        finally:
            self.con.unregister("incoming_keys")

    def _quarantine(self, rows: dict[str, list[dict[str, Any]]], report: quality.QualityReport) -> Landing:
        """Keep a failed batch whole, with its validation report, out of every table."""
        quarantine_id = "q-" + content_hash(rows, 20)
        folder = self.data_dir / QUARANTINE_DIR / quarantine_id
        folder.mkdir(parents=True, exist_ok=True)
        for name, table_rows in rows.items():
            if table_rows:
                text = "".join(json.dumps(row, sort_keys=True, default=str) + "\n" for row in table_rows)
                (folder / f"{name}.jsonl").write_text(text)
        created = _utcnow()
        payload = {"quarantine_id": quarantine_id, "created_at": created.isoformat() + "Z",
                   "rows": {name: len(r) for name, r in rows.items()}, **report.to_json()}
        (folder / "report.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
        self.con.execute("INSERT OR IGNORE INTO quarantine VALUES (?, ?, ?, ?, ?, ?)",
                         [quarantine_id, created, folder.relative_to(self.data_dir).as_posix(),
                          sorted(n for n, r in rows.items() if r), sum(len(r) for r in rows.values()),
                          json.dumps(report.to_json()["failures"], default=str)])
        return Landing({name: 0 for name in rows}, quarantine=folder, report=report)

    # Checking ------------------------------------------------------------------------------

    def check(self) -> quality.QualityReport:
        """Verify every registered file (exists, checksum, row count) and list the files nobody
        registered; then re-validate what is intact with the same suites as the gates, plus
        integrity checks across tables (no holdout task in a dataset, no template group in two
        splits, dataset lineage that names landed rollouts). Dataset files are verified against
        their recorded checksums too. Damage is reported, never raised."""
        problems = damage.inspect(self.con, self.data_dir)
        damaged = [p for p in problems if p.kind in damage.DAMAGE]
        files = len(catalog.entries(self.con)) + len(catalog.dataset_files(self.con))
        results = {"files": quality.TableResult("files", files, not damaged, [damage.failure(p) for p in damaged])}
        # Files still in staging are no damage (the next writer moves them) but no view can read them yet.
        with self._views_without({p.path for p in problems if p.kind in (*damage.DAMAGE, "staged")}):
            for name, table in TABLES.items():
                results[name] = self._check_table(table)
            results["integrity"] = quality.integrity(lambda sql: self.sql(sql).to_pylist()[0]["n"])
        return quality.QualityReport(results, [p.to_json() for p in problems])

    def _check_table(self, table: Table) -> quality.TableResult:
        try:
            columns = ", ".join(catalog.quote_ident(c.name) for c in table.columns)
            data = self.sql(f"SELECT {columns} FROM {table.name}")
            if data.num_rows == 0:
                return quality.TableResult(table.name, 0, True)
            found = {ref: self._found_references(table, ref) for ref in table.references}
            identity = quality.identity_verdicts(table, data.to_pylist()) if table.content_id else None
            return quality.validate_table(table, frame(table, data), found, identity)
        except (duckdb.Error, DamagedWarehouse) as exc:
            return quality.TableResult(table.name, 0, False, [quality.error_failure(table.name, exc)])

    @contextmanager
    def _views_without(self, paths: set[str]) -> Iterator[None]:
        """Temporary views over the registered files but `paths`; afterwards the usual views again."""
        if not paths:
            yield
            return
        for name, table in TABLES.items():
            files = [f for f in catalog.registered_paths(self.con, name) if f not in paths]
            self.con.execute(catalog.view_sql(table, files, True, self.data_dir))
        catalog.create_analysis_views(self.con, temporary=True)
        try:
            yield
        finally:
            catalog.rebuild_views(self.con, self.data_dir, temporary=True)

    def repair(self, rebuild: Callable[[Warehouse, str], str | None] | None = None) -> Repair:
        """Move every landing with a missing or changed file to quarantine, with every landing whose
        rows reference what left, and rebuild the views; remove temp files of killed writers.
        Re-running the runs that landed them lands the same rows again.

        A missing or changed dataset file is rebuilt by `rebuild(warehouse, dataset_id)` (the
        warehouse cannot build datasets itself: `gymfoundry.tasks.stages.assemble.rebuild_dataset` does), which puts
        back a file with the recorded checksum and returns None, or says why it cannot; a dataset
        not rebuilt is quarantined (its file, where there is one, moved away) with that reason.
        A dataset file assembled before checksums were kept gets its checksum recorded."""
        if self.read_only:
            raise PermissionError("this warehouse was opened read-only")
        problems = damage.inspect(self.con, self.data_dir)
        entries: dict[str, list[catalog.Entry]] = defaultdict(list)
        for entry in catalog.entries(self.con):
            entries[entry.landing_id].append(entry)
        created = _utcnow()
        self.con.execute("BEGIN TRANSACTION")
        try:
            landings = damage.landings_to_quarantine(self.con, self.data_dir, problems)
            moves = []
            for landing, failures in landings.items():
                qid = damage.quarantine_id(landing, created.isoformat())
                folder = self.data_dir / QUARANTINE_DIR / qid
                moves.append((folder, entries[landing], failures))
                self.con.execute("INSERT INTO quarantine VALUES (?, ?, ?, ?, ?, ?)",
                                 [qid, created, folder.relative_to(self.data_dir).as_posix(),
                                  sorted({e.table_name for e in entries[landing]}),
                                  sum(e.row_count for e in entries[landing]), json.dumps(failures, default=str)])
            catalog.rebuild_views(self.con, self.data_dir)
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        catalog.rebuild_views(self.con, self.data_dir, temporary=True)
        # After the commit: a crash here leaves unregistered files, which no view reads.
        for folder, landing_entries, failures in moves:
            damage.move_to_quarantine(self.data_dir, folder, landing_entries, failures, created.isoformat() + "Z")
        stale = time.time() - damage.INCOMING_STALE_S
        temp = [p for p in problems if p.kind == "temp"
                or p.kind == "incoming" and (self.data_dir / p.path).stat().st_mtime < stale]
        for p in temp:
            (self.data_dir / p.path).unlink(missing_ok=True)
        # Datasets last: a rebuild reads the tables, which the lake's repair left intact.
        rebuilt, datasets_moved = self._repair_datasets(problems, rebuild)
        moved = {folder: [e.path for e in es] for folder, es, _ in moves}
        failures = {folder.name: f for folder, _, f in moves}
        for folder, path, failure in datasets_moved:
            moved[folder], failures[folder.name] = [path], [failure]
        return Repair(moved, failures, [p.path for p in temp], rebuilt)

    def _repair_datasets(self, problems: list[damage.FileProblem], rebuild: Callable[[Warehouse, str], str | None]
                         | None) -> tuple[list[str], list[tuple[Path, str, dict[str, Any]]]]:
        """Rebuild each damaged dataset file, or quarantine it; record the checksums of dataset files
        from before checksums, trusting them as they are now (as `catalog.migrate_manifest` does)."""
        recorded = {f.dataset_id: f for f in catalog.dataset_files(self.con)}
        rebuilt, moved = [], []
        for p in problems:
            if p.dataset_id is None:
                continue
            if p.kind == "unknown_checksum":
                file = self.data_dir / p.path
                try:
                    rows = pq.read_metadata(file).num_rows
                except (OSError, ValueError):
                    continue  # nothing to trust: `check` keeps reporting it
                catalog.record_dataset_file(self.con, catalog.DatasetFile(
                    p.dataset_id, p.path, rows, file_sha256(file), _utcnow()))
                continue
            if p.kind not in damage.DAMAGE:
                continue
            why = "no rebuilder was given (`gymfoundry.tasks.stages.assemble.rebuild_dataset` rebuilds datasets)"
            if rebuild is not None:
                why = rebuild(self, p.dataset_id)
                if why is None:
                    rebuilt.append(p.dataset_id)
                    continue
            created = _utcnow()
            qid = damage.quarantine_id(p.dataset_id, created.isoformat())
            folder = self.data_dir / QUARANTINE_DIR / qid
            failure = damage.failure(p, f"dataset_{p.kind}")
            failure["error"] += f"; not rebuilt: {why}"
            source = self.data_dir / p.path
            if source.is_file():
                (folder / p.path).parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, folder / p.path)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "report.json").write_text(json.dumps(
                {"created_at": created.isoformat() + "Z", "reason": "damaged dataset file (warehouse repair)",
                 "failures": [failure]}, indent=2, default=str) + "\n")
            relative = folder.relative_to(self.data_dir).as_posix()
            self.con.execute("INSERT INTO quarantine VALUES (?, ?, ?, ?, ?, ?)",
                             [qid, created, relative, ["dataset_files"], recorded[p.dataset_id].row_count,
                              json.dumps([failure], default=str)])
            self.con.execute("UPDATE dataset_files SET quarantine = ? WHERE dataset_id = ?", [relative, p.dataset_id])
            moved.append((folder, p.path, failure))
        return rebuilt, moved

    def _found_references(self, table: Table, ref: Reference) -> set[tuple]:
        parent = TABLES[ref.table]
        on = " AND ".join(f"c.{catalog.quote_ident(c)} = p.{catalog.quote_ident(k)}"
                          for c, k in zip(ref.columns, parent.key))
        columns = ", ".join(f"c.{catalog.quote_ident(c)}" for c in ref.columns)
        query = f"SELECT DISTINCT {columns} FROM {table.name} c SEMI JOIN {parent.name} p ON {on}"
        return {tuple(r) for r in self._execute(query)}

    # Reading -------------------------------------------------------------------------------

    def sql(self, query: str, params: Sequence[Any] | None = None) -> pa.Table:
        """Run SQL. Read-only, only queries run (`gymfoundry.warehouse.statements`: nothing may write files)."""
        if self.read_only:
            statements.check_query(query)
        with self._damage_explained():
            result = self.con.sql(query, params=params)
            return result.to_arrow_table() if result is not None else pa.table({})

    def _execute(self, query: str, params: Sequence[Any] | None = None) -> list[tuple]:
        with self._damage_explained():
            return self.con.execute(query, params).fetchall()

    @contextmanager
    def _damage_explained(self) -> Iterator[None]:
        """A query that met a damaged table raises DamagedWarehouse naming the file, not an IO error."""
        try:
            yield
        except duckdb.Error as exc:
            text = str(exc)
            if catalog.DAMAGED in text:
                raise DamagedWarehouse(text[text.index(catalog.DAMAGED):]) from None
            if any(str(self.data_dir / e.path) in text for e in catalog.entries(self.con)):
                raise DamagedWarehouse(f"{catalog.DAMAGED} reading a registered lake file failed ({text}); run "
                                       "`gymfoundry warehouse check` to see the damage and `gymfoundry "
                                       "warehouse repair` to quarantine it") from None
            raise

    def sql_df(self, query: str, params: Sequence[Any] | None = None) -> pl.DataFrame:
        return pl.from_arrow(self.sql(query, params))

    def load_tasks(self, where: str | None = None, params: Sequence[Any] | None = None) -> list[TaskSpec]:
        """Tasks; a row that is no valid TaskSpec (its id not its content's) is skipped and reported."""
        return self._records(TABLES["tasks"], self._select("tasks", where, params))

    def _records(self, table: Table, rows: list[dict[str, Any]]) -> list[Record]:
        """The rows' records; one that does not read back (written around the gates, or before a gate
        existed) is left out with a warning and listed in `skipped`, rather than failing the table."""
        out = []
        for row in rows:
            try:
                out.append(_record(table, row))
            except ValueError as exc:  # pydantic's ValidationError
                key = {k: row.get(k) for k in table.key}
                self.skipped.append({"table": table.name, "key": key, "error": str(exc)})
                log.warning("skipped a %s row that is no valid %s: %s: %s; `gymfoundry warehouse check` "
                            "reports it", table.name, table.model.__name__, key, str(exc).splitlines()[0])
        return out

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

    def load(self, table: str, where: str | None = None, params: Sequence[Any] | None = None) -> list[Record]:
        """Records of any table whose record is stored whole (runs, datasets, dataset_rows, ...)."""
        return self._records(TABLES[table], self._select(table, where, params))

    def files(self, table: str) -> list[Path]:
        """The registered files of a table (absolute paths)."""
        return catalog.registered_files(self.con, self.data_dir, table)

    def count(self, table: str) -> int:
        return self._execute(f"SELECT count(*) FROM {TABLES[table].name}")[0][0]

    def _select(self, name: str, where: str | None, params: Sequence[Any] | None) -> list[dict[str, Any]]:
        table = TABLES[name]
        columns = ", ".join(catalog.quote_ident(c.name) for c in table.columns)
        order = ", ".join(catalog.quote_ident(k) for k in table.key)
        query = f"SELECT {columns} FROM {name}" + (f" WHERE {where}" if where else "") + f" ORDER BY {order}"
        return self.sql(query, params).to_pylist()


@dataclass
class Landing:
    """What one landing did: the new rows per table, or the quarantine the batch went to."""

    counts: dict[str, int]
    quarantine: Path | None = None
    report: quality.QualityReport | None = None
    spooled: Path | None = None  # the catalog was locked: the batch waits there for the next landing
    refused: Path | None = None  # the quarantine of the batch's rollouts no column could hold (the rest landed)
    drained: list[Path] = field(default_factory=list)  # spooled batches this landing landed first

    @property
    def ok(self) -> bool:
        return self.quarantine is None

    def checked(self) -> dict[str, int]:
        """The counts, or QuarantinedBatch when the batch failed the gates."""
        if not self.ok:
            raise QuarantinedBatch(self)
        return self.counts


@dataclass
class Repair:
    """What `Warehouse.repair` did: quarantine folder -> the lake files moved there (with the
    failures that sent each landing), and the temp files of killed writers it removed."""

    moved: dict[Path, list[str]] = field(default_factory=dict)
    failures: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    removed_temp: list[str] = field(default_factory=list)
    rebuilt: list[str] = field(default_factory=list)  # ids of the damaged datasets whose file was rebuilt


class DamagedWarehouse(RuntimeError):
    """A registered lake file is missing or changed: `gymfoundry warehouse repair` quarantines it."""


class DamagedDataset(DamagedWarehouse):
    """A dataset file is missing, changed or unknown to its warehouse: the trainer refuses it."""


def assert_intact(data_dir: str | os.PathLike) -> None:
    """Raise DamagedWarehouse when a registered file is missing or changed (no catalog: nothing to
    damage). Hashes the lake once: the factory calls it before a run. Dataset files are not checked here: a
    run reads none of its rows from them, and assembling again rewrites a damaged one."""
    if not (Path(data_dir) / CATALOG_FILE).exists():
        return
    with Warehouse(data_dir, read_only=True) as wh:
        damaged = [p for p in damage.inspect(wh.con, wh.data_dir) if p.kind in damage.DAMAGE and p.dataset_id is None]
    if damaged:
        listed = "; ".join(f"{p.path}: {p.kind} ({p.reason})" for p in damaged[:5])
        more = f" and {len(damaged) - 5} more" if len(damaged) > 5 else ""
        raise DamagedWarehouse(f"{catalog.DAMAGED} {len(damaged)} registered lake files are damaged: {listed}{more}; "
                               "run `gymfoundry warehouse repair` to quarantine them, then re-run")


def assert_dataset_intact(path: str | os.PathLike) -> None:
    """Raise DamagedDataset, naming the file, when a warehouse's dataset file
    (`<data_dir>/datasets/<id>.parquet`) is not the one its warehouse recorded: missing, changed,
    quarantined, or named by no dataset there. A file outside a warehouse has nothing to check
    against and passes; one assembled before checksums were kept passes with a warning."""
    file = Path(path).resolve()
    data_dir = file.parent.parent
    if file.parent.name != catalog.DATASETS_DIR or not (data_dir / CATALOG_FILE).is_file():
        return
    relative = file.relative_to(data_dir).as_posix()
    with Warehouse(data_dir, read_only=True) as wh:
        found = [p for p in damage.datasets(wh.con, wh.data_dir) if p.path == relative]
        known = found or any(f.path == relative for f in catalog.dataset_files(wh.con))
    if not known:
        raise DamagedDataset(f"dataset file {file} is named by no dataset of the warehouse {data_dir}: "
                             "refusing to train on it (assemble the datasets again)")
    for p in found:
        if p.kind == "unknown_checksum":
            log.warning("dataset file %s: %s", file, p.reason)
        else:
            raise DamagedDataset(f"dataset file {file} is damaged ({p.kind}: {p.reason}): refusing to train on it; "
                                 "`gymfoundry warehouse repair` rebuilds it")


class CatalogLocked(RuntimeError):
    """Another process held the catalog's lock for longer than the writer waited."""

    def __init__(self, path: Path, holder: str, waited_s: float, error: str):
        super().__init__(f"the warehouse catalog {path} is locked by {holder}; waited {waited_s:.0f} s ({error})")
        self.path, self.holder, self.waited_s = path, holder, waited_s


class QuarantinedBatch(RuntimeError):
    def __init__(self, landing: Landing):
        super().__init__(f"batch failed the quality gates and went to {landing.quarantine}: "
                         f"{landing.report.summary() if landing.report else ''}")
        self.landing = landing


def _utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _landing_hook() -> None:
    """For the durability test, which kills the process here: with GYMFOUNDRY_PAUSE_LANDING=<path>,
    landing writes its pid to that file and waits (GYMFOUNDRY_PAUSE_LANDING_S, default 60 s) with
    the batch files written and the registering transaction open."""
    marker = os.environ.get("GYMFOUNDRY_PAUSE_LANDING")
    if marker:
        Path(marker).write_text(str(os.getpid()))
        time.sleep(float(os.environ.get("GYMFOUNDRY_PAUSE_LANDING_S", "60")))


def confine(con: duckdb.DuckDBPyConnection, data_dir: Path) -> None:
    """A reader's connection touches no file but the lake's, and its settings are locked.

    The console's statement check cannot see side effects of functions: `SELECT * FROM
    enable_logging(storage = 'file', storage_path = ...)` (or `enable_profiling(save_location = ...)`)
    writes files anywhere, and `read_blob('/etc/shadow')` reads any file. DuckDB itself refuses both
    once external access is off (but for the lake) and the configuration locked. A lake, partition
    or file symlinked onto another disk stays readable: DuckDB checks the resolved path."""
    with _CONFINING:  # readers opening at once in threads: one confines, the others see it locked
        if con.execute("SELECT current_setting('lock_configuration')").fetchall()[0][0]:
            # Another reader in this process opened the same catalog first: DuckDB shares one database
            # instance between them, already confined and locked (the whole lake stays readable).
            return
        lake = data_dir / LAKE_DIR
        con.execute("SET allowed_directories = ?", [sorted({str(lake) + os.sep, os.path.realpath(lake) + os.sep})])
        files = [data_dir / e.path for e in catalog.entries(con)]
        con.execute("SET allowed_paths = ?", [sorted({str(f) for f in files} | {os.path.realpath(f) for f in files})])
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")


_CONFINING = threading.Lock()


LOCK_HOLDER = re.compile(r"Conflicting lock is held in (?P<program>.*?) \(PID (?P<pid>\d+)\)")


def lock_holder(message: str) -> str:
    """Who holds the lock, from DuckDB's message: `<program> (PID n)`."""
    found = LOCK_HOLDER.search(message)
    return f"{found['program']} (PID {found['pid']})" if found else "another process"


LOCK_WAIT_S = 300.0  # a notebook left open as a nightly run lands: wait out a quick look, then spool
LOCK_WAIT_ENV = "GYMFOUNDRY_LOCK_WAIT_S"


def lock_wait_s() -> float:
    """How long a writer (or a reader a writer blocks) waits for a held catalog lock before giving up
    (a landing then spools its records): GYMFOUNDRY_LOCK_WAIT_S, else LOCK_WAIT_S."""
    value = os.environ.get(LOCK_WAIT_ENV)
    if value is None:
        return LOCK_WAIT_S
    try:
        wait = float(value)
    except ValueError:
        raise ValueError(f"{LOCK_WAIT_ENV}={value!r} is not a number of seconds") from None
    if not wait >= 0:
        raise ValueError(f"{LOCK_WAIT_ENV}={value!r}: the wait must be 0 or more seconds")
    return wait


def _connect(path: Path, read_only: bool, lock_timeout_s: float) -> duckdb.DuckDBPyConnection:
    """DuckDB lets one process write a file, and a writer and readers exclude each other: a held
    lock is retried with backoff (0.2 s doubling to 5 s) for `lock_timeout_s`, saying who holds it
    ("waiting for <program> (PID n)") each time the holder changes."""
    start = time.monotonic()
    delay, holder = 0.2, None
    while True:
        try:
            # The storage version matters where a file is created (by a writer). A reader passes no
            # config, so it shares a process with the user's own `duckdb.connect(..., read_only=True)`.
            return duckdb.connect(str(path), read_only=read_only, config={} if read_only else catalog.CONFIG)
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                raise
            waited = time.monotonic() - start
            if waited + delay > lock_timeout_s:
                log.error("warehouse catalog %s is still locked by %s after %.0f s; giving up",
                          path, lock_holder(str(exc)), waited)
                raise CatalogLocked(path, lock_holder(str(exc)), waited, str(exc)) from None
            if lock_holder(str(exc)) != holder:
                holder = lock_holder(str(exc))
                log.warning("warehouse catalog %s is locked: waiting for %s (a reader or writer in another process: "
                            "close it to let this %s proceed); retrying for up to %.0f s", path, holder,
                            "read" if read_only else "landing", lock_timeout_s)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _registered_paths(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The lake paths the manifest holds (none where the connection cannot answer)."""
    try:
        return {e.path for e in catalog.entries(con)}
    except duckdb.Error:
        return set()


def _row(table: Table, record: Record, **added: Any) -> dict[str, Any]:
    return table.row(record, **added)


def _discard(data_dir: Path, staged: Future | None) -> None:
    """Remove the staged files of a batch the gates refused (a write that failed left at most a temp
    file, which the next writer removes with everything else unregistered in staging)."""
    if staged is None or staged.exception() is not None:
        return
    for batch in staged.result():
        (data_dir / staging_path(batch.path)).unlink(missing_ok=True)


def _record(table: Table, row: dict[str, Any], **fields: Any) -> Record:
    return table.record(row, **fields)
