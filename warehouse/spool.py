"""The spool: batches a writer could not land because another process held the catalog.

A reader holding the catalog (a notebook's connection, a `duckdb` CLI session) blocks every
writer. Rather than fail the run and lose what it collected, every writer (`gymfoundry.tasks.stages.land`: the
factory's landings and run rows, the holdout lock, evaluation, training runs, reverify, scoring)
writes the batch's records here as one JSON file, `<data_dir>/spool/<utc time>-<hash>.json`, and
the next landing lands every spooled batch first, in the order they were spooled, and removes each
once it landed. Ids are content hashes, so a spooled batch that landed before its file was removed
adds nothing when it lands again.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gymfoundry.envs.records import (HoldoutLock, Record, Rollout, Run, StepScore, TaskRejection, TaskSpec, TrainingRun, Verdict,
                          content_hash)

SPOOL_DIR = "spool"
UNLANDABLE_DIR = "unlandable"  # under the spool: batches set aside with their reason
# `Warehouse.land` keyword -> the record it takes; `training_runs` lands through `Warehouse.land_rows`.
RECORDS: dict[str, type[Record]] = {"tasks": TaskSpec, "rejections": TaskRejection, "rollouts": Rollout,
                                    "scores": StepScore, "runs": Run, "outcomes": Verdict,
                                    "holdout_locks": HoldoutLock, "training_runs": TrainingRun}


def save(data_dir: str | os.PathLike, records: dict[str, list[Record]], options: dict[str, Any]) -> Path:
    """Spool a batch: `records` by `Warehouse.land` keyword, `options` the landing's other keywords."""
    payload = {"spooled_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "options": options,
               "records": {k: [r.model_dump(mode="json") for r in v] for k, v in records.items() if v}}
    folder = Path(data_dir) / SPOOL_DIR
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    path = folder / f"{stamp}-{content_hash(payload['records'], 12)}.json"
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(payload) + "\n")
        fh.flush()
        os.fsync(fh.fileno())  # durable before a writer says its batch is safe (serve-env answers on it)
    os.replace(temp, path)  # a spool file is whole or absent
    _fsync_dir(folder)
    return path


def _fsync_dir(folder: Path) -> None:
    """The rename survives a crash of the machine, not only of the process."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def set_aside(path: Path, reason: str) -> Path:
    """Move a spooled batch that cannot be landed (unreadable, or refused by the warehouse in a way the
    gates do not catch) to `spool/unlandable/`, with its reason beside it: kept, out of the way of the
    batches after it."""
    folder = path.parent / UNLANDABLE_DIR
    folder.mkdir(exist_ok=True)
    (folder / f"{path.stem}.reason.txt").write_text(reason + "\n")
    target = folder / path.name
    os.replace(path, target)
    return target


def pending(data_dir: str | os.PathLike) -> list[Path]:
    """Spooled batches, oldest first."""
    folder = Path(data_dir) / SPOOL_DIR
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def load(path: Path) -> tuple[dict[str, list[Record]], dict[str, Any]]:
    """A spooled batch's records (by `Warehouse.land` keyword) and options."""
    payload = json.loads(path.read_text())
    records = {k: [RECORDS[k].model_validate(r) for r in rows] for k, rows in payload["records"].items()}
    return records, payload["options"]
