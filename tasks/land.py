"""Stage: land a family's records in the warehouse (the one process that writes the catalog).

Everything of a batch lands in one transaction after the quality gates: a crash leaves none
of it visible, and a batch that fails a gate goes whole to quarantine. When another process
holds the catalog (a reader's connection blocks the writer) for longer than `lock_timeout_s`,
the batch is spooled under `<data_dir>/spool/` instead of lost, and the next landing lands it
first (`warehouse.spool`)."""

from __future__ import annotations

import logging
from typing import Any

from envs.records import Record, Rollout, Run, StepScore, TaskRejection, TaskSpec
from warehouse import CatalogLocked, Landing, Staged, Warehouse, spool, stage

LOCK_TIMEOUT_S = 60.0
log = logging.getLogger("gymfoundry.warehouse")


def land_records(data_dir: str, tasks: list[TaskSpec], rejections: list[TaskRejection], rollouts: list[Rollout],
                 scores: list[StepScore], run_id: str | None = None, flow_run_id: str | None = None,
                 lock_timeout_s: float = LOCK_TIMEOUT_S, staged: Staged | None = None) -> Landing:
    """Land the batch; `run_id` / `flow_run_id` go on its new rollouts. Landing.spooled says where
    the batch waits when the catalog stayed locked. `staged`: what `stage_records` made of these
    same records, registered instead of staging them again (and discarded in any case)."""
    # each new rollout's own outcome also lands in `outcomes`, the first of its verdicts (see tasks/reverify.py)
    return _land(data_dir, {"tasks": tasks, "rejections": rejections, "rollouts": rollouts, "scores": scores},
                 {"rollout_outcomes": True, "run_id": run_id, "flow_run_id": flow_run_id}, lock_timeout_s, staged)


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


def land_run(data_dir: str, run: Run, lock_timeout_s: float = LOCK_TIMEOUT_S) -> dict[str, int]:
    return _land(data_dir, {"runs": [run]}, {}, lock_timeout_s).checked()


def land_spooled(wh: Warehouse) -> list:
    """Land every spooled batch, oldest first, removing each once it landed (or went to quarantine,
    which keeps it)."""
    landed = []
    for path in spool.pending(wh.data_dir):
        records, options = spool.load(path)
        landing = wh.land(**records, **options)
        if landing.ok:
            log.warning("landed the batch spooled at %s: %s", path.name, landing.counts)
        else:
            log.error("the batch spooled at %s failed the quality gates and went to %s", path.name, landing.quarantine)
        path.unlink()
        landed.append(path)
    return landed


def _land(data_dir: str, records: dict[str, list[Record]], options: dict[str, Any], lock_timeout_s: float,
          staged: Staged | None = None) -> Landing:
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
            landing = wh.land_staged(staged) if staged is not None else wh.land(**records, **options)
            landing.drained = drained
            return landing
    finally:
        if staged is not None:
            staged.discard()
