"""A delegating episode lands its sub-agents' episodes as sub-rollouts linked to it, with its
stages and critical steps; training data holds only the main agent's turns; a sub-rollout is
never counted as the sub-task family's own data."""

from __future__ import annotations

import json

from gymfoundry import envs  # noqa: F401  (registers the families)
from gymfoundry.envs.family import family
from gymfoundry.envs.records import ToolCall
from gymfoundry.tasks.stages.assemble import sft_rows
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.episodes import run_episode
from gymfoundry.warehouse import Warehouse
from tests.audits import audited


class Calls:
    """A policy that makes the given calls (the main agent, as a harness would drive it)."""

    policy_id, version = "calls", "1"

    def __init__(self, calls):
        self.calls = calls

    def reset(self, seed=None):
        self.left = list(self.calls)

    def act(self, observation):
        call = self.left.pop(0)
        return f'<tool_call>{{"name": "{call.name}", "arguments": {__import__("json").dumps(call.arguments)}}}</tool_call>'


def retried_task(level=2):
    fam = family("orchestrator")
    return next(t for s in range(60) for t in [fam.generate(s, level)]
                if sum(c.name == "delegate" for c in t.hidden.reference) > 1)


def test_a_delegated_episode_lands_its_sub_rollouts_linked_to_the_parent(tmp_path):
    task = retried_task()
    rollout = run_episode(task, Calls(task.hidden.reference), seed=7)
    assert rollout.success and rollout.delegation is not None
    stages = [c.arguments["subtasks"] for c in task.hidden.reference if c.name == "delegate"]
    subs = rollout.subrollouts
    assert len(subs) == sum(map(len, stages)) and {s.parent_rollout_id for s in subs} == {rollout.rollout_id}
    assert [(s.stage, s.stage_index) for s in subs] == [(n, k) for n, st in enumerate(stages) for k in range(len(st))]
    assert len({s.rollout_id for s in subs}) == len(subs)
    assert all(s.policy_version.endswith("+mistakes0.2") and s.steps for s in subs)  # each its own steps and version
    # stage n: the main agent's steps up to and including its n-th delegate call, then the sub-agents
    layout = rollout.delegation.stages
    assert [s.main_steps for s in layout] == [2] + [1] * (len(stages) - 1) + [1]  # list, delegate.., then finish
    assert [s.sub_steps for s in layout[:-1]] == [[len(r.steps) for r in subs if r.stage == n] for n in range(len(stages))]
    d = rollout.delegation
    assert d.critical_steps == sum(s.main_steps + max(s.sub_steps, default=0) for s in layout)
    assert d.serial_steps == len(rollout.steps) + sum(len(s.steps) for s in subs) > d.critical_steps

    with Warehouse(tmp_path) as wh:
        counts = wh.land(tasks=[task], rollouts=[rollout], rollout_outcomes=True).checked()
        assert counts["rollouts"] == 1 and counts["sub_rollouts"] == len(subs)
        assert counts["steps"] == len(rollout.steps)  # the main agent's steps only
        (row,) = wh.sql("select * from critical_steps").to_pylist()
        assert (row["critical_steps"], row["serial_steps"], row["stages"]) == (d.critical_steps, d.serial_steps, len(layout))
        assert row["sub_rollouts"] == len(subs) and row["sub_successes"] == sum(s.success for s in subs)
        linked = wh.sql("select parent_rollout_id, count(*) n from sub_rollouts group by 1").to_pylist()
        assert linked == [{"parent_rollout_id": rollout.rollout_id, "n": len(subs)}]
        # the sub-task families' own statistics never see the frozen sub-agents' episodes
        assert wh.sql("select count(*) n from rollouts where task_family <> 'orchestrator'").to_pylist() == [{"n": 0}]
        again = wh.land(tasks=[task], rollouts=[rollout]).checked()
        assert again == {"tasks": 0, "rollouts": 0, "steps": 0}  # idempotent: nothing lands twice


def test_training_rows_hold_only_the_main_agents_turns():
    task = retried_task()
    rollout = run_episode(task, Calls(task.hidden.reference), seed=7)
    (row,) = sft_rows({task.task_id: task}, [rollout], {})
    called = [c["function"]["name"] for m in row.messages for c in m.get("tool_calls") or []]
    assert called == [c.name for c in task.hidden.reference]
    sub_tools = {s.tool_call.name for sub in rollout.subrollouts for s in sub.steps if s.tool_call}
    assert sub_tools and not sub_tools & set(called)


def test_the_scripted_orchestrator_through_run_episode():
    fam = family("orchestrator")
    policy = make_policy("scripted", "orchestrator")
    rollouts = [run_episode(fam.generate(s, 3), policy, seed=s) for s in range(6)]
    assert all(r.delegation is not None and r.subrollouts for r in rollouts)
    assert {r.termination.value for r in rollouts} >= {"success"}


def test_parallelism_reward_is_annealed_and_never_grows_with_sub_agents_alone():
    from gymfoundry.envs.delegation import parallelism_gain
    from gymfoundry.envs.records import ParallelismReward
    from gymfoundry.tasks.training.grpo import episode_reward

    fam = family("orchestrator")
    task = next(t for s in range(60) for t in [fam.generate(s, 3)]
                if sum(c.name == "delegate" for c in t.hidden.reference) == 1)  # all succeed in one stage
    ids = fam.facts_of(task).subtasks
    parallel = run_episode(task, Calls(task.hidden.reference), seed=1)
    serial_calls = [ToolCall(name="delegate", arguments={"subtasks": [i]}) for i in ids]
    serial = run_episode(task, Calls(serial_calls + [task.hidden.reference[-1]]), seed=1)
    assert parallel.success and serial.success
    subs = [len(r.steps) for r in parallel.subrollouts]
    main = len(parallel.steps)
    assert parallelism_gain(parallel) == 1 - (main + max(subs)) / (main + sum(subs))
    assert parallelism_gain(serial) == 0.0  # one sub-agent per stage: nothing off the critical path
    # spawning a wasted sub-agent (a sub-task again after it succeeded) fails the task: no reward at all
    spam = run_episode(task, Calls(task.hidden.reference[:2] + [ToolCall(name="delegate", arguments={"subtasks": ids[:1]}),
                                                                task.hidden.reference[-1]]), seed=1)
    assert not spam.success and parallelism_gain(spam) == 0.0

    schedule = ParallelismReward(weight=0.2, anneal_steps=10)
    assert [schedule.at(s) for s in (0, 5, 10, 20)] == [0.2, 0.1, 0.0, 0.0]
    assert episode_reward(parallel, schedule, 0) == 1 + 0.2 * parallelism_gain(parallel)
    assert episode_reward(parallel, schedule, 10) == 1.0 and episode_reward(parallel, None, 0) == 1.0
    assert episode_reward(spam, schedule, 0) == 0.0


def test_the_parallelism_schedule_is_stored_with_the_grpo_dataset(tmp_path):
    from gymfoundry.tasks.stages.assemble import assemble_datasets
    from gymfoundry.tasks.training.grpo import dataset_parallelism

    fam = family("orchestrator")
    tasks = [fam.generate(s, 1) for s in range(4)]
    rollouts = [run_episode(t, Calls(t.hidden.reference), seed=s) for s, t in enumerate(tasks)]
    with Warehouse(tmp_path) as wh:
        wh.land(tasks=tasks, rollouts=rollouts, rollout_outcomes=True).checked()
    audited(tmp_path, ["orchestrator"])
    out = assemble_datasets(tmp_path, ["orchestrator"], parallelism_reward={"weight": 0.3, "anneal_steps": 50})
    grpo = out["grpo"]
    assert grpo["rows"] > 0
    schedule = dataset_parallelism(grpo["path"])
    assert (schedule.weight, schedule.anneal_steps) == (0.3, 50)
    with Warehouse(tmp_path) as wh:
        params = {r["kind"]: r["params"] for r in wh.sql("select kind, params from datasets").to_pylist()}
    assert json.loads(params["grpo"])["parallelism_reward"] == {"weight": 0.3, "anneal_steps": 50}
    assert "parallelism_reward" not in params["sft"]
    plain = assemble_datasets(tmp_path, ["orchestrator"])
    assert dataset_parallelism(plain["grpo"]["path"]) is None


def test_a_subagent_policy_spec_plays_the_sub_tasks_and_is_recorded():
    from gymfoundry.envs.records import PolicySpec, RetryPolicy
    from gymfoundry.tasks.rollout.retry import collect_with_retries

    fam = family("orchestrator")
    task = fam.generate(5, 2)
    ids = fam.facts_of(task).subtasks
    calls = [ToolCall(name="delegate", arguments={"subtasks": ids}), ToolCall(name="finish", arguments={"summary": "ok"})]
    careful = PolicySpec(kind="scripted", mistake_rate=0.0)
    (rollout,) = collect_with_retries([task], Calls(calls), 1, 0, RetryPolicy(), subagent=careful)
    assert rollout.success
    assert {s.policy_version.split("+")[1] for s in rollout.subrollouts} == {"mistakes0"}
    default = run_episode(task, Calls(calls), seed=rollout.seed)
    assert {s.policy_version.split("+")[1] for s in default.subrollouts} == {"mistakes0.2"}
    # the frozen policy a sub-task gets is part of its rollout's identity, not of the main one's
    assert {s.rollout_id for s in rollout.subrollouts}.isdisjoint(s.rollout_id for s in default.subrollouts)
    # envs that delegate nothing ignore it
    inventory = family("inventory").generate(1, 1)
    plain = run_episode(inventory, make_policy("scripted", "inventory"), seed=3, subagent=careful)
    same = run_episode(inventory, make_policy("scripted", "inventory"), seed=3)
    assert plain.rollout_id == same.rollout_id and plain.delegation is None and plain.subrollouts == []
    assert [s.action_text for s in plain.steps] == [s.action_text for s in same.steps]


def test_a_stage_no_accepted_call_owns_is_not_the_episodes():
    from gymfoundry.tasks.rollout.episodes import with_delegation

    task = retried_task()
    rollout = run_episode(task, Calls(task.hidden.reference), seed=7)
    bare = rollout.model_copy(update={"delegation": None, "subrollouts": []})
    env_stages = [[] for _ in rollout.delegation.stages[:-1]]
    late = with_delegation(bare, env_stages + [[]])  # one stage more than accepted delegate calls
    assert [s.main_steps for s in late.delegation.stages] == [s.main_steps for s in rollout.delegation.stages]
