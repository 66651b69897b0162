"""The DuckDB catalog: a manifest of registered batch files and one view per table.

A view reads exactly the files in the manifest, so a file in the lake that was never
registered is invisible. Paths are stored relative to the data dir and the views are
rebuilt with absolute paths whenever the warehouse is opened, so a data dir can be moved.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb

from warehouse.lake import Batch
from warehouse.tables import PARTITION, TABLES, Table
from warehouse.views import create_analysis_views

MANIFEST_DDL = """
CREATE TABLE IF NOT EXISTS manifest (
    batch_id    VARCHAR PRIMARY KEY,
    table_name  VARCHAR NOT NULL,
    task_family VARCHAR NOT NULL,
    path        VARCHAR NOT NULL,   -- relative to the data dir
    row_count   BIGINT NOT NULL,
    landed_at   TIMESTAMP NOT NULL  -- UTC
)
"""

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


def view_sql(table: Table, files: list[Path], temporary: bool = False) -> str:
    derived = "".join(f", {expression}" for expression in table.derived)
    kind = "TEMP VIEW" if temporary else "VIEW"
    return f"CREATE OR REPLACE {kind} {table.name} AS SELECT *{derived} FROM ({base_select(table, files)})"


def registered_files(con: duckdb.DuckDBPyConnection, data_dir: Path, table: str) -> list[Path]:
    rows = con.execute("SELECT path FROM manifest WHERE table_name = ? ORDER BY landed_at, batch_id",
                       [table]).fetchall()
    return [data_dir / path for (path,) in rows]


def has_manifest(con: duckdb.DuckDBPyConnection) -> bool:
    found = con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'main' "
                        "AND table_name = 'manifest'").fetchall()
    return found[0][0] > 0


def rebuild_views(con: duckdb.DuckDBPyConnection, data_dir: Path, tables: list[str] | None = None,
                  temporary: bool = False) -> None:
    manifest = has_manifest(con)
    for name in tables or list(TABLES):
        files = registered_files(con, data_dir, name) if manifest else []
        con.execute(view_sql(TABLES[name], files, temporary))
    if tables is None:
        create_analysis_views(con, temporary)


def register(con: duckdb.DuckDBPyConnection, data_dir: Path, batches: list[Batch], landed_at,
             before_commit: Callable[[], None] | None = None) -> None:
    """Register the batches and refresh the affected views, all in one transaction: a crash
    before the commit leaves none of them registered."""
    if not batches:
        return
    con.execute("BEGIN TRANSACTION")
    try:
        con.executemany("INSERT INTO manifest VALUES (?, ?, ?, ?, ?, ?)",
                        [[b.batch_id, b.table, b.task_family, b.path, b.row_count, landed_at] for b in batches])
        rebuild_views(con, data_dir, sorted({b.table for b in batches}))
        if before_commit is not None:
            before_commit()
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
