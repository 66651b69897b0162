"""The read-only SQL console (`gymfoundry sql`): what it may run is `statements`' rule, checked by
every read-only `Warehouse.sql`. `render` prints a result.

`query` runs a text as `gymfoundry sql` does, bounded in time and memory: a query past either
bound is cancelled (DuckDB's own interrupt and memory limit) and its connection closed, so the
read lock that blocks every writer is released.
"""

from __future__ import annotations

import csv
import datetime
import decimal
import io
import json
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa

from gymfoundry.warehouse import store


class QueryCancelled(RuntimeError):
    """A console query that ran past its time or memory bound, cancelled."""


DEFAULT_TIMEOUT_S = 300.0


def default_max_memory() -> str:
    """A quarter of this machine's memory: a runaway query leaves the rest usable."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return f"{total // 4 // 2**20}MiB"


def check_size(size: str) -> str:
    """`size` as DuckDB reads a memory limit ("2GB", "512MiB"); ValueError with DuckDB's reason if not."""
    with duckdb.connect() as con:
        try:
            con.execute("SET memory_limit = ?", [size])
        except duckdb.Error as exc:
            raise ValueError(f"--max-memory {size!r} is not a size such as 2GB or 512MiB ({exc})") from None
    return size


def query(data_dir: str | os.PathLike, text: str, params: Sequence[Any] | None = None, *,
          timeout_s: float | None = DEFAULT_TIMEOUT_S, max_memory: str | None = None) -> pa.Table:
    """Run `text` (queries only, see `statements.check_query`) on a data dir's warehouse, read-only. Past
    `timeout_s` seconds, or past `max_memory` (default `default_max_memory()`; DuckDB spills to its
    temp directory up to the same size), the query is cancelled: QueryCancelled, with one line."""
    max_memory = max_memory or default_max_memory()
    with _memory_bound(Path(data_dir).resolve() / store.CATALOG_FILE, max_memory), \
            store.Warehouse(data_dir, read_only=True) as wh:
        try:
            with _time_bound(wh.con, timeout_s):
                return wh.sql(text, params)
        except duckdb.InterruptException:
            raise QueryCancelled(f"the query ran past the console's time limit of {timeout_s:g} s (--timeout) and "
                                 "was cancelled") from None
        except duckdb.OutOfMemoryException:
            raise QueryCancelled(f"the query needed more than the console's memory limit of {max_memory} "
                                 "(--max-memory) and was cancelled") from None


@contextmanager
def _memory_bound(catalog_file: Path, max_memory: str) -> Iterator[None]:
    """A process's read-only connections to one catalog share one DuckDB instance, whose settings the
    Warehouse locks as it opens: the bound is set on that instance first, through a connection held
    open until the Warehouse has its own. An instance another reader of this process already
    confined keeps the bounds it has."""
    if not catalog_file.exists():
        raise FileNotFoundError(f"no warehouse catalog at {catalog_file}")
    con = store._connect(catalog_file, True, store.lock_wait_s())  # a writer holding it: wait as the Warehouse does
    try:
        try:
            con.execute("SET memory_limit = ?", [max_memory])
            con.execute("SET max_temp_directory_size = ?", [max_memory])
        except duckdb.InvalidInputException as exc:
            if "lock" not in str(exc).lower():
                raise
        yield
    finally:
        con.close()


@contextmanager
def _time_bound(con: duckdb.DuckDBPyConnection, timeout_s: float | None) -> Iterator[None]:
    """Interrupt what `con` runs once `timeout_s` seconds have passed (DuckDB then raises InterruptException)."""
    if timeout_s is None:
        yield
        return
    timer = threading.Timer(timeout_s, con.interrupt)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


FORMATS = ("table", "csv", "json")


def render(table: pa.Table, fmt: str = "table", max_rows: int = 20) -> str:
    """A query's result as `gymfoundry sql --format` prints it: `table` (polars' layout, at most
    `max_rows` rows shown, the shape below), `csv` (a header line, then every row; nested values as
    JSON, NULL empty) or `json` (a list of objects, every row; timestamps in ISO 8601)."""
    if fmt == "table":
        with pl.Config(tbl_rows=max_rows, tbl_cols=-1, fmt_str_lengths=80, tbl_hide_dataframe_shape=False):
            return str(pl.from_arrow(table))
    if fmt == "json":
        rows = [json.dumps(row, default=_json_value, ensure_ascii=False) for row in table.to_pylist()]
        return "[\n" + ",\n".join(rows) + "\n]" if rows else "[]"  # one object a line
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(table.column_names)
        for row in table.to_pylist():
            writer.writerow([_csv_value(v) for v in row.values()])
        return out.getvalue().rstrip("\n")
    raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")


def _json_value(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=_json_value, ensure_ascii=False)
    if isinstance(value, (str, int, float)):
        return str(value)
    return str(_json_value(value))
