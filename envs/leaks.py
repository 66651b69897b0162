"""The hidden-value rule, one owner for every stage that scans visible text: what a task hides
(its secrets, its reference trajectory as a whole) must never appear in anything the agent or
a dataset sees. Pure functions of the task, so the conformance checker (envs.check) and the
isolation stage (tasks.stages.isolate) apply the same rule."""

from __future__ import annotations

import json
from collections.abc import Iterable

from gymfoundry.envs.records import TaskSpec


def hidden_values(task: TaskSpec) -> list[str]:
    """Literal values that must never be visible: the task's secrets and the reference
    trajectory as a whole."""
    reference = json.dumps([c.model_dump(mode="json") for c in task.hidden.reference], sort_keys=True)
    return [s for s in task.hidden.secrets if s] + [reference]


def find_leaks(task: TaskSpec, texts: Iterable[str]) -> list[str]:
    """The hidden values of `task` (first 60 characters each) that occur in any of `texts`."""
    values = hidden_values(task)
    return sorted({v[:60] for text in texts for v in values if v in text})
