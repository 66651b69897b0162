"""Stage: land a family's records in the warehouse (the one process that writes the catalog)."""

from __future__ import annotations

from envs.records import Rollout, StepScore, TaskRejection, TaskSpec
from warehouse import Warehouse


def land_batch(data_dir: str, tasks: list[TaskSpec], rejections: list[TaskRejection], rollouts: list[Rollout],
               scores: list[StepScore]) -> dict[str, int]:
    """Returns the number of new rows per table; landing the same records again adds none."""
    counts: dict[str, int] = {}
    with Warehouse(data_dir) as wh:
        for result in (wh.land_tasks(tasks), wh.land_rejections(rejections), wh.land_rollouts(rollouts),
                       wh.land_scores(scores, {r.rollout_id: r.family for r in rollouts})):
            for table, n in result.items():
                counts[table] = counts.get(table, 0) + n
    return counts
