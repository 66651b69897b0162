"""Stage: rollouts under a run's retry policy.

An episode that ends in a class the policy retries (by default the faults: `env_fault`, any
attempt an environment fault touched or whose environment ran past its clock, whatever its
outcome; `inference_fault`; `grader_fault`, grading past the grader's clock) runs again as the
next attempt, after a backoff, from a clean state (a fresh env, the policy reset with the same
seed), so with a deterministic policy the attempt that meets no fault is exactly the fault-free
episode. Each attempt is its own rollout (the attempt is part of its id) and is kept,
classified, so the run can account for every episode. Model outcomes (a policy out of its own
time or tokens is one: `truncated`) are never retried. After `max_retries` the (task, sample) is
skipped, or the run fails: `RetryExhausted` then carries every rollout collected before it
(with episodes in flight, those that were in flight too). Episodes run concurrently up to the
policy's `max_concurrency` (tasks/rollout/engine.py).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Generator
from typing import Any

from gymfoundry.envs.records import FaultConfig, PolicySpec, RetryPolicy, Rollout, TaskSpec
from gymfoundry.tasks.rollout import progress
from gymfoundry.tasks.rollout.engine import run_concurrently
from gymfoundry.tasks.policies.base import Policy
from gymfoundry.tasks.rollout.episodes import episode, rollout_seed


class RetryExhausted(RuntimeError):
    """The run's retry policy says fail; `rollouts` are those collected up to the failure."""

    def __init__(self, message: str, rollouts: list[Rollout] | None = None):
        super().__init__(message)
        self.rollouts = list(rollouts or [])


def collect_with_retries(tasks: list[TaskSpec], policy: Policy, samples_per_task: int, seed: int,
                         retry: RetryPolicy, faults: FaultConfig | None = None,
                         sleep: Callable[[float], None] = time.sleep,
                         subagent: PolicySpec | None = None) -> list[Rollout]:
    """Every (task, sample)'s attempts, up to the policy's `max_concurrency` episodes in flight
    (tasks/rollout/engine.py), in (task, sample, attempt) order whatever order they finished in."""
    stop = threading.Event()

    def attempts(agent: Policy, job: tuple[TaskSpec, int]) -> Generator[tuple, Any, tuple[list[Rollout], str | None]]:
        """The job's attempts, a play (its episodes are played by the engine's thread: tasks/rollout/engine.py)."""
        task, sample = job
        episode_seed = rollout_seed(seed, task, sample)
        played = []
        for attempt in range(retry.max_retries + 1):
            if attempt:
                sleep(retry.delay_s(attempt))
            rollout = yield from episode(task, agent, episode_seed, attempt, faults, subagent=subagent)
            played.append(rollout)
            if rollout.termination not in retry.retry_on:
                progress.advance(task.family)
                return played, None
        progress.advance(task.family)
        if retry.on_exhausted != "fail":
            return played, None
        stop.set()  # nothing further starts; the episodes in flight end and are kept
        return played, (f"task {task.task_id} sample {sample}: {retry.max_retries + 1} attempts ended in "
                        f"{rollout.termination.value}: {rollout.termination_reason}")

    jobs = [(task, sample) for task in tasks for sample in range(samples_per_task)]
    results = [r for r in run_concurrently(policy, jobs, attempts, stop) if r is not None]
    rollouts = [rollout for played, _ in results for rollout in played]
    failures = [error for _, error in results if error]
    if failures:
        raise RetryExhausted(failures[0], rollouts)
    return rollouts


def run_counts(rollouts: list[Rollout], retry: RetryPolicy) -> dict[str, Any]:
    """What a run report counts: rollouts attempted, by class (in total and per family),
    retries (attempts after the first) and skips ((task, sample)s given up after the last
    retry). The classes add up to the rollouts attempted."""
    last: dict[tuple, Rollout] = {}
    for r in rollouts:
        key = (r.task_id, r.env_id, r.policy_id, r.policy_version, r.seed)
        if key not in last or r.attempt > last[key].attempt:
            last[key] = r
    by_family: dict[str, Counter] = {}
    for r in rollouts:
        by_family.setdefault(r.family, Counter())[r.termination.value] += 1
    return {
        "attempted": len(rollouts),
        "by_class": dict(sorted(Counter(r.termination.value for r in rollouts).items())),
        "by_family": {f: dict(sorted(c.items())) for f, c in sorted(by_family.items())},
        "retries": sum(r.attempt > 0 for r in rollouts),
        "skips": sum(r.termination in retry.retry_on for r in last.values()),
    }
