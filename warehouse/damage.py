"""Storage damage: which registered lake files are missing or changed, what else is in the lake,
and the repair that moves damaged landings to quarantine.

A landing (one `Warehouse.land` call) registers files of several tables together: a rollout's
steps and scores sit in other files than the rollout. Repair therefore quarantines whole
landings, and then every landing whose rows reference what left (a later score of a lost step,
a dataset row naming a lost task), so the rest stays consistent; re-running the runs that landed
them lands the same rows again under the same file names.

Dataset files (`datasets/<dataset_id>.parquet`) are checked the same way against the checksums in
`dataset_files`; their repair is a rebuild from the warehouse (`Warehouse.repair`), not a landing's
quarantine.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq

from gymfoundry.envs.records import content_hash
from gymfoundry.warehouse import catalog
from gymfoundry.warehouse.lake import LAKE_DIR, STAGING_DIR, TEMP_SUFFIX, file_sha256, staging_path
from gymfoundry.warehouse.staged import INCOMING_DIR
from gymfoundry.warehouse.tables import PARTITION, TABLES, Table

# List columns naming rows of another table (not gate references: `check`'s integrity checks them).
# Repair follows them too, so no dataset row is left naming a rollout that left with a damaged landing.
LINEAGE = {"dataset_rows": (("rollout_ids", "rollouts"),)}
DAMAGE = ("missing", "changed")  # the kinds `check` fails on and `repair` quarantines
# The other kinds are reported, not damage: `unknown_checksum` (registered before checksums were
# kept, seen read-only), `unregistered` (invisible to every view; a writer killed after writing
# leaves one in staging, the next writer removes it), `temp` (a writer killed before its rename),
# `staged` (registered, still in staging: the writer was killed before it moved it; the next writer does),
# `incoming` (a worker's staged batch, not landed: in flight, or left by a worker that died),
# `quarantined` (a damaged dataset file `repair` could not rebuild: moved away, assembling again builds it).
INCOMING_STALE_S = 3600  # `repair` removes incoming files older than this: no live worker stages that long


@dataclass(frozen=True)
class FileProblem:
    path: str  # relative to the data dir
    kind: str  # missing | changed | unknown_checksum | unregistered | temp | staged
    reason: str
    table: str | None = None
    batch_id: str | None = None
    landing_id: str | None = None
    dataset_id: str | None = None  # a dataset file's problem (then `table` is "datasets")

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def inspect(con: duckdb.DuckDBPyConnection, data_dir: Path, checksums: bool = True) -> list[FileProblem]:
    """Every registered file checked (exists, checksum, row count), then the files nobody registered."""
    entries = catalog.entries(con)
    problems = [p for e in entries for p in [verify(data_dir, e, checksums)] if p is not None]
    return problems + strays(data_dir, {e.path for e in entries}) + datasets(con, data_dir, checksums)


def verify(data_dir: Path, entry: catalog.Entry, checksum: bool = True) -> FileProblem | None:
    file = data_dir / entry.path
    if not file.is_file() and (data_dir / staging_path(entry.path)).is_file():
        return FileProblem(entry.path, "staged", "registered, but the landing was killed before it moved the file "
                                                 "from staging into the lake; the next landing (or `warehouse "
                                                 "repair`) moves it", entry.table_name, entry.batch_id,
                           entry.landing_id)
    found = compare(file, entry.sha256 if checksum else None, entry.row_count)
    if found is None and checksum and entry.sha256 is None:
        found = ("unknown_checksum", "registered before checksums were kept; opening the warehouse for writing "
                                     "(any landing or repair) records it")
    if found is None:
        return None
    kind, reason = found
    if kind == "missing":
        reason = f"registered file of table {entry.table_name} is missing"
    return FileProblem(entry.path, kind, reason, entry.table_name, entry.batch_id, entry.landing_id)


def compare(file: Path, sha256: str | None, row_count: int) -> tuple[str, str] | None:
    """(kind, reason) when `file` is missing or is not the one recorded (its checksum when one is
    given, its row count); the one rule for lake and dataset files."""
    if not file.is_file():
        return "missing", "the file is missing"
    if sha256 is not None:
        digest = file_sha256(file)
        if digest != sha256:
            return "changed", f"sha256 is {digest}, recorded {sha256}"
    try:
        rows = pq.read_metadata(file).num_rows
    except (OSError, ValueError) as exc:
        return "changed", f"not readable as Parquet: {exc}"
    if rows != row_count:
        return "changed", f"holds {rows} rows, recorded {row_count}"
    return None


def datasets(con: duckdb.DuckDBPyConnection, data_dir: Path, checksums: bool = True) -> list[FileProblem]:
    """Every recorded dataset file checked (exists, checksum, row count); a dataset whose file has
    no checksum (assembled before they were kept) is reported, not damage."""
    files = catalog.dataset_files(con)
    problems = [p for f in files for p in [verify_dataset(data_dir, f, checksums)] if p is not None]
    recorded = {f.dataset_id for f in files}
    try:
        named = con.execute("SELECT DISTINCT dataset_id, path FROM datasets WHERE path IS NOT NULL "
                            "ORDER BY dataset_id").fetchall()
    except duckdb.Error:  # the `datasets` table's own lake file is damaged: `inspect` reports that file
        named = []
    for dataset_id, path in named:
        if dataset_id not in recorded:
            problems.append(FileProblem(path, "unknown_checksum", f"dataset {dataset_id} was assembled before "
                                        "dataset checksums were kept; `warehouse repair` records its checksum, "
                                        "trusting the file as it is now", "datasets", dataset_id=dataset_id))
    return problems


def verify_dataset(data_dir: Path, file: catalog.DatasetFile, checksum: bool = True) -> FileProblem | None:
    def problem(kind: str, reason: str) -> FileProblem:
        return FileProblem(file.path, kind, f"dataset {file.dataset_id}: {reason}", "datasets",
                           dataset_id=file.dataset_id)

    if file.quarantine is not None:
        return problem("quarantined", f"its file was damaged and could not be rebuilt from the warehouse; moved to "
                                      f"{file.quarantine}; assemble the datasets again to build it anew")
    found = compare(data_dir / file.path, file.sha256 if checksum else None, file.row_count)
    return None if found is None else problem(*found)


def strays(data_dir: Path, registered: set[str]) -> list[FileProblem]:
    out = []
    for file in sorted((data_dir / LAKE_DIR).rglob("*")):
        relative = file.relative_to(data_dir).as_posix()
        if not file.is_file() or relative in registered:
            continue
        if file.name.startswith(".") and file.name.endswith(TEMP_SUFFIX):
            out.append(FileProblem(relative, "temp", "left by a writer killed before it renamed the file; "
                                                     "not damage, `warehouse repair` removes it"))
        else:
            out.append(FileProblem(relative, "unregistered", "in the lake but not in the manifest, so no view "
                                                             "reads it (left by a version that wrote batches "
                                                             "into the lake before registering them)"))
    for file in sorted((data_dir / INCOMING_DIR).rglob("*")):
        if file.is_file():
            out.append(FileProblem(file.relative_to(data_dir).as_posix(), "incoming",
                                   "staged by a worker (`gymfoundry.warehouse.stage`) and not landed yet, or never: a worker "
                                   "killed while staging, a batch never handed to `land_staged`; no view reads it, "
                                   f"`warehouse repair` removes it once it is {INCOMING_STALE_S // 3600} h old"))
    for file in sorted((data_dir / STAGING_DIR).rglob("*")):
        relative = file.relative_to(data_dir).as_posix()
        if file.is_file() and relative.replace(STAGING_DIR, LAKE_DIR, 1) not in registered:
            out.append(FileProblem(relative, "unregistered", "in staging, never registered (a landing killed "
                                                             "before it registered); the next landing removes it"))
    return out


def failure(problem: FileProblem, expectation: str | None = None) -> dict[str, Any]:
    """A problem in the shape of a quality-gate failure (reports and the quarantine table)."""
    return {"table": problem.table or "files", "column": "", "expectation": expectation or f"file_{problem.kind}",
            "kwargs": {}, "meta": problem.to_json(), "unexpected_count": None, "examples": [problem.path],
            "error": f"{problem.path}: {problem.reason}"}


def landings_to_quarantine(con: duckdb.DuckDBPyConnection, data_dir: Path,
                           problems: list[FileProblem]) -> dict[str, list[dict[str, Any]]]:
    """landing_id -> its failures: the landings with damaged files, then, with those taken out of
    the manifest (inside the caller's transaction), every landing left with dangling references."""
    out: dict[str, list[dict[str, Any]]] = {}
    for p in problems:
        if p.kind in DAMAGE and p.dataset_id is None:  # a dataset file is rebuilt, not a landing's
            out.setdefault(p.landing_id, []).append(failure(p))
    pending = set(out)
    while pending:
        con.execute("DELETE FROM manifest WHERE landing_id IN (SELECT unnest(?))", [sorted(pending)])
        catalog.rebuild_views(con, data_dir)
        catalog.rebuild_views(con, data_dir, temporary=True)  # what the connection's queries read
        pending = set()
        for landing, failures in dangling(con, data_dir).items():
            if landing not in out:
                out[landing] = failures
                pending.add(landing)
    return out


def dangling(con: duckdb.DuckDBPyConnection, data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """landing_id -> failures, for the registered files holding rows whose references name nothing."""
    landing_of = {e.path: e for e in catalog.entries(con)}
    out: dict[str, list[dict[str, Any]]] = {}
    for table in TABLES.values():
        files = [data_dir / e.path for e in landing_of.values() if e.table_name == table.name]
        refs = [(ref.columns, ref.table, False) for ref in table.references]
        refs += [((column,), parent, True) for column, parent in LINEAGE.get(table.name, ())]
        for columns, parent_name, many in refs if files else ():
            parent = TABLES[parent_name]
            rows = _with_filenames(table, files)
            if many:  # one list column whose every element names a parent row (a dataset row's rollouts)
                column = catalog.quote_ident(columns[0])
                rows = f"SELECT filename, unnest({column}) AS {column} FROM ({rows})"
            on = " AND ".join(f"c.{catalog.quote_ident(c)} = p.{catalog.quote_ident(k)}"
                              for c, k in zip(columns, parent.key))
            present = " AND ".join(f"c.{catalog.quote_ident(c)} IS NOT NULL" for c in columns)
            query = (f"SELECT c.filename, count(*) FROM ({rows}) c "
                     f"ANTI JOIN {parent.name} p ON {on} WHERE {present} GROUP BY 1")
            for filename, n in con.execute(query).fetchall():
                entry = landing_of[Path(filename).relative_to(data_dir).as_posix()]
                reason = (f"{n} rows reference {parent_name} rows that were quarantined with a damaged landing "
                          f"({', '.join(columns)} -> {parent_name})")
                problem = FileProblem(entry.path, "dangling", reason, table.name, entry.batch_id, entry.landing_id)
                out.setdefault(entry.landing_id, []).append(failure(problem, "references_quarantined_rows"))
    return out


def _with_filenames(table: Table, files: list[Path]) -> str:
    paths = ", ".join(catalog.quote_literal(p.as_posix()) for p in files)
    hive = (f"hive_partitioning = true, hive_types = {{'{PARTITION}': VARCHAR}}" if table.partitioned
            else "hive_partitioning = false")
    return f"SELECT * FROM read_parquet([{paths}], {hive}, union_by_name = true, filename = true)"


def move_to_quarantine(data_dir: Path, folder: Path, entries: list[catalog.Entry],
                       failures: list[dict[str, Any]], created: str) -> None:
    """The landing's files (those still there) under `folder`, by their lake path, with a report."""
    for entry in entries:
        source = data_dir / entry.path
        if source.is_file():
            target = folder / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, target)
    report = {"created_at": created, "reason": "storage damage (warehouse repair)", "failures": failures,
              "files": [{k: str(v) for k, v in asdict(e).items()} for e in entries]}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")


def quarantine_id(landing_id: str, created: str) -> str:
    return "d-" + content_hash([landing_id, created], 20)
