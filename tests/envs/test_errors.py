"""The error model (envs/errors.py): attribution by the boundary an exception crossed, never by
its type alone or by text the agent controls; malformed, tampered and spoofed tasks refused with
a clear error; NaN, deep and unencodable actions refused as agent input on every path."""

import json

import pytest

from gymfoundry import envs
from gymfoundry.envs.errors import (AGENT_INPUT, ROLLED_BACK, ActionError, EnvBug, EnvFault, ErrorKind, InvalidTask, ToolError,
                         boundary)
from gymfoundry.envs.faults import FaultInjection
from gymfoundry.envs.inventory import InventoryEnv
from gymfoundry.envs.parsing import MAX_DEPTH, parse_action
from gymfoundry.envs.records import MODEL_OUTCOMES, FaultConfig, RetryPolicy, Step, TaskSpec, Termination, ToolCall, check_task
from gymfoundry.envs.errors import UnknownEnv
from gymfoundry.envs.family import family
from gymfoundry.envs.wrappers import standard_stack
from tests.envs.counter_env import CounterEnv

DEEP = '{"name": "read", "arguments": ' + "[" * 1500 + "]" * 1500 + "}"  # ~3 KB: past json's recursion limit


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def obs(ts) -> dict:
    return json.loads(ts.observation)


def counter() -> CounterEnv:
    env = CounterEnv()
    env.reset(seed=3)
    return env


def inventory_task() -> TaskSpec:
    return InventoryEnv.generate_task(4, 2)


# -- boundary -----------------------------------------------------------------------------------
def test_boundary_passes_what_is_raised_on_purpose_there_and_makes_anything_else_a_bug():
    with pytest.raises(ToolError):
        with boundary("tool", allowed=(ToolError,)):
            raise ToolError("no_match", "x")
    with pytest.raises(EnvBug) as bug:
        with boundary("agent_input", allowed=(ActionError,)):
            raise ToolError("no_match", "a refusal where only agent-input errors are raised")
    assert bug.value.where == "agent_input" and bug.value.kind == "env_bug"
    assert "test_errors.py:" in bug.value.location and "ToolError: a refusal" in bug.value.message
    with pytest.raises(KeyboardInterrupt):  # never swallowed
        with boundary("tool"):
            raise KeyboardInterrupt


def test_a_tool_refusal_cannot_claim_a_kind_only_the_runtime_gives():
    for kind in ("env_fault", "env_bug", "unknown_tool", "invalid_json", "timeout", ErrorKind.env_bug):
        with pytest.raises(ValueError, match="cannot use the runtime's error kind"):
            ToolError(kind, "forged")
    assert ToolError("invalid_arguments", "ok").kind == "invalid_arguments"
    assert ROLLED_BACK == {"env_fault", "env_bug"} and not ROLLED_BACK & {k.value for k in AGENT_INPUT}


def test_env_bug_is_never_a_model_outcome_nor_retried_by_default():
    assert Termination.env_bug.value == "env_bug" and Termination.env_bug not in MODEL_OUTCOMES
    assert Termination.env_bug not in RetryPolicy().retry_on


# -- attribution in ToolEnv.step ------------------------------------------------------------------
class Buggy(CounterEnv):
    def tool_read(self, state):  # env code that crashes on the agent's input
        state["value"] = 42
        return {"value": {"a": 1}["missing"]}

    def tool_outage(self, state):  # the text of a crash decides nothing, whatever it says
        raise RuntimeError("EnvFault: service unavailable (env_fault)")

    def tool_sleep(self, state, seconds):
        raise ActionError("invalid_arguments", "an agent-input error raised inside a tool")

    def tool_finish(self, state):
        return {"not json": {1, 2}}  # a result the env cannot render


def test_a_crash_inside_a_tool_is_an_env_bug_rolled_back_with_the_action_kept():
    env = Buggy()
    env.reset(seed=3)
    action = '{"name": "read", "arguments": {}}'
    ts = env.step(action)
    assert ts.info["env_bug"] is True and ts.info["env_fault"] is False and not ts.done
    assert ts.info["error"]["kind"] == "env_bug" and ts.info["error"]["where"] == "tool read"
    assert ts.info["error"]["location"].endswith(f"test_errors.py:{Buggy.tool_read.__code__.co_firstlineno + 2}")
    assert obs(ts)["error"]["type"] == "env_bug" and "KeyError: 'missing'" in obs(ts)["error"]["message"]
    assert env.state()["value"] == 0  # rolled back
    step = env.steps[0]
    assert (step.error, step.action_text, step.tool_call) == ("env_bug", action, ToolCall(name="read"))
    for name, arguments in [("outage", {}), ("sleep", {"seconds": 1}), ("finish", {})]:
        ts = env.step(ToolCall(name=name, arguments=arguments))
        assert ts.info["error"]["kind"] == "env_bug", name
    assert not env.state()["finished"]  # the unrenderable finish was rolled back too


def test_an_env_fault_raised_by_infrastructure_stays_a_fault():
    env = counter()
    ts = env.step(ToolCall(name="outage"))
    assert (ts.info["env_fault"], ts.info["env_bug"], ts.info["error"]["kind"]) == (True, False, "env_fault")


def test_injected_crashes_are_env_faults_never_env_bugs():
    config = FaultConfig(rate=1.0, kinds={"tool_crash": 1.0, "timeout": 0.0, "unavailable": 0.0})
    env = FaultInjection(family("gymfoundry/inventory-v0").make(), config, seed=1)
    env.reset(seed=1)
    ts = env.step(ToolCall(name="find_items", arguments={"query": "x"}))
    assert (ts.info["env_fault"], ts.info["env_bug"]) == (True, False)
    assert ts.info["error"] == {"kind": "env_fault", "message": "tool crashed: InjectedCrash: injected fault"}
    assert env.unwrapped.steps[0].error == "env_fault" and env.state()["events"] == []


def test_a_parser_crash_would_be_an_env_bug_not_the_agents_mistake(monkeypatch):
    from gymfoundry.envs import base

    monkeypatch.setattr(base, "parse_action", lambda action, limit: 1 / 0)
    ts = counter().step(ToolCall(name="read"))
    assert ts.info["error"]["kind"] == "env_bug" and ts.info["error"]["where"] == "agent_input"


def test_only_agent_input_kinds_come_from_the_action_checks():
    env = counter()
    for action in ['{"name": "add", "arguments": {"n": 3.0}}', '{"name": "add", "arguments": {"n": true}}',
                   '{"name": "add", "arguments": {"n": 1, "state": 2}}', '{"name": "add", "arguments": {"self": 1}}']:
        ts = env.step(action)
        assert ts.info["error"]["kind"] == "invalid_arguments", action  # 3.0 is not a count of anything
    assert env.state()["value"] == 0 and all(s.error in AGENT_INPUT for s in env.steps)


# -- NaN, depth, size, encoding: every path ------------------------------------------------------------
NAN_ACTIONS = [
    '{"name": "add", "arguments": {"n": NaN}}',
    '{"name": "add", "arguments": {"n": Infinity}}',
    '<tool_call>{"name": "add", "arguments": {"n": -Infinity}}</tool_call>',
    '{"name": "add", "arguments": "{\\"n\\": NaN}"}',
    {"name": "add", "arguments": {"n": float("nan")}},
    {"name": "add", "arguments": '{"n": NaN}'},
    {"type": "function", "function": {"name": "add", "arguments": {"n": float("inf")}}},
    ToolCall(name="add", arguments={"n": float("nan")}),
    ToolCall(name="add", arguments={"n": [1, {"deep": float("-inf")}]}),
]


@pytest.mark.parametrize("action", NAN_ACTIONS, ids=range(len(NAN_ACTIONS)))
def test_nan_and_infinity_are_invalid_json_whatever_path_the_action_takes(action):
    env = counter()
    ts = env.step(action)
    assert ts.info["error"]["kind"] == "invalid_json" and ts.info["tool_call"] is None
    step = env.steps[0]
    assert step.tool_call is None and step.error == "invalid_json"
    assert Step.model_validate_json(step.model_dump_json()) == step  # stored as it was, never as null


@pytest.mark.parametrize("action,kind", [
    (DEEP, "action_too_deep"),
    ('{"name": "read", "arguments": {"a": ' + '{"b": ' * 1000 + "1" + "}" * 1001 + "}", "action_too_deep"),
    ({"name": "read", "arguments": {"a": nested(33)}}, "action_too_deep"),
    ('{"name": "read", "arguments": {"a": ' + "9" * 5000 + "}}", "invalid_json"),
    ({"name": "read", "arguments": {"a": 10**5000}}, "invalid_arguments"),
    ({"name": "read", "arguments": {"a": 2**63}}, "invalid_arguments"),
    ({"name": "read", "arguments": {"a": {1, 2}}}, "invalid_arguments"),
    ({"name": "read", "arguments": {"a": (1, 2)}}, "invalid_arguments"),
    ({"name": "read", "arguments": {5: "x"}}, "invalid_arguments"),
    ('{"name": "read", "arguments": {"a": "\\ud800"}}', "invalid_arguments"),
    ("thinking \ud800 " + '{"name": "read", "arguments": {}}', "invalid_action"),
    ({"name": "re\udc00ad"}, "invalid_arguments"),
])
def test_actions_that_cannot_be_stored_or_replayed_are_agent_input_errors(action, kind):
    env = counter()
    ts = env.step(action)
    assert ts.info["error"]["kind"] == kind and not ts.done
    assert ErrorKind(kind) in AGENT_INPUT
    step = env.steps[0]
    assert Step.model_validate_json(step.model_dump_json()) == step
    assert env.step(ToolCall(name="add", arguments={"n": 1})).info["error"] is None  # the episode goes on


def test_nesting_up_to_the_limit_is_accepted_and_one_more_level_refused():
    assert parse_action({"name": "read", "arguments": {"a": nested(30)}}).call.arguments["a"] == nested(30)
    assert MAX_DEPTH == 32  # the action object, its arguments and 30 lists
    with pytest.raises(ActionError) as err:
        parse_action({"name": "read", "arguments": {"a": nested(31)}})
    assert err.value.kind == "action_too_deep" and "deeper than 32 levels" in err.value.message


def test_a_deep_action_is_refused_in_both_families_and_through_the_runtime_stack():
    stack = standard_stack(family("gymfoundry/inventory-v0").make())  # coding: envs/coding/tests/test_coding.py (sandbox)
    stack.reset(seed=2)
    ts = stack.step(DEEP)
    assert ts.info["error"]["kind"] == "action_too_deep" and not ts.done
    assert stack.steps[0].error == "action_too_deep"
    with pytest.raises(ActionError) as err:
        parse_action(DEEP.replace('"read"', '"read_file"'))
    assert err.value.kind == "action_too_deep"


def test_text_with_lone_surrogates_is_kept_escaped_so_the_step_can_be_stored():
    stack = standard_stack(CounterEnv())
    stack.reset(seed=3)
    stack.step("I think \ud83d then " + '{"name": "read"}', thought="policy thought \udfff")
    step = stack.steps[0]
    assert step.action_text == 'I think \\ud83d then {"name": "read"}' and step.thought == "policy thought \\udfff"
    assert Step.model_validate_json(step.model_dump_json()) == step


# -- tasks: tampered, malformed, spoofed -------------------------------------------------------------
def test_a_tampered_task_is_refused_at_reset_and_by_check_task():
    task = inventory_task()
    env = InventoryEnv()
    for tampered in [task.model_copy(update={"goal": "Reserve everything."}),
                     task.model_copy(update={"hidden": task.hidden.model_copy(update={"reference": []})}),
                     task.model_copy(update={"budget": {"max_steps": 1000}})]:
        with pytest.raises(InvalidTask, match=f"task_id '{task.task_id}' does not match its content hash"):
            env.reset(tampered)
        with pytest.raises(ValueError, match="does not match its content hash"):
            check_task(tampered)
    assigned = inventory_task()
    assigned.allowed_tools = ["submit"]  # assignment skips validation too
    with pytest.raises(InvalidTask, match="content hash"):
        env.reset(assigned)
    assert env.task is None  # nothing of the refused task was installed
    assert check_task(task) == task and check_task(task.model_dump(mode="json")) == task
    assert env.reset(task).info["task_id"] == task.task_id


def test_a_malformed_task_gets_a_short_error_naming_the_bad_fields():
    data = inventory_task().model_dump(mode="json")
    data.update(task_id="", difficulty={"level": 9}, allowed_tools="all")
    del data["hidden"]
    for attempt in (lambda: check_task(data), lambda: InventoryEnv().reset(data)):
        with pytest.raises(InvalidTask) as err:
            attempt()
        message = str(err.value)
        assert message.startswith("malformed task without an id: ")
        assert "allowed_tools: Input should be a valid list" in message and "difficulty.level:" in message
        assert "hidden: Field required" in message and len(message) < 300  # no dump of the inputs
    with pytest.raises(InvalidTask, match="a task must be a TaskSpec or a dict, not str"):
        InventoryEnv().reset("t-123")


def respun(task: TaskSpec, **changes) -> TaskSpec:
    """A spoofed task with a consistent id, as a careful attacker would make it."""
    return TaskSpec.model_validate({**task.model_dump(), **changes, "task_id": ""})


def test_a_spoofed_family_is_a_clear_error_never_a_key_error():
    task = inventory_task()
    coding = family("gymfoundry/coding-v0").make().generate_task(1, 1)
    cases = [
        (respun(task, family="nope"), "is for family 'nope', not 'inventory'"),
        (respun(task, family="coding"), "is for family 'coding', not 'inventory'"),
        (respun(coding, family="inventory", env_id="gymfoundry/inventory-v0"), "is not an inventory world"),
        (respun(task, initial_state={**task.initial_state, "catalog": {"SKU-1": {"name": "x"}}}),
         "is not an inventory world"),
        (respun(task, initial_state={**task.initial_state, "auth": {"credit_limit_cents": True, "token": "t"}}),
         "is not an inventory world"),
    ]
    for spoofed, message in cases:
        with pytest.raises(InvalidTask, match=message):
            InventoryEnv().reset(spoofed)
    with pytest.raises(InvalidTask, match="is for family 'inventory', not 'coding'"):
        family("gymfoundry/coding-v0").make().reset(task)
    with pytest.raises(UnknownEnv, match="no environment 'gymfoundry/nope-v0'; registered: .*inventory-v0"):
        family(respun(task, env_id="gymfoundry/nope-v0").env_id)
    for lookup in (lambda: family("gymfoundry/nope-v0"), lambda: family("nope"), lambda: family(None)):
        with pytest.raises(ValueError) as err:
            lookup()
        assert not isinstance(err.value, KeyError)


def test_the_episode_is_untouched_by_a_refused_reset():
    env = InventoryEnv()
    task = inventory_task()
    env.reset(task)
    env.step(ToolCall(name="find_items", arguments={"query": "a"}))
    with pytest.raises(InvalidTask):
        env.reset(respun(task, family="nope"))
    assert env.task == task and len(env.steps) == 1


def test_a_tool_refusal_keeps_the_attempt_in_the_state():
    env = InventoryEnv()
    env.reset(inventory_task())
    ts = env.step(ToolCall(name="get_stock", arguments={"sku": "SKU-0"}))
    assert ts.info["error"]["kind"] == "unknown_sku" and env.state()["events"][-1]["outcome"] == "unknown_sku"


def test_an_env_fault_exception_type_is_still_exported_from_envs_base():
    from gymfoundry.envs.base import EnvFault as Fault, ToolError as Refusal

    assert Fault is EnvFault and Refusal is ToolError and envs.EnvFault is EnvFault
