"""The DuckDB catalog: a manifest of registered batch files and one view per table.

A view reads exactly the files in the manifest, so a file in the lake that was never
registered is invisible. Paths are stored relative to the data dir: the stored views name them
relative (for the DuckDB CLI, opened from the data dir), and every `Warehouse` connection
shadows them with temporary views naming the absolute paths of the dir it opened, so a moved
or copied data dir reads its own lake.
A table with a registered file missing gets a view that fails with a message naming the file
(`DAMAGED`), so the damage stays confined to the queries that touch it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

from gymfoundry.envs.records import content_hash
from gymfoundry.warehouse.lake import STAGING_DIR, Batch, file_sha256, lake_path, publish
from gymfoundry.warehouse.tables import PARTITION, TABLES, Table
from gymfoundry.warehouse.views import create_analysis_views

MANIFEST_DDL = """
CREATE TABLE IF NOT EXISTS manifest (
    batch_id    VARCHAR PRIMARY KEY,
    table_name  VARCHAR NOT NULL,
    task_family VARCHAR NOT NULL,
    path        VARCHAR NOT NULL,   -- relative to the data dir
    row_count   BIGINT NOT NULL,
    landed_at   TIMESTAMP NOT NULL, -- UTC
    sha256      VARCHAR,            -- of the file's bytes; NULL where unknown (see migrate_manifest)
    landing_id  VARCHAR             -- the files one landing registered together (a batch spans tables)
)
"""
MANIFEST_COLUMNS = ("batch_id", "table_name", "task_family", "path", "row_count", "landed_at", "sha256", "landing_id")
# Starts the message of a query on a damaged table; the warehouse turns it into DamagedWarehouse.
DAMAGED = "warehouse damaged:"

# Batches that failed the quality gates: their rows and report are under `path`, never in a table.
QUARANTINE_DDL = """
CREATE TABLE IF NOT EXISTS quarantine (
    quarantine_id  VARCHAR PRIMARY KEY,
    created_at     TIMESTAMP NOT NULL,  -- UTC
    path           VARCHAR NOT NULL,    -- relative to the data dir
    tables         VARCHAR[] NOT NULL,
    row_count      BIGINT NOT NULL,
    failures       VARCHAR NOT NULL     -- JSON: the failed expectations
)
"""


# Dataset files (`<data_dir>/datasets/<dataset_id>.parquet`, written by `gymfoundry.tasks.stages.assemble`) are no lake
# batches, but as much part of the warehouse: each one's checksum is kept here when it is written,
# `warehouse check` verifies it, the trainer refuses a file that does not match. Mutable, unlike the
# `datasets` rows: a dataset rebuilt by `warehouse repair`, or quarantined, updates its entry.
DATASETS_DIR = "datasets"
DATASET_FILES_DDL = """
CREATE TABLE IF NOT EXISTS dataset_files (
    dataset_id  VARCHAR PRIMARY KEY,
    path        VARCHAR NOT NULL,   -- relative to the data dir
    row_count   BIGINT NOT NULL,
    sha256      VARCHAR NOT NULL,   -- of the file's bytes, as written
    written_at  TIMESTAMP NOT NULL, -- UTC
    quarantine  VARCHAR             -- where `warehouse repair` moved a damaged file it could not rebuild
)
"""
DATASET_FILE_COLUMNS = ("dataset_id", "path", "row_count", "sha256", "written_at", "quarantine")


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def base_select(table: Table, files: list[str], present: set[str] | None = None) -> str:
    """The table's logical columns, from its files or, with none yet, typed and empty. `present`:
    the columns some file holds (a column no file holds yet, added to the records later, reads NULL)."""
    def null(c) -> str:
        return f"CAST(NULL AS {c.sql_type}) AS {quote_ident(c.name)}"

    if not files:
        return f"SELECT {', '.join(null(c) for c in table.columns)} WHERE false"
    present = {c.name for c in table.columns} if present is None else present | {PARTITION}
    paths = ", ".join(quote_literal(p) for p in files)
    # TRY_CAST: files written before timestamps were TIMESTAMP hold the ISO text ("" for none).
    columns = ", ".join(null(c) if c.name not in present else
                        f"TRY_CAST({quote_ident(c.name)} AS TIMESTAMP) AS {quote_ident(c.name)}"
                        if c.name in table.timestamps else quote_ident(c.name) for c in table.columns)
    hive = (f"hive_partitioning = true, hive_types = {{'{PARTITION}': VARCHAR}}" if table.partitioned
            else "hive_partitioning = false")
    # union_by_name: files written before a field was added to a record read it as NULL.
    return f"SELECT {columns} FROM read_parquet([{paths}], {hive}, union_by_name = true)"


def damaged_select(table: Table, damaged: list[str]) -> str:
    """Typed columns (so the views over this one still bind) that raise, naming the file, when read."""
    columns = ", ".join(f"CAST(NULL AS {c.sql_type}) AS {quote_ident(c.name)}" for c in table.columns)
    more = f" and {len(damaged) - 1} more" if len(damaged) > 1 else ""
    message = (f"{DAMAGED} registered lake file {damaged[0]}{more} of table {table.name}; run "
               "`gymfoundry warehouse check` to see the damage and `gymfoundry warehouse repair` to "
               "quarantine it (then re-run the factory to land the lost rows again)")
    return f"SELECT {columns} WHERE error({quote_literal(message)}) IS NULL"


def view_sql(table: Table, files: list[str], temporary: bool, data_dir: Path) -> str:
    """The view of a table over its registered `files` (relative to the data dir). A stored view
    names them relative (DuckDB resolves them against the working directory, or `file_search_path`,
    so `cd <data dir>` before opening the catalog reads the lake of the catalog's own dir); a
    temporary one, which every `Warehouse` connection shadows the stored ones with, absolute."""
    derived = "".join(f", {expression}" for expression in table.derived)
    kind = "TEMP VIEW" if temporary else "VIEW"
    # Checked here because DuckDB reads every footer to bind the view: one bad file would fail the
    # whole catalog's opening (and abort the transaction the view is built in).
    footers = {f: _known_footer(data_dir / f) for f in files}
    damaged = [f"{f} {problem}" for f, (problem, _) in footers.items() if problem]
    present = {name for _, names in footers.values() for name in names}
    named = [(data_dir / f).as_posix() if temporary else f for f in files]
    base = damaged_select(table, damaged) if damaged else base_select(table, named, present)
    return f"CREATE OR REPLACE {kind} {table.name} AS SELECT *{derived} FROM ({base})"


def footer(file: Path) -> tuple[str | None, set[str]]:
    """Why DuckDB could not open the file, or None, and the columns it holds (the bytes are `warehouse
    check`'s to verify)."""
    if not file.is_file():
        return "is missing", set()
    try:
        return None, set(pq.read_schema(file).names)
    except (OSError, ValueError) as exc:
        return f"is unreadable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})", set()


# A readable file's columns by its path and the SHA-256 of its footer (the bytes a view's binding
# reads): a view's rebuild after each landing parses only new or changed footers, not every
# registered file's again. Reading a footer's bytes costs far less than parsing them; a footer
# changed in any way (a rewrite, a flipped bit, whatever its size and times) is parsed again.
_FOOTERS: dict[tuple[str, bytes], set[str]] = {}
_FOOTERS_MAX = 65536


def _footer_digest(file: Path) -> bytes | None:
    """The SHA-256 of a Parquet file's footer (its metadata, length and closing magic), None where
    the file has no such footer (`footer` says what is wrong with it)."""
    try:
        with open(file, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size < 12:
                return None
            f.seek(size - 8)
            tail = f.read(8)
            length = int.from_bytes(tail[:4], "little")
            if tail[4:] != b"PAR1" or length > size - 12:
                return None
            f.seek(size - 8 - length)
            return hashlib.sha256(f.read(length) + tail).digest()
    except OSError:
        return None


def _known_footer(file: Path) -> tuple[str | None, set[str]]:
    """`footer(file)`, remembered for a footer parsed before with the same bytes."""
    digest = _footer_digest(file)
    if digest is None:
        return footer(file)
    key = (str(file), digest)
    names = _FOOTERS.get(key)
    if names is not None:
        return None, names
    problem, names = footer(file)
    if problem is None:
        if len(_FOOTERS) >= _FOOTERS_MAX:
            _FOOTERS.clear()
        _FOOTERS[key] = names
    return problem, names


def footer_problem(file: Path) -> str | None:
    return footer(file)[0]


def registered_paths(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    """The table's registered files, relative to the data dir."""
    rows = con.execute("SELECT path FROM manifest WHERE table_name = ? ORDER BY landed_at, batch_id",
                       [table]).fetchall()
    return [path for (path,) in rows]


def registered_files(con: duckdb.DuckDBPyConnection, data_dir: Path, table: str) -> list[Path]:
    return [data_dir / path for path in registered_paths(con, table)]


@dataclass(frozen=True)
class Entry:
    """One registered file, as the manifest has it."""

    batch_id: str
    table_name: str
    task_family: str
    path: str
    row_count: int
    landed_at: object
    sha256: str | None
    landing_id: str


def manifest_columns(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute("SELECT column_name FROM duckdb_columns() WHERE schema_name = 'main' "
                       "AND table_name = 'manifest'").fetchall()
    return {name for (name,) in rows}


def entries(con: duckdb.DuckDBPyConnection) -> list[Entry]:
    """Every registered file; a catalog from before checksums (opened read-only) reads NULL for them."""
    have = manifest_columns(con)
    if not have:
        return []
    defaults = {"sha256": "NULL", "landing_id": "'l-' || CAST(landed_at AS VARCHAR)"}
    select = ", ".join(c if c in have else f"{defaults[c]} AS {c}" for c in MANIFEST_COLUMNS)
    rows = con.execute(f"SELECT {select} FROM manifest ORDER BY landed_at, batch_id").fetchall()
    return [Entry(*row) for row in rows]


def migrate_manifest(con: duckdb.DuckDBPyConnection, data_dir: Path) -> list[str]:
    """Bring a manifest from before checksums up to date (writer only); returns notes for the log.
    Files registered before are trusted as they are now: their checksum is taken at this first
    open, where the file exists and holds the registered number of rows; otherwise it stays
    unknown and `warehouse check` reports the file."""
    have = manifest_columns(con)
    for column in ("sha256", "landing_id"):
        if column not in have:
            con.execute(f"ALTER TABLE manifest ADD COLUMN {column} VARCHAR")
    # One landing registered its files with one timestamp: that groups the old files by landing.
    con.execute("UPDATE manifest SET landing_id = 'l-' || CAST(landed_at AS VARCHAR) WHERE landing_id IS NULL")
    unknown = con.execute("SELECT batch_id, path, row_count FROM manifest WHERE sha256 IS NULL").fetchall()
    recorded, left = [], []
    for batch_id, path, row_count in unknown:
        file = data_dir / path
        try:
            intact = pq.read_metadata(file).num_rows == row_count
        except (OSError, ValueError):
            intact = False
        if intact:
            recorded.append([file_sha256(file), batch_id])
        else:
            left.append(path)
    if recorded:
        con.executemany("UPDATE manifest SET sha256 = ? WHERE batch_id = ?", recorded)
    notes = []
    if recorded:
        notes.append(f"recorded the checksums of {len(recorded)} lake files registered before checksums were "
                     "kept, trusting their bytes as they are now")
    if left:
        notes.append(f"{len(left)} registered lake files have no checksum (missing or unreadable): "
                     f"{', '.join(left[:5])}; `gymfoundry warehouse check` reports them")
    return notes


@dataclass(frozen=True)
class DatasetFile:
    """One dataset file, as `dataset_files` has it."""

    dataset_id: str
    path: str
    row_count: int
    sha256: str
    written_at: object
    quarantine: str | None = None


def dataset_files(con: duckdb.DuckDBPyConnection) -> list[DatasetFile]:
    """Every recorded dataset file (none in a catalog from before dataset checksums)."""
    found = con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'main' "
                        "AND table_name = 'dataset_files'").fetchall()
    if not found[0][0]:
        return []
    rows = con.execute(f"SELECT {', '.join(DATASET_FILE_COLUMNS)} FROM dataset_files ORDER BY dataset_id").fetchall()
    return [DatasetFile(*row) for row in rows]


def record_dataset_file(con: duckdb.DuckDBPyConnection, file: DatasetFile) -> None:
    """Keep (or replace) a dataset file's checksum (writer only)."""
    con.execute(DATASET_FILES_DDL)
    con.execute(f"INSERT OR REPLACE INTO dataset_files ({', '.join(DATASET_FILE_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?)",
                [getattr(file, c) for c in DATASET_FILE_COLUMNS])


def has_manifest(con: duckdb.DuckDBPyConnection) -> bool:
    found = con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'main' "
                        "AND table_name = 'manifest'").fetchall()
    return found[0][0] > 0


def rebuild_views(con: duckdb.DuckDBPyConnection, data_dir: Path, tables: list[str] | None = None,
                  temporary: bool = False) -> None:
    """The views of `tables` (all, and the analysis views, when None). Stored views name the lake's
    files relative to the data dir: the connection resolves them through `file_search_path`, which
    `bind` sets to the data dir."""
    manifest = has_manifest(con)
    for name in tables or list(TABLES):
        files = registered_paths(con, name) if manifest else []
        con.execute(view_sql(TABLES[name], files, temporary, data_dir))
    if tables is None:
        create_analysis_views(con, temporary)


def bind(con: duckdb.DuckDBPyConnection, data_dir: Path) -> None:
    """Let a writer's connection build the stored views (relative paths) of this data dir."""
    con.execute("SET file_search_path = ?", [str(data_dir)])


def register(con: duckdb.DuckDBPyConnection, data_dir: Path, batches: list[Batch], landed_at,
             before_commit: Callable[[], None] | None = None) -> None:
    """Register staged batches, then move them into the lake and refresh the affected views.

    The manifest's commit is the landing: a crash before it leaves the batches in staging only,
    where no reader of the lake looks (the next writer removes them); a crash after it, before
    every file was moved, is completed by the next writer (`recover_staging`)."""
    if not batches:
        return
    landing_id = "l-" + content_hash(sorted(b.batch_id for b in batches) + [str(landed_at)], 20)
    con.execute("BEGIN TRANSACTION")
    try:
        con.executemany(f"INSERT INTO manifest ({', '.join(MANIFEST_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [[b.batch_id, b.table, b.task_family, b.path, b.row_count, landed_at, b.sha256, landing_id]
                         for b in batches])
        if before_commit is not None:
            before_commit()
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    for batch in batches:
        publish(data_dir, batch.path)
    tables = sorted({b.table for b in batches})
    rebuild_views(con, data_dir, tables)
    rebuild_views(con, data_dir, tables, temporary=True)


def recover_staging(con: duckdb.DuckDBPyConnection, data_dir: Path) -> list[str]:
    """Finish what a killed writer left in staging (writer only, holding the catalog's lock): a
    registered file still staged moves into the lake; anything else there (a batch never
    registered, a temp file) is removed. Returns notes for the log."""
    staging = data_dir / STAGING_DIR
    if not staging.is_dir():
        return []
    registered = {e.path: e for e in entries(con)}
    moved, removed = [], []
    for file in sorted(p for p in staging.rglob("*") if p.is_file()):
        path = lake_path(file.relative_to(data_dir).as_posix())
        entry = registered.get(path)
        target = data_dir / path
        if entry is not None and (not target.is_file() or file_sha256(target) != entry.sha256) \
                and file_sha256(file) == entry.sha256:
            publish(data_dir, path)
            moved.append(path)
        else:
            file.unlink()
            removed.append(file.relative_to(data_dir).as_posix())
    notes = []
    if moved:
        notes.append(f"moved {len(moved)} registered files a killed landing left in staging into the lake: "
                     f"{', '.join(moved[:5])}")
    if removed:
        notes.append(f"removed {len(removed)} unregistered files a killed landing left in staging")
    return notes


# The DuckDB CLI users install (PyPI `duckdb-cli` 1.5) reads storage versions 64-68; the Python
# package writes a newer one unless told. The catalog is written in the version 1.5 reads.
STORAGE_VERSION = "v1.5.0"
READABLE_STORAGE = 68  # the newest storage version number DuckDB 1.5 reads
CONFIG = {"storage_compatibility_version": STORAGE_VERSION}  # a writer's connections


def storage_number(path: Path) -> int | None:
    """The storage version number in a DuckDB file's header, None if it is no DuckDB file."""
    with open(path, "rb") as f:
        header = f.read(20)
    if len(header) < 20 or header[8:12] != b"DUCK":
        return None
    return int.from_bytes(header[12:20], "little")


def downgrade(path: Path, connect: Callable[[], duckdb.DuckDBPyConnection]) -> Path | None:
    """Copy a catalog written in a storage version the DuckDB CLI cannot read into a new file in
    STORAGE_VERSION, keeping the old file beside it (`catalog.duckdb.v<N>.bak`); None when it reads
    already. The views are not copied: every writer rebuilds them. Runs under the write lock."""
    number = storage_number(path) if path.exists() else None
    if number is None or number <= READABLE_STORAGE:
        return None
    fresh = path.with_name(path.name + ".downgrading")
    fresh.unlink(missing_ok=True)
    con = connect()
    try:
        con.execute("CHECKPOINT")
        (old,) = con.execute("SELECT current_database()").fetchone()
        con.execute(f"ATTACH {quote_literal(str(fresh))} AS fresh (STORAGE_VERSION '{STORAGE_VERSION}')")
        tables = con.execute("SELECT table_name, sql FROM duckdb_tables() WHERE database_name = ? "
                             "AND schema_name = 'main'", [old]).fetchall()
        con.execute("USE fresh")
        for name, ddl in tables:
            con.execute(ddl)  # the table's own DDL: keys and constraints stay
            con.execute(f"INSERT INTO fresh.main.{quote_ident(name)} SELECT * FROM "
                        f"{quote_ident(old)}.main.{quote_ident(name)}")
        con.execute(f"USE {quote_ident(old)}")
        con.execute("DETACH fresh")
    finally:
        con.close()
    backup = path.with_name(f"{path.name}.v{number}.bak")
    shutil.copy2(path, backup)
    os.replace(fresh, path)
    return backup
