import json

import pytest

from gymfoundry.envs.parsing import ActionError, parse_action
from gymfoundry.envs.profile import DomainProfile
from gymfoundry.envs.records import Rollout, TaskSpec, Termination, ToolCall, ToolCategory
from gymfoundry.envs.errors import UnknownEnv
from gymfoundry.envs.family import Family, FamilyError, family, families
from gymfoundry.envs.timestep import EpisodeEnd
from gymfoundry.envs.wrappers import (ObservationTruncation, PermissionGuard, Recorder, TimeLimit, ToolBudget,
                           standard_stack)
from tests.envs.counter_env import CounterEnv, HeldSleep, NoFacts, register, reward_at_target


def obs(ts):
    return json.loads(ts.observation)


@pytest.fixture
def env():
    e = CounterEnv(outcome_fn=reward_at_target)
    e.reset(seed=3)  # target 4
    return e


def test_parse_accepts_bare_tagged_and_openai_forms():
    bare = parse_action('I will add. {"name": "add", "arguments": {"n": 2}}')
    assert bare.call == ToolCall(name="add", arguments={"n": 2}) and bare.thought == "I will add."
    tagged = parse_action('think\n<tool_call>{"name": "add", "arguments": "{\\"n\\": 3}"}</tool_call>')
    assert tagged.call.arguments == {"n": 3} and tagged.thought == "think"
    wire = parse_action({"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}})
    assert wire.call == ToolCall(name="read", arguments={}, id="c1")


@pytest.mark.parametrize("text,kind", [
    ('{"name": "add", "arguments": {"n": 2}', "invalid_json"),
    ("just words", "no_tool_call"),
    ('{"arguments": {}}', "invalid_tool_call"),
    ('{"name": "add", "arguments": [1]}', "invalid_arguments"),
    ('<tool_call>{"name":"read"}</tool_call><tool_call>{"name":"read"}</tool_call>', "multiple_tool_calls"),
    ('{"name": "add", "arguments": {"n": "' + "x" * 1_000_000 + '"}}', "action_too_large"),
])
def test_parse_errors_have_kinds(text, kind):
    with pytest.raises(ActionError) as err:
        parse_action(text)
    assert err.value.kind == kind


@pytest.mark.parametrize("action,kind", [
    ('{"name": "add", "arguments": {"n": 2', "invalid_json"),
    ('{"name": "teleport", "arguments": {}}', "unknown_tool"),
    ('{"name": "add", "arguments": {"n": "two"}}', "invalid_arguments"),
    ('{"name": "add", "arguments": {}}', "invalid_arguments"),
    ('{"name": "add", "arguments": {"n": 1, "extra": true}}', "invalid_arguments"),
    ({"name": "add", "arguments": {"n": "y" * 1_000_000}}, "action_too_large"),
    ('{"name": "add", "arguments": {"n": 500}}', "too_big"),
])
def test_bad_actions_become_error_observations_and_the_episode_goes_on(env, action, kind):
    ts = env.step(action)
    assert not ts.done
    assert obs(ts)["ok"] is False and obs(ts)["error"]["type"] == kind
    assert ts.info["error"]["kind"] == kind
    assert env.state()["value"] == 0
    ts = env.step('{"name": "add", "arguments": {"n": 4}}')
    assert obs(ts) == {"ok": True, "result": {"value": 4}, "tool": "add"}


def derived(task: TaskSpec, **changes) -> TaskSpec:
    """A changed copy of a task is another task, with its own id."""
    return TaskSpec.model_validate({**task.model_dump(), **changes, "task_id": ""})


def test_tool_not_allowed_is_refused(env):
    task = derived(env.task, allowed_tools=["read", "finish"])
    env.reset(task=task)
    ts = env.step(ToolCall(name="add", arguments={"n": 1}))
    assert obs(ts)["error"]["type"] == "tool_not_allowed" and env.state()["value"] == 0
    assert [t["function"]["name"] for t in env.available_tools] == ["read", "finish"]


def test_a_crashing_tool_is_an_env_bug_and_an_outage_an_env_fault(env):
    crash, outage = env.step(ToolCall(name="crash")), env.step(ToolCall(name="outage"))
    assert (crash.info["env_bug"], crash.info["env_fault"], obs(crash)["error"]["type"]) == (True, False, "env_bug")
    assert (outage.info["env_bug"], outage.info["env_fault"], obs(outage)["error"]["type"]) == (False, True, "env_fault")
    assert "ValueError: boom" in env.steps[0].result and crash.info["error"]["where"] == "tool crash"
    assert [s.error for s in env.steps] == ["env_bug", "env_fault"] and not crash.done


def test_terminal_reward_comes_from_the_outcome_function(env):
    env.step(ToolCall(name="add", arguments={"n": 4}))
    ts = env.step(ToolCall(name="finish"))
    assert ts.terminated and ts.done and ts.reward == 1.0 and ts.info["outcome"] == {"success": True}
    # the pipeline's typed view of the same end
    assert ts.end == EpisodeEnd(terminated=True, outcome={"success": True})
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(ToolCall(name="read"))


@pytest.mark.timeout(60)  # a step that waited for the held tool would hang
def test_step_timeout_is_enforced_during_the_step(monkeypatch):
    held = HeldSleep(monkeypatch)
    env = TimeLimit(CounterEnv(), step_timeout_s=0.2)
    env.reset(seed=1)
    ts = env.step(ToolCall(name="sleep", arguments={"seconds": 5}))
    assert held.holding()  # the step came back at its deadline while the tool still ran
    held.end()
    assert ts.truncated and ts.info["termination"] == "env_fault" and ts.info["error"]["kind"] == "timeout"
    assert ts.end.clock == "env_fault" and ts.error["kind"] == "timeout"


def test_episode_timeout_and_step_limit():
    env = TimeLimit(CounterEnv(), max_steps=3)
    env.reset(seed=1)
    assert not env.step(ToolCall(name="read")).done
    assert not env.step(ToolCall(name="read")).done
    ts = env.step(ToolCall(name="read"))
    assert ts.truncated and ts.info["termination"] == "truncated" and "step limit 3" in ts.info["termination_reason"]
    assert ts.end == EpisodeEnd(truncated=True, clock="truncated", reason=ts.info["termination_reason"])

    env = TimeLimit(CounterEnv(), episode_timeout_s=0.3, step_timeout_s=10)
    env.reset(seed=1)
    ts = env.step(ToolCall(name="sleep", arguments={"seconds": 3}))
    # one step within its own limit used up the episode's time: the agent's action, counted
    assert ts.truncated and ts.info["termination"] == "truncated"
    assert "agent's own actions" in ts.info["termination_reason"]


def test_tool_budget_counts_parsed_calls_only():
    env = ToolBudget(CounterEnv(), max_tool_calls=2)
    env.reset(seed=1)
    assert not env.step("no call here").done
    assert not env.step(ToolCall(name="read")).done
    ts = env.step(ToolCall(name="read"))
    assert ts.truncated and "budget 2" in ts.info["termination_reason"]


def test_permission_guard_refuses_without_touching_state():
    env = PermissionGuard(CounterEnv(), require_approval={ToolCategory.write, ToolCategory.irreversible})
    env.reset(seed=1)
    ts = env.step(ToolCall(name="add", arguments={"n": 1}))
    assert obs(ts)["error"]["type"] == "permission_denied" and env.state()["value"] == 0 and not ts.done
    assert not env.step(ToolCall(name="read")).info["error"]
    approved = PermissionGuard(CounterEnv(), require_approval={ToolCategory.write},
                               approver=lambda call: call.arguments.get("n") == 1)
    approved.reset(seed=1)
    approved.step(ToolCall(name="add", arguments={"n": 1}))
    assert obs(approved.step(ToolCall(name="add", arguments={"n": 2})))["error"]["type"] == "permission_denied"
    assert approved.state()["value"] == 1


def test_permission_guard_asks_the_world_when_given_no_approver():
    class Granting(CounterEnv):  # the world approves an add of 1 only once it holds a grant
        def approves(self, call):
            return self._state["value"] >= 1 and call.arguments.get("n") == 1

    env = PermissionGuard(Granting(), require_approval={ToolCategory.write})
    env.reset(seed=1)
    assert obs(env.step(ToolCall(name="add", arguments={"n": 1})))["error"]["type"] == "permission_denied"
    env.unwrapped._state["value"] = 1
    assert not env.step(ToolCall(name="add", arguments={"n": 1})).info["error"]
    assert obs(env.step(ToolCall(name="add", arguments={"n": 2})))["error"]["type"] == "permission_denied"
    assert env.state()["value"] == 2
    refused = PermissionGuard(Granting(), require_approval={ToolCategory.write}, approver=lambda call: False)
    refused.reset(seed=1)
    refused.unwrapped._state["value"] = 1
    assert obs(refused.step(ToolCall(name="add", arguments={"n": 1})))["error"]["type"] == "permission_denied"


def test_permission_guard_reports_bad_arguments_before_permission_and_replays_skip_its_refusals():
    from gymfoundry.envs.verifier import calls_of

    env = PermissionGuard(CounterEnv(), require_approval={ToolCategory.write})
    env.reset(seed=1)
    assert obs(env.step(ToolCall(name="add", arguments={"n": "one"})))["error"]["type"] == "invalid_arguments"
    guarded = Recorder(PermissionGuard(CounterEnv(), require_approval={ToolCategory.write}))
    guarded.reset(seed=1)
    guarded.step(ToolCall(name="add", arguments={"n": 1}))
    guarded.step(ToolCall(name="read"))
    assert [s.error for s in guarded.steps] == ["permission_denied", None]
    assert [c and c.name for c in calls_of(guarded.steps)] == [None, "read"]  # a replay never runs the refused add


def test_observation_truncation():
    env = ObservationTruncation(CounterEnv(), max_chars=10)
    ts = env.reset(task=derived(CounterEnv.generate_task(1), goal="g" * 50))
    assert ts.observation == "g" * 10 + "...[truncated 40 chars]"


def test_recorder_and_standard_stack_record_steps():
    env = standard_stack(CounterEnv(outcome_fn=reward_at_target))
    first = env.reset(seed=3)
    env.step('adding {"name": "add", "arguments": {"n": 4}}', token_ids=[1, 2, 3], logprobs=[-0.1, -0.2, -0.3],
             policy_version="p1")
    env.step("oops")
    ts = env.step(ToolCall(name="finish"))
    assert ts.terminated and ts.reward == 1.0
    s0, s1, s2 = env.steps
    assert s0.observation == first.observation and s0.thought == "adding" and s0.token_ids == [1, 2, 3]
    assert s0.tool_call == ToolCall(name="add", arguments={"n": 4}) and s0.latency_s > 0
    assert s1.error == "no_tool_call" and s1.tool_call is None and s1.observation == s0.result
    assert s2.reward == 1.0 and [s.index for s in env.steps] == [0, 1, 2]
    rollout = Rollout(task_id=env.task.task_id, family="counter", env_id="gymfoundry/counter-v0", env_version="0",
                      policy_id="test", policy_version="1", seed=0, steps=env.steps,
                      termination=Termination.success)
    assert rollout.rollout_id.startswith("r-") and Rollout.model_validate(rollout.model_dump()) == rollout


def test_task_id_is_a_content_hash():
    task = CounterEnv.generate_task(5)
    assert task.task_id == task.compute_id() and task.task_id != CounterEnv.generate_task(6).task_id
    with pytest.raises(ValueError, match="content hash"):
        TaskSpec.model_validate({**task.model_dump(), "goal": "changed"})
    assert TaskSpec.model_validate(task.model_dump()) == task


def test_registry():
    with pytest.raises(FamilyError, match=r"family name 'Counter' must match \^\[a-z\]"):
        Family(name="Counter", env=CounterEnv, generator=None, generator_version="1", facts=NoFacts, verifier=None)
    register("gymfoundry/counter-v0", CounterEnv)
    assert "gymfoundry/counter-v0" in [f.env_id for f in families()]
    env = family("gymfoundry/counter-v0").make()
    assert isinstance(env, CounterEnv) and env.env_id == "gymfoundry/counter-v0" and env.version == "0"
    with pytest.raises(UnknownEnv, match="no environment 'gymfoundry/nothing-v0'; registered: .*counter"):
        family("gymfoundry/nothing-v0")
    with pytest.raises(UnknownEnv, match="no environment family 'nothing'"):
        family("nothing")


def test_profile_from_yaml(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("name: d\ntools:\n  - {name: a, description: x, category: read}\n"
                    "score_weights: {rules: {progress: 2.0}}\n")
    profile = DomainProfile.from_yaml(path)
    assert profile.category("a") == ToolCategory.read and profile.score_weights.rules == {"progress": 2.0}
    path.write_text("name: d\ntools: []\noutcome_rules: [vibes]\n")
    with pytest.raises(ValueError, match="unknown outcome rules"):
        DomainProfile.from_yaml(path)


def test_a_crashed_tool_leaves_the_state_as_it_was():
    class Leaky(CounterEnv):
        def tool_crash(self, state):
            state["value"] = 99
            raise ValueError("boom after writing")

    env = Leaky()
    env.reset(seed=1)
    ts = env.step(ToolCall(name="crash"))
    assert ts.info["env_bug"] and env.state()["value"] == 0 and env.steps[0].tool_call == ToolCall(name="crash")
