"""Stage: land a family's records in the warehouse (the one process that writes the catalog).

Everything of a batch lands in one transaction after the quality gates: a crash leaves none
of it visible, and a batch that fails a gate goes whole to quarantine."""

from __future__ import annotations

from envs.records import Rollout, Run, StepScore, TaskRejection, TaskSpec
from warehouse import Landing, Warehouse


def land_records(data_dir: str, tasks: list[TaskSpec], rejections: list[TaskRejection], rollouts: list[Rollout],
                 scores: list[StepScore]) -> Landing:
    with Warehouse(data_dir) as wh:
        # each new rollout's own outcome also lands in `outcomes`, the first of its verdicts (see tasks/reverify.py)
        return wh.land(tasks=tasks, rejections=rejections, rollouts=rollouts, scores=scores, rollout_outcomes=True)


def land_batch(data_dir: str, tasks: list[TaskSpec], rejections: list[TaskRejection], rollouts: list[Rollout],
               scores: list[StepScore]) -> dict[str, int]:
    """The number of new rows per table; landing the same records again adds none. Raises
    QuarantinedBatch when the batch fails the gates."""
    return land_records(data_dir, tasks, rejections, rollouts, scores).checked()


def land_run(data_dir: str, run: Run) -> dict[str, int]:
    with Warehouse(data_dir) as wh:
        return wh.land(runs=[run]).checked()
