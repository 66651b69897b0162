"""The one place a `Rollout` is built from an episode (tasks/rollout/episodes.py, the harness hub):
the task's identity, its family's env version, the class with its reason (redacted, capped) and
the cost counted from the steps."""

from __future__ import annotations

import time
from typing import Any

from gymfoundry.envs.family import family
from gymfoundry.envs.records import Cost, Rollout, Step, TaskSpec, Termination
from gymfoundry.envs.secrets import redact

REASON_CHARS = 2000  # a stored termination reason's length at most


def build_rollout(task: TaskSpec, steps: list[Step], termination: Termination, reason: str, *, policy_id: str,
                  policy_version: str, seed: int, started: float | None = None, cost: Cost | None = None,
                  env_version: str | None = None, **fields: Any) -> Rollout:
    """`task`'s rollout of `steps`, classed `termination` for `reason`. `cost`: counted from the
    steps (with the wall time since `started`, a `time.perf_counter()`, where given) unless given.
    `env_version`: the task's family's unless given. `fields`: the rest of the Rollout's fields."""
    if cost is None:
        cost = Cost(steps=len(steps), tool_calls=sum(s.tool_call is not None for s in steps),
                    tokens=sum(len(s.token_ids or []) for s in steps),
                    **({} if started is None else {"wall_time_s": round(time.perf_counter() - started, 6)}))
    return Rollout(task_id=task.task_id, family=task.family, env_id=task.env_id,
                   env_version=env_version if env_version is not None else family(task.env_id).env_version,
                   policy_id=policy_id, policy_version=policy_version, seed=seed, steps=steps,
                   termination=termination, termination_reason=redact(reason)[:REASON_CHARS], cost=cost, **fields)
