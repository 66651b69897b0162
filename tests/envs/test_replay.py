"""`ToolEnv.replay`, a verifier's replay of an episode's calls, applies each call to each state
exactly as `step` does, several start states in one pass: refused calls change nothing, a
refusal keeps what the tool did, and a crash half-way through a tool is rolled back."""

from __future__ import annotations

from gymfoundry.envs.base import ToolError, copy_state
from gymfoundry.envs.records import TaskSpec, ToolCall
from tests.envs.counter_env import PROFILE, CounterEnv

TAKE = {"name": "take", "description": "take n; a bug once the counter is negative", "category": "write",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                       "additionalProperties": False}}


class TakeEnv(CounterEnv):
    """`take` writes before it fails: a refusal keeps the write, a crash must not."""

    profile = PROFILE.model_copy(update={"tools": [*PROFILE.tools, PROFILE.tools[0].model_validate(TAKE)]})

    @classmethod
    def generate_task(cls, seed: int, level: int = 2) -> TaskSpec:
        data = CounterEnv.generate_task(seed, level).model_dump()
        return TaskSpec.model_validate({**data, "task_id": "", "allowed_tools": [*data["allowed_tools"], "take"]})

    def tool_take(self, state, n):
        state["value"] -= n
        state.setdefault("log", []).append(n)
        if n == 7:
            raise ValueError("a bug after the write")  # env_bug: rolled back
        if state["value"] < 0:
            raise ToolError("overdrawn", "the counter went below zero")  # the write stays
        return {"value": state["value"]}


CALLS = [ToolCall(name="add", arguments={"n": 5}), None, ToolCall(name="take", arguments={"n": 7}),
         ToolCall(name="take", arguments={"n": 3}), ToolCall(name="add", arguments={"n": 500}),
         ToolCall(name="nope"), ToolCall(name="add", arguments={"n": "x"}), ToolCall(name="outage"),
         ToolCall(name="take", arguments={"n": 9}), ToolCall(name="read"), ToolCall(name="finish"),
         ToolCall(name="add", arguments={"n": 1})]


def stepped(start: dict) -> tuple[dict, list[dict]]:
    """The live path: each call through `step`, from `start`; the final state and each state after a call."""
    env = TakeEnv()
    env.reset(seed=3)
    env._state = copy_state(start)
    after, done = [], False
    for call in CALLS:
        if call is not None and not done:
            done = env.step(call).terminated
        after.append(copy_state(env._state))
    return env._state, after


def test_replay_applies_every_call_as_a_step_does_from_several_states_in_one_pass():
    env = TakeEnv()
    env.reset(seed=3)
    starts = [copy_state(env._state), {**copy_state(env._state), "value": 4}, {**copy_state(env._state), "value": 40}]
    expected = [stepped(s) for s in starts]
    seen = []
    finals = TakeEnv().replay(env.task, CALLS, [copy_state(s) for s in starts],
                              lambda states: seen.append([copy_state(s) for s in states]))
    assert finals == [final for final, _ in expected]
    assert seen == [list(states) for states in zip(*(after for _, after in expected))]
    # the crash in `take 7` left nothing behind; the refusal of `take 9` kept its write; finish ended it
    assert finals[0] == {"value": -7, "target": 4, "finished": True, "log": [3, 9]}
    assert finals[2]["value"] == 33 and finals[2]["log"] == [3, 9]


def test_a_world_with_a_step_of_its_own_is_replayed_through_it():
    class OwnStep(TakeEnv):
        def step(self, action):
            return super().step(action)

    env = OwnStep()
    env.reset(seed=3)
    starts = [copy_state(env._state), {**copy_state(env._state), "value": 4}]
    finals = OwnStep().replay(env.task, CALLS, [copy_state(s) for s in starts])
    assert finals == [stepped(s)[0] for s in starts]
