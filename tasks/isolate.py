"""Stage 3: isolation. Dedupe by content hash, assign splits by `template_id` group so
near-duplicates never straddle train and test, and scan visible text for hidden values."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from envs.records import Rollout, Split, TaskRejection, TaskSpec
from envs.registry import make

SPLIT_FRACTIONS = {Split.train: 0.8, Split.val: 0.1, Split.test: 0.1}


def split_for(template_id: str, fractions: dict[Split, float] = SPLIT_FRACTIONS) -> Split:
    """Deterministic split of a template group (uniform hash bucket)."""
    bucket = int(hashlib.sha256(template_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    edge = 0.0
    for split, fraction in fractions.items():
        edge += fraction
        if bucket <= edge:
            return split
    return list(fractions)[-1]


def hidden_values(task: TaskSpec) -> list[str]:
    """Literal values that must never be visible: the task's secrets and the reference
    trajectory as a whole."""
    reference = json.dumps([c.model_dump(mode="json") for c in task.hidden.reference], sort_keys=True)
    return [s for s in task.hidden.secrets if s] + [reference]


def find_leaks(task: TaskSpec, texts: Iterable[str]) -> list[str]:
    values = hidden_values(task)
    return sorted({v[:60] for text in texts for v in values if v in text})


def isolate_tasks(tasks: list[TaskSpec]) -> tuple[list[TaskSpec], list[TaskRejection]]:
    kept: dict[str, TaskSpec] = {}
    rejected: list[TaskRejection] = []
    for task in tasks:
        if task.task_id in kept:
            rejected.append(TaskRejection(task_id=task.task_id, family=task.family, stage="isolate",
                                          reason="duplicate content hash"))
            continue
        leaks = find_leaks(task, [_first_observation(task)])
        if leaks:
            rejected.append(TaskRejection(task_id=task.task_id, family=task.family, stage="isolate",
                                          reason=f"hidden value visible in the goal: {leaks}"))
            continue
        kept[task.task_id] = task.model_copy(update={"split": split_for(task.template_id)})
    return list(kept.values()), rejected


def _first_observation(task: TaskSpec) -> str:
    env = make(task.env_id, verified=False)
    try:
        return env.reset(task=task).observation
    finally:
        env.close()


class LeakError(RuntimeError):
    pass


def assert_no_leaks(rollouts: list[Rollout], tasks: dict[str, TaskSpec]) -> None:
    """Every observation the agent saw is scanned; a leak is an environment bug, so it stops the run."""
    for rollout in rollouts:
        texts = [s.observation for s in rollout.steps] + [s.result for s in rollout.steps]
        leaks = find_leaks(tasks[rollout.task_id], texts)
        if leaks:
            raise LeakError(f"rollout {rollout.rollout_id} of task {rollout.task_id} shows hidden values {leaks}")
