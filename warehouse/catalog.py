"""The DuckDB catalog: a manifest of registered batch files and one view per table.

A view reads exactly the files in the manifest, so a file in the lake that was never
registered is invisible. Paths are stored relative to the data dir and the views are
rebuilt with absolute paths whenever the warehouse is opened, so a data dir can be moved.
A table with a registered file missing gets a view that fails with a message naming the file
(`DAMAGED`), so the damage stays confined to the queries that touch it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

from envs.records import content_hash
from warehouse.lake import Batch, file_sha256
from warehouse.tables import PARTITION, TABLES, Table
from warehouse.views import create_analysis_views

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


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def base_select(table: Table, files: list[Path]) -> str:
    """The table's logical columns, from its files or, with none yet, typed and empty."""
    if not files:
        columns = ", ".join(f"CAST(NULL AS {c.sql_type}) AS {quote_ident(c.name)}" for c in table.columns)
        return f"SELECT {columns} WHERE false"
    paths = ", ".join(quote_literal(p.as_posix()) for p in files)
    columns = ", ".join(quote_ident(c.name) for c in table.columns)
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


def view_sql(table: Table, files: list[Path], temporary: bool = False, data_dir: Path | None = None) -> str:
    derived = "".join(f", {expression}" for expression in table.derived)
    kind = "TEMP VIEW" if temporary else "VIEW"
    # Checked here because DuckDB reads every footer to bind the view: one bad file would fail the
    # whole catalog's opening (and abort the transaction the view is built in).
    damaged = [f"{f.relative_to(data_dir).as_posix() if data_dir else f} {problem}"
               for f in files for problem in [footer_problem(f)] if problem]
    base = damaged_select(table, damaged) if damaged else base_select(table, files)
    return f"CREATE OR REPLACE {kind} {table.name} AS SELECT *{derived} FROM ({base})"


def footer_problem(file: Path) -> str | None:
    """Why DuckDB could not open the file, or None (the bytes are `warehouse check`'s to verify)."""
    if not file.is_file():
        return "is missing"
    try:
        pq.read_metadata(file)
    except (OSError, ValueError) as exc:
        return f"is unreadable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    return None


def registered_files(con: duckdb.DuckDBPyConnection, data_dir: Path, table: str) -> list[Path]:
    rows = con.execute("SELECT path FROM manifest WHERE table_name = ? ORDER BY landed_at, batch_id",
                       [table]).fetchall()
    return [data_dir / path for (path,) in rows]


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


def has_manifest(con: duckdb.DuckDBPyConnection) -> bool:
    found = con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'main' "
                        "AND table_name = 'manifest'").fetchall()
    return found[0][0] > 0


def rebuild_views(con: duckdb.DuckDBPyConnection, data_dir: Path, tables: list[str] | None = None,
                  temporary: bool = False) -> None:
    manifest = has_manifest(con)
    for name in tables or list(TABLES):
        files = registered_files(con, data_dir, name) if manifest else []
        con.execute(view_sql(TABLES[name], files, temporary, data_dir))
    if tables is None:
        create_analysis_views(con, temporary)


def register(con: duckdb.DuckDBPyConnection, data_dir: Path, batches: list[Batch], landed_at,
             before_commit: Callable[[], None] | None = None) -> None:
    """Register the batches and refresh the affected views, all in one transaction: a crash
    before the commit leaves none of them registered."""
    if not batches:
        return
    landing_id = "l-" + content_hash(sorted(b.batch_id for b in batches) + [str(landed_at)], 20)
    con.execute("BEGIN TRANSACTION")
    try:
        con.executemany(f"INSERT INTO manifest ({', '.join(MANIFEST_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [[b.batch_id, b.table, b.task_family, b.path, b.row_count, landed_at, b.sha256, landing_id]
                         for b in batches])
        rebuild_views(con, data_dir, sorted({b.table for b in batches}))
        if before_commit is not None:
            before_commit()
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
