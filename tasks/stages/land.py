"""Stage: land a family's records in the warehouse (the one process that writes the catalog).

Everything of a batch lands in one transaction after the quality gates: a crash leaves none
of it visible, and a batch that fails a gate goes whole to quarantine. `land_or_spool` is the
one rule of every writer (the factory's landings and run rows, the holdout lock, evaluation,
training runs, reverify, scoring): when another process holds the catalog (a reader's
connection blocks the writer), wait for it (`lock_timeout_s`, default `warehouse.store.lock_wait_s()`,
logging "waiting for <program> (PID n)"), then spool the batch under `<data_dir>/spool/` instead
of losing it; the next landing of any writer lands it first (`gymfoundry.warehouse.spool`)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb

from gymfoundry.envs.records import Record, Rollout, Run, StepScore, TaskRejection, TaskSpec
from gymfoundry.warehouse import TABLES, CatalogLocked, Landing, Staged, Warehouse, spool, stage

log = logging.getLogger("gymfoundry.warehouse")


def land_records(data_dir: str, tasks: list[TaskSpec], rejections: list[TaskRejection], rollouts: list[Rollout],
                 scores: list[StepScore], run_id: str | None = None, flow_run_id: str | None = None,
                 lock_timeout_s: float | None = None, staged: Staged | None = None) -> Landing:
    """Land the batch; `run_id` / `flow_run_id` go on its new rollouts. Landing.spooled says where
    the batch waits when the catalog stayed locked. `staged`: what `stage_records` made of these
    same records, registered instead of staging them again (and discarded in any case)."""
    # each new rollout's own outcome also lands in `outcomes`, the first of its verdicts (see tasks/ops/reverify.py)
    return land_or_spool(data_dir, {"tasks": tasks, "rejections": rejections, "rollouts": rollouts, "scores": scores},
                         {"rollout_outcomes": True, "run_id": run_id, "flow_run_id": flow_run_id}, lock_timeout_s,
                         staged)


def stage_records(data_dir: str, tasks: list[TaskSpec], rejections: list[TaskRejection], rollouts: list[Rollout],
                  scores: list[StepScore], run_id: str | None = None, flow_run_id: str | None = None) -> Staged:
    """The costly part of `land_records` (Arrow rows, content ids, quality gates, Parquet files
    under `<data_dir>/incoming/`) with no catalog and nothing visible: it may overlap other work,
    and `land_records(..., staged=...)` later registers it. The scores' rollouts must be in the batch."""
    return stage(data_dir, tasks=tasks, rejections=rejections, rollouts=rollouts, scores=scores,
                 rollout_outcomes=True, run_id=run_id, flow_run_id=flow_run_id)


def land_batch(data_dir: str, tasks: list[TaskSpec], rejections: list[TaskRejection], rollouts: list[Rollout],
               scores: list[StepScore]) -> dict[str, int]:
    """The number of new rows per table; landing the same records again adds none. Raises
    QuarantinedBatch when the batch fails the gates."""
    return land_records(data_dir, tasks, rejections, rollouts, scores).checked()


def land_run(data_dir: str, run: Run, lock_timeout_s: float | None = None,
             spooled: Sequence[Path] = ()) -> dict[str, int]:
    """Land a run's row. `spooled`: the run's own batches that went to the spool; the row then
    waits in the spool behind them, and the landing that lands them adds what they landed to the
    row's `landed` (a row lands once: its counts must be whole when it does)."""
    waiting = {p.name for p in spool.pending(data_dir)} & {Path(p).name for p in spooled}
    if waiting:
        path = spool.save(data_dir, {"runs": [run]}, {LANDED_FROM: sorted(waiting)})
        log.warning("run %s waits in the spool (%s) behind its spooled batches", run.run_id, path.name)
        return {}
    return land_or_spool(data_dir, {"runs": [run]}, {}, lock_timeout_s).checked()


# What a spooled batch's own content raises (unreadable JSON, records that no longer validate, values
# DuckDB refuses); a held lock or a full disk is not among them: such a batch stays spooled.
_UNLANDABLE = (ValueError, KeyError, TypeError, ArithmeticError, duckdb.ConversionException,
               duckdb.InvalidInputException, duckdb.ConstraintException)
LANDED_FROM = "landed_from"  # a spooled run row's option: the spool files whose counts fill its `landed`


def land_spooled(wh: Warehouse) -> list:
    """Land every spooled batch, oldest first, removing each once it landed (or went to quarantine,
    which keeps it); a batch that cannot be landed is set aside (`land_spool_file`)."""
    landed, counts, aside = [], {}, {}
    for path in spool.pending(wh.data_dir):
        landing = land_spool_file(wh, path, counts, aside)
        if landing is not None:
            counts[path.name] = landing.counts
            landed.append(path)
    return landed


def land_spool_file(wh: Warehouse, path: Path, counts: dict[str, dict[str, int]] | None = None,
                    aside: dict[str, Path] | None = None) -> Landing | None:
    """Land one spooled batch and remove its file (a batch that fails the gates goes to quarantine,
    which keeps it). A batch that cannot be landed for its own content (unreadable, invalid, values
    DuckDB refuses: never a held lock or a full disk, which raise and leave it spooled) is set aside
    with its reason, recorded in `aside`, and None returned: the batches after it still land. A run
    row waiting behind spooled batches gets their `counts`, and names in `quarantined` any that
    was set aside."""
    counts = {} if counts is None else counts
    aside = {} if aside is None else aside
    try:
        records, options = spool.load(path)
        waited_for = options.pop(LANDED_FROM, None)
        if waited_for:
            records["runs"] = [r.model_copy(update={
                "landed": _added(r.landed, *(counts.get(n, {}) for n in waited_for)),
                "quarantined": r.quarantined + [str(aside[n]) for n in waited_for if n in aside]})
                for r in records["runs"]]
        landing = _land_into(wh, records, options)
    except _UNLANDABLE as exc:  # this file's own fault (not a lock or a disk): the rest still lands
        aside[path.name] = spool.set_aside(path, f"{type(exc).__name__}: {exc}")
        log.error("the batch spooled at %s could not be landed (%s: %s); it is kept at %s", path.name,
                  type(exc).__name__, str(exc)[:300], aside[path.name])
        return None
    if landing.ok:
        log.warning("landed the batch spooled at %s: %s", path.name, landing.counts)
    else:
        log.error("the batch spooled at %s failed the quality gates and went to %s", path.name, landing.quarantine)
    path.unlink()
    return landing


def _added(*counts: dict[str, int]) -> dict[str, int]:
    total: Counter = Counter()
    for c in counts:
        total.update(c)
    return dict(total)


def _land_into(wh: Warehouse, records: dict[str, list[Record]], options: dict[str, Any]) -> Landing:
    """`Warehouse.land` of a batch by its keywords; training runs (a batch of their own) by their rows."""
    if "training_runs" in records:
        return wh.land_rows({"training_runs": [TABLES["training_runs"].row(r) for r in records["training_runs"]]})
    return wh.land(**records, **options)


def land_or_spool(data_dir: str, records: dict[str, list[Record]], options: dict[str, Any] | None = None,
                  lock_timeout_s: float | None = None, staged: Staged | None = None) -> Landing:
    """Land `records` (by `Warehouse.land` keyword, or `training_runs` alone) with `options` (its other
    keywords, JSON-able) after every spooled batch; when the catalog stays locked past
    `lock_timeout_s` (None: `lock_wait_s()`), spool them and return a Landing whose `spooled` says
    where they wait. `staged`: these same records as `stage_records` made them (registered instead,
    and discarded in any case)."""
    options = options or {}
    try:
        try:
            wh = Warehouse(data_dir, lock_timeout_s=lock_timeout_s)
        except CatalogLocked as exc:
            path = spool.save(data_dir, records, options)
            log.error("could not land: %s. The batch (%s) is spooled at %s; the next landing lands it", exc,
                      ", ".join(f"{len(v)} {k}" for k, v in records.items()), path)
            return Landing({}, spooled=path)
        with wh:
            drained = land_spooled(wh)
            landing = wh.land_staged(staged) if staged is not None else _land_into(wh, records, options)
            landing.drained = drained
            return landing
    finally:
        if staged is not None:
            staged.discard()
