"""Stage 2: validity. Replaying the reference trajectory through the real env must succeed
under the outcome verifier, and the verifier's precondition must hold before any action
(e.g. the coding family's hidden tests must fail on the initial snapshot); a task that
fails either is rejected with the reason."""

from __future__ import annotations

from envs.records import TaskRejection, TaskSpec
from envs.registry import make, verifier_for


def check_reference(task: TaskSpec) -> str | None:
    """None when the reference proves the task solvable, else why not."""
    reference = task.hidden.reference
    if len(reference) > task.budget.max_steps:
        return f"reference needs {len(reference)} steps, budget allows {task.budget.max_steps}"
    outside = sorted({c.name for c in reference} - set(task.allowed_tools))
    if outside:
        return f"reference uses tools the task does not allow: {outside}"
    precondition = getattr(verifier_for(task.env_id), "precondition", None)
    reason = precondition(task) if precondition else None
    if reason:
        return reason
    env = make(task.env_id)
    try:
        env.reset(task=task)
        ts = None
        for i, call in enumerate(reference):
            ts = env.step(call)
            if ts.info.get("error"):
                return f"reference step {i} ({call.name}) failed: {ts.info['error']['message']}"
            if ts.done and i < len(reference) - 1:
                return f"episode ended at reference step {i} of {len(reference)}"
        if ts is None or not ts.terminated:
            return "reference trajectory does not end the episode"
        outcome = ts.info.get("outcome") or {}
        if not outcome.get("success"):
            return f"reference fails its verifier: {'; '.join(outcome.get('reasons', [])) or 'no reason given'}"
        return None
    finally:
        env.close()


def validate_tasks(tasks: list[TaskSpec]) -> tuple[list[TaskSpec], list[TaskRejection]]:
    valid, rejected = [], []
    for task in tasks:
        reason = check_reference(task)
        if reason is None:
            valid.append(task)
        else:
            rejected.append(TaskRejection(task_id=task.task_id, family=task.family, stage="validate", reason=reason))
    return valid, rejected
