"""The Parquet lake: immutable batch files under
`<data_dir>/lake/<table>/task_family=<family>/<batch_id>.parquet` (or `lake/<table>/<batch_id>.parquet`
for a table that is not partitioned).

A batch is written to the same path under `<data_dir>/staging/` and moved into the lake only
once the catalog registered it (see catalog.register), so a reader that globs the lake's folders
directly (`read_parquet('lake/rollouts/**/*.parquet')`) never counts a batch a killed run left
unregistered. Only the catalog's manifest makes a file visible to the views.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gymfoundry.envs import records
from gymfoundry.envs.records import content_hash
from gymfoundry.warehouse.tables import PARTITION, Table

# Family names become directory names and hive partition values: the records' rule (a family's
# name, envs/records.py), which is also plain enough for a path.
FAMILY_NAME = re.compile(records.FAMILY_NAME)
LAKE_DIR = "lake"
STAGING_DIR = "staging"  # mirrors the lake's layout: `staging/<table>/task_family=<family>/<batch>.parquet`
BATCH_ID = re.compile(r"b-[0-9a-f]{24}")
TEMP_SUFFIX = ".tmp"  # `.<batch>.<pid>.tmp`: a writer killed before its rename leaves one behind
READ_ONLY_MODE = 0o444


@dataclass(frozen=True)
class Batch:
    batch_id: str
    table: str
    task_family: str  # "" for a table that is not partitioned
    path: str  # in the lake, relative to the data dir, with forward slashes (staged under staging_path(path))
    row_count: int
    sha256: str  # of the file's bytes, as written


def batch_id(table: Table, family: str, keys: pa.Table) -> str:
    """Content hash of the rows' keys (the key columns, in any row order): the same new rows always
    make the same file name, so a file written by a run that crashed before registering is simply
    overwritten on re-run. Hashed from the sorted columns' Arrow buffers, no Python value per row."""
    digest = hashlib.sha256(content_hash([table.name, family, list(keys.column_names), keys.num_rows]).encode())
    ordered = keys.sort_by([(name, "ascending") for name in keys.column_names])
    for column in ordered.columns:
        text = pc.cast(column, pa.large_string()).combine_chunks()
        nulls = pc.indices_nonzero(pc.is_null(text)).to_pylist() if text.null_count else []
        # each part with its length first: no two key sets make the same stream
        for part in (json.dumps(nulls).encode(), text.buffers()[1] or b"", text.buffers()[2] or b""):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)  # the nulls, the offsets (from 0: a new array), the characters
    return "b-" + digest.hexdigest()[:24]


def lake_file(table: Table, family: str, bid: str) -> str:
    """Where a batch lives in the lake, relative to the data dir."""
    if table.partitioned:
        check_family(family)
        return f"{LAKE_DIR}/{table.name}/{PARTITION}={family}/{bid}.parquet"
    if family:
        raise ValueError(f"table {table.name} is not partitioned by family")
    return f"{LAKE_DIR}/{table.name}/{bid}.parquet"


def check_family(family: str) -> None:
    if not FAMILY_NAME.match(family):
        raise ValueError(f"task family {family!r} is not a plain name ({FAMILY_NAME.pattern})")


def write_batch(data_dir: Path, table: Table, family: str, rows: list[dict[str, Any]]) -> Batch:
    """Write row dicts of one family as one Parquet file into staging; see `write_arrow`."""
    file_rows = [{k: v for k, v in row.items() if k != PARTITION} for row in rows]
    return write_arrow(data_dir, table, family, pa.Table.from_pylist(file_rows, schema=table.file_schema))


def write_arrow(data_dir: Path, table: Table, family: str, data: pa.Table) -> Batch:
    """Write the rows of one family (the table's file columns) as one Parquet file into staging:
    a temp name, then an atomic rename."""
    if table.partitioned:
        check_family(family)
    data = data.select(table.file_schema.names)
    bid = batch_id(table, family, data.select(list(table.key)))
    relative = lake_file(table, family, bid)
    target = data_dir / staging_path(relative)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{bid}.{os.getpid()}{TEMP_SUFFIX}")
    pq.write_table(data, temp)
    digest = file_sha256(temp)
    make_read_only(temp)
    os.replace(temp, target)  # replaces a read-only leftover of a killed run too (the directory is writable)
    return Batch(bid, table.name, family, relative, data.num_rows, digest)


def write_batches(data_dir: Path, tables: dict[Table, pa.Table], threads: int | None = None) -> list[Batch]:
    """Write each table's rows (logical columns) as one file per family, the files in parallel:
    Parquet encoding and hashing release the GIL, so the writes share the machine's cores."""
    parts = []
    for table, data in tables.items():
        if not table.partitioned:
            parts.append((table, "", data))
            continue
        families = data[PARTITION].unique().to_pylist()
        for family in families:
            check_family(family)  # before any file is written
        for family in sorted(families):
            parts.append((table, family, data.filter(pc.equal(data[PARTITION], family))))
    if len(parts) <= 1:
        return [write_arrow(data_dir, *part) for part in parts]
    with ThreadPoolExecutor(threads or min(len(parts), os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda part: write_arrow(data_dir, *part), parts))


def staging_path(path: str) -> str:
    """Where the lake file `path` (relative to the data dir) is staged."""
    return STAGING_DIR + path.removeprefix(LAKE_DIR)


def lake_path(staged: str) -> str:
    return LAKE_DIR + staged.removeprefix(STAGING_DIR)


def publish(data_dir: Path, path: str) -> None:
    """Move a registered batch from staging to its place in the lake (nothing staged: done already)."""
    source, target = data_dir / staging_path(path), data_dir / path
    if not source.is_file():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(source, target)
    except OSError:  # a lake folder on another filesystem: copy, then rename within it
        temp = target.with_name(f".{target.stem}.{os.getpid()}{TEMP_SUFFIX}")
        shutil.copyfile(source, temp)
        make_read_only(temp)
        os.replace(temp, target)
        source.unlink()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def make_read_only(path: Path) -> None:
    """Defence in depth for immutable batches: a stray writer gets EACCES (not root, who ignores it)."""
    try:
        os.chmod(path, READ_ONLY_MODE)
    except OSError:
        pass  # a filesystem without modes (some network mounts): the checksum still tells
