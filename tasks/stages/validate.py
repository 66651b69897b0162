"""Stage 2: validity. Replaying the reference trajectory through the real env must succeed
under the outcome verifier, and the verifier's precondition must hold before any action
(e.g. the coding family's hidden tests must fail on the initial snapshot); a task that
fails either is rejected with the reason.

An environment that fails while checking (a sandbox that cannot start, an environment fault
or bug during the replay, a simulated person's endpoint answering 500) says nothing about the
task: it is never recorded as a rejection. `validate_tasks` checks the task again from a fresh
env under the run's retry policy, as rollouts retry their faults (`RetryPolicy`: backoff, retries);
a fault that outlasts the retries raises `ReplayEnvFault`, so the run stops with the
environment's problem named. The failure is recognised by where it happened — an `EnvFault` raised (the
sandbox's `SandboxError`, a verifier's precondition that could not run), a step the env rolled
back (`env_fault`, `env_bug`), or an outcome with a failed `env_fault` check — never by the
text of a reason."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gymfoundry.envs.errors import EnvFault, rolled_back
from gymfoundry.envs.records import RetryPolicy, TaskRejection, TaskSpec, Termination
from gymfoundry.envs.family import family


class ReplayEnvFault(EnvFault):
    """The reference replay could not run because the environment failed: not the task's fault."""

    def __init__(self, task: TaskSpec, problem: str):
        self.task_id, self.family, self.problem = task.task_id, task.family, problem
        super().__init__(f"cannot validate {task.family} task {task.task_id}: the environment failed, not the "
                         f"task ({problem}); fix the environment (for coding: a working sandbox, see "
                         f"`envs.sandbox.backend_status()`) and run again")


def check_reference(task: TaskSpec) -> str | None:
    """None when the reference proves the task solvable, else why not. Raises ReplayEnvFault
    when the environment failed during the check."""
    try:
        return _replay(task)
    except ReplayEnvFault:
        raise
    except EnvFault as exc:
        raise ReplayEnvFault(task, f"{type(exc).__name__}: {exc}") from exc


def _replay(task: TaskSpec) -> str | None:
    reference = task.hidden.reference
    if len(reference) > task.budget.max_steps:
        return f"reference needs {len(reference)} steps, budget allows {task.budget.max_steps}"
    outside = sorted({c.name for c in reference} - set(task.allowed_tools))
    if outside:
        return f"reference uses tools the task does not allow: {outside}"
    precondition = getattr(family(task.env_id).outcome_verifier, "precondition", None)
    reason = precondition(task) if precondition else None
    if reason:
        return reason
    env = family(task.env_id).make()
    try:
        env.reset(task=task)
        ts = None
        for i, call in enumerate(reference):
            ts = env.step(call)
            error = ts.error or {}
            if rolled_back(error.get("kind")):
                raise ReplayEnvFault(task, f"reference step {i} ({call.name}): {error['kind']}: {error.get('message')}")
            if error:
                return f"reference step {i} ({call.name}) failed: {error['message']}"
            if ts.done and i < len(reference) - 1:
                return f"episode ended at reference step {i} of {len(reference)}"
        if ts is None or not ts.terminated:
            return "reference trajectory does not end the episode"
        end = ts.end
        if end.verifier_error is not None:  # the grader crashed: nothing learnt about the task
            raise ReplayEnvFault(task, f"the outcome verifier raised {end.verifier_error}")
        outcome = end.outcome or {}
        fault = (outcome.get("checks") or {}).get("env_fault")
        if fault and not fault.get("passed", True):
            raise ReplayEnvFault(task, f"grading: {'; '.join(fault.get('reasons', [])) or 'env fault'}")
        if not outcome.get("success"):
            return f"reference fails its verifier: {'; '.join(outcome.get('reasons', [])) or 'no reason given'}"
        return None
    finally:
        env.close()


log = logging.getLogger("gymfoundry.validate")


def validate_tasks(tasks: list[TaskSpec], retry: RetryPolicy | None = None,
                   sleep: Callable[[float], None] = time.sleep) -> tuple[list[TaskSpec], list[TaskRejection]]:
    """(valid, rejected). An environment fault is retried under `retry` (default `RetryPolicy()`) where it
    retries environment or grader faults; past its retries, ReplayEnvFault is raised, landing nothing."""
    retry = retry or RetryPolicy()
    valid, rejected = [], []
    for task in tasks:
        reason = _checked_with_retries(task, retry, sleep)
        if reason is None:
            valid.append(task)
        else:
            rejected.append(TaskRejection(task_id=task.task_id, family=task.family, stage="validate", reason=reason))
    return valid, rejected


def _checked_with_retries(task: TaskSpec, retry: RetryPolicy, sleep: Callable[[float], None]) -> str | None:
    retries = retry.max_retries if {Termination.env_fault, Termination.grader_fault} & set(retry.retry_on) else 0
    attempt = 0
    while True:
        try:
            return check_reference(task)  # a fresh env each time: nothing of the faulted check is kept
        except ReplayEnvFault as exc:
            if attempt == retries:
                raise
            attempt += 1
            log.warning("%s; checking it again (retry %d of %d)", exc.problem, attempt, retries)
            sleep(retry.delay_s(attempt))
