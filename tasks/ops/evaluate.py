"""Stage: evaluate a policy on held-out tasks of a family (never the train split).

The rollouts are ordinary rollouts (same runtime, verifier and failure classes as the
factory); the success rate counts verified successes over the model outcomes: an episode an
environment fault or bug touched (or one the policy endpoint, the grader's clock or the verifier
failed) says nothing about the model and is counted apart, as `excluded`, by class. A policy
that runs out of its own time or tokens is `truncated`: a model outcome, counted. No figure is
computed over zero model outcomes: it is None, never 0.0 or 1.0."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Generator
from math import comb
from typing import Any

from gymfoundry.envs.family import family as family_of
from gymfoundry.envs.records import MODEL_OUTCOMES, Budget, Rollout, TaskSpec, rollout_identity
from gymfoundry.tasks.rollout.engine import run_concurrently
from gymfoundry.tasks.policies.base import Policy
from gymfoundry.tasks.rollout.episodes import episode, policy_params, rollout_seed
from gymfoundry.warehouse import Warehouse

HELDOUT_SPLITS = ("test", "val")
SLACK_STEPS = 4  # turns beyond the reference's length an evaluated episode may take


def heldout_tasks(data_dir: str, family: str, splits: tuple[str, ...] = HELDOUT_SPLITS, limit: int | None = None,
                  levels: tuple[int, ...] | None = None) -> list[TaskSpec]:
    """Held-out tasks of `family` from the warehouse, in a stable order (by task id)."""
    split_list = ", ".join(f"'{s}'" for s in splits)
    where = f"task_family = ? and split in ({split_list})"
    with Warehouse(data_dir, read_only=True) as wh:
        tasks = wh.load_tasks(where, [family])
    if levels:
        tasks = [t for t in tasks if t.difficulty.level in levels]
    return tasks[:limit] if limit else tasks


def evaluation_budget(task: TaskSpec, slack_steps: int | None) -> Budget | None:
    """The runtime limits of at most `len(reference) + slack_steps` turns (never more than the
    task's budget): a stuck model cannot spend the whole budget, which on a CPU takes minutes.
    The task, its id and everything the agent sees stay the same (`run_episode(limits=...)`)."""
    if slack_steps is None:
        return None
    cap = min(task.budget.max_steps, len(task.hidden.reference) + slack_steps)
    return task.budget.model_copy(update={"max_steps": cap, "max_tool_calls": min(task.budget.max_tool_calls, cap)})


def expected_rollout_id(task: TaskSpec, policy: Policy, seed: int, sample: int = 0,
                        slack_steps: int | None = SLACK_STEPS) -> str:
    """The id `evaluate_policy` gives this episode (its first attempt, no faults injected)."""
    return rollout_identity(task.task_id, task.env_id, family_of(task.env_id).env_version, policy.policy_id, policy.version,
                            rollout_seed(seed, task, sample), 0, policy_params(policy),
                            limits=evaluation_budget(task, slack_steps))


def evaluate_policy(tasks: list[TaskSpec], policy: Policy, seed: int = 0, samples_per_task: int = 1,
                    slack_steps: int | None = SLACK_STEPS) -> list[Rollout]:
    """Every (task, sample)'s episode, up to the policy's `max_concurrency` in flight (tasks/rollout/engine.py;
    a serial policy's in one thread, watched)."""
    def play(agent: Policy, job: tuple[TaskSpec, int]) -> Generator[tuple, Any, Rollout]:
        task, k = job
        return episode(task, agent, rollout_seed(seed, task, k), limits=evaluation_budget(task, slack_steps))

    return run_concurrently(policy, [(task, k) for task in tasks for k in range(samples_per_task)], play)


def pass_at_k(rollouts: list[Rollout]) -> dict[str, dict[int, dict[str, float | int]]]:
    """Per family, for k = 1..n: the unbiased pass@k = 1 - C(n-c, k)/C(n, k) and tau-bench's
    pass^k = C(c, k)/C(n, k), n = a task's model outcomes (one per rollout), c = its successes,
    averaged over the tasks with at least k of them (as the `pass_at_k` warehouse view does)."""
    counts: dict[tuple[str, str], list[int]] = {}
    seen: set[str] = set()
    for r in rollouts:
        if r.termination in MODEL_OUTCOMES and r.rollout_id not in seen:
            seen.add(r.rollout_id)
            nc = counts.setdefault((r.family, r.task_id), [0, 0])
            nc[0] += 1
            nc[1] += bool(r.success)
    out: dict[str, dict[int, dict[str, float | int]]] = {}
    for family in sorted({f for f, _ in counts}):
        per_task = [nc for (f, _), nc in counts.items() if f == family]
        out[family] = {}
        for k in range(1, max(n for n, _ in per_task) + 1):
            with_k = [(n, c) for n, c in per_task if n >= k]
            at = [(comb(n, k) - comb(n - c, k)) / comb(n, k) for n, c in with_k]
            hat = [comb(c, k) / comb(n, k) for n, c in with_k]
            out[family][k] = {"pass@k": sum(at) / len(at), "pass^k": sum(hat) / len(hat), "tasks": len(with_k)}
    return out


def summarize(rollouts: list[Rollout], tasks: list[TaskSpec]) -> dict[str, Any]:
    """Success rate over the model outcomes (`model_outcomes` of them), overall and by difficulty
    level; pass@k and pass^k per family (`pass_at_k`); the episodes left out (`excluded`, and
    `excluded_by_class`: why) and the count of each termination. A rate over no model outcome is
    None (the `success_rate` of an evaluation whose every episode was excluded), as is a mean over
    no episode or step."""
    level = {t.task_id: t.difficulty.level for t in tasks}
    by_level: dict[int, list[bool]] = defaultdict(list)
    measured = [r for r in rollouts if r.termination in MODEL_OUTCOMES]
    for r in measured:
        by_level[level[r.task_id]].append(r.success)
    n, steps = len(rollouts), sum(len(r.steps) for r in rollouts)
    excluded = Counter(r.termination.value for r in rollouts if r.termination not in MODEL_OUTCOMES)
    return {
        "episodes": n,
        "model_outcomes": len(measured),
        "excluded": n - len(measured),
        "excluded_by_class": dict(sorted(excluded.items())),
        "success_rate": round(sum(r.success for r in measured) / len(measured), 4) if measured else None,
        "by_level": {lvl: round(sum(v) / len(v), 4) for lvl, v in sorted(by_level.items())},
        "pass_at_k": pass_at_k(rollouts),
        "terminations": dict(Counter(r.termination.value for r in rollouts)),
        "mean_steps": round(steps / n, 2) if n else None,
        "well_formed_calls": round(sum(s.tool_call is not None for r in rollouts for s in r.steps) / steps, 4)
        if steps else None,
    }
