"""Held-out evaluation: faults stay out of its success rate, and its reuse of landed rollouts
finds exactly the episodes it would play (the step cap and the policy's knobs included)."""

from __future__ import annotations

from gymfoundry.envs.records import Rollout, Termination
from gymfoundry.tasks.ops.evaluate import evaluate_policy, expected_rollout_id, summarize
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.policies.registry import make_policy


def test_heldout_success_counts_model_outcomes_only():
    tasks = generate_tasks("inventory", 2, seed=1)
    ends = [Termination.success, Termination.failure, Termination.env_fault, Termination.env_bug,
            Termination.policy_error]
    rollouts = [Rollout(task_id=tasks[i % 2].task_id, family="inventory", env_id=tasks[0].env_id, env_version="0",
                        policy_id="p", policy_version="1", seed=i, termination=t) for i, t in enumerate(ends)]
    report = summarize(rollouts, tasks)
    # not 1 / 5: a fault must not lower the model's held-out success
    assert report["success_rate"] == 0.5 and report["episodes"] == 5 and report["excluded"] == 3
    # per level, the same rule: task 0 has one model outcome (a success), task 1 one (a failure)
    l0, l1 = (t.difficulty.level for t in tasks)
    assert report["by_level"] == ({l0: 0.5} if l0 == l1 else {l0: 1.0, l1: 0.0})


def test_expected_ids_are_the_ids_evaluation_gives_and_the_cap_is_part_of_them():
    tasks = generate_tasks("inventory", 3, seed=2)
    policy = make_policy("scripted", "inventory", mistake_rate=0.9)
    capped = evaluate_policy(tasks, policy, seed=5, slack_steps=0)
    free = evaluate_policy(tasks, policy, seed=5, slack_steps=None)
    assert [r.rollout_id for r in capped] == [expected_rollout_id(t, policy, 5, slack_steps=0) for t in tasks]
    assert [r.rollout_id for r in free] == [expected_rollout_id(t, policy, 5, slack_steps=None) for t in tasks]
    assert not {r.rollout_id for r in capped} & {r.rollout_id for r in free}
    assert all(r.limits is not None and r.limits.max_steps == len(t.hidden.reference) for r, t in zip(capped, tasks))
