"""Issue 19's shortcuts on the rollout path keep what they replace: a replay that renders no result
(only in a world that declares plain results), the inventory initial state made once per snapshot
content, a replay that reads a recorded call instead of a copy of it, and records built from a
template. Each test here fails if its shortcut takes something it must not."""

from __future__ import annotations

import copy

import pytest

from gymfoundry import envs  # noqa: F401  registers the families
import gymfoundry.envs.base as base
from gymfoundry.envs.errors import ActionError, InvalidTask
from gymfoundry.envs.family import family
from gymfoundry.envs.parsing import parse_action, replay_call
from gymfoundry.envs.records import Step, StepScore, ToolCall, construct
from tests.envs.counter_env import CounterEnv


def inventory_task(seed: int = 3, level: int = 3):
    return family("inventory").generate(seed, level)


# -- a replay renders no result only where results are declared plain ---------------------------
class OddResultEnv(CounterEnv):
    """`add` returns something JSON cannot render once the value passes 5: in a step that is an
    env bug (rolled back); in a replay it must stay one, since this world declares no plain results."""

    def tool_add(self, state, n):
        state["value"] += n
        return {"value": state["value"], "odd": object() if state["value"] > 5 else None}


def test_a_replay_in_a_world_without_plain_results_still_meets_a_result_that_fails_to_render():
    env = OddResultEnv()
    assert not env.plain_results
    task = env.generate_task(3)
    env.reset(task)
    add = ToolCall(name="add", arguments={"n": 4})
    # from 0: the first add (4) renders, the second (8) does not: rolled back in the replay as in a step
    states = env.replay(env.task, [add, add], [{"value": 0, "target": 4, "finished": False}])
    assert states[0]["value"] == 4


def test_an_inventory_replay_renders_nothing_and_reaches_the_states_a_rendering_replay_reaches(monkeypatch):
    task = inventory_task()
    world = family("inventory").env(outcome_fn=None)
    assert world.plain_results
    world.reset(task)
    calls = list(task.hidden.reference)
    expected = world.replay(world.task, calls, [world.initial_state(world.task)])[0]

    def no_render(tool, result):
        raise AssertionError("a replay rendered a result")

    monkeypatch.setattr(base, "render_result", no_render)
    world2 = family("inventory").env(outcome_fn=None)
    world2.reset(task)
    assert world2.replay(world2.task, calls, [world2.initial_state(world2.task)])[0] == expected
    monkeypatch.undo()
    assert world2.step(calls[0]).observation.startswith('{"ok": true')  # a live step still renders


# -- the inventory initial state, made once per snapshot content ---------------------------------
def test_each_initial_state_is_a_fresh_copy_nothing_an_episode_does_reaches_the_next():
    task = inventory_task()
    world = family("inventory").env(outcome_fn=None)
    first = world.initial_state(task)
    pristine = copy.deepcopy(first)
    sku = next(iter(first["catalog"]))
    first["catalog"][sku]["stock"] = -99
    first["auth"]["status"] = "approved"
    first["events"].append({"seq": 0})
    second = world.initial_state(task)
    assert second == pristine and second["catalog"] is not first["catalog"]
    assert task.initial_state["catalog"][sku]["stock"] != -99


def test_a_snapshot_edited_in_place_after_its_state_was_made_is_checked_again():
    task = inventory_task(5)
    world = family("inventory").env(outcome_fn=None)
    world.initial_state(task)
    sku = next(iter(task.initial_state["catalog"]))
    task.initial_state["catalog"][sku]["stock"] = True  # equal to 1 for ==, not an int stock
    with pytest.raises(InvalidTask, match="not an inventory world"):
        world.initial_state(task)
    task.initial_state["catalog"][sku]["stock"] = 1
    assert world.initial_state(task)["catalog"][sku]["stock"] == 1
    del task.initial_state["holds"]
    with pytest.raises(InvalidTask):
        world.initial_state(task)


def test_equal_snapshots_give_equal_states_and_other_snapshots_their_own():
    a, b = inventory_task(7), inventory_task(7)
    other = inventory_task(8)
    world = family("inventory").env(outcome_fn=None)
    assert a is not b and world.initial_state(a) == world.initial_state(b)
    assert world.initial_state(other) != world.initial_state(a)
    assert world.initial_state(other)["catalog"] == other.initial_state["catalog"]


# -- a replay reads a recorded call as parse_action would check it -------------------------------
@pytest.mark.parametrize("call", [
    ToolCall(name="reserve", arguments={"sku": "SKU-1", "quantity": 2, "auth_token": "tok"}, id="c1"),
    ToolCall(name="find_items", arguments={"query": "red valve"}),
    ToolCall(name="submit", arguments={"status": "reserved", "note": None}),
    ToolCall(name="x", arguments={"f": 1.5, "b": True}),
])
def test_a_plain_call_is_replayed_itself_and_equals_what_parse_action_makes(call):
    assert replay_call(call, 8192) is call
    assert parse_action(call, 8192).call == call


@pytest.mark.parametrize("call", [
    ToolCall.model_construct(name="reserve", arguments={"sku": "\udc00"}, id=""),  # a lone surrogate
    ToolCall.model_construct(name="reserve", arguments={"n": 2**70}, id=""),  # past 64 bits
    ToolCall.model_construct(name="reserve", arguments={"n": float("nan")}, id=""),
    ToolCall.model_construct(name="", arguments={}, id=""),
    ToolCall.model_construct(name="reserve", arguments={"deep": {"er": {"still": 1}}}, id=""),
    ToolCall.model_construct(name="reserve", arguments={"x": (1, 2)}, id=""),  # not JSON
])
def test_any_other_call_gets_exactly_parse_actions_answer(call):
    try:
        expected = parse_action(call, 8192).call
    except ActionError as exc:
        with pytest.raises(ActionError) as got:
            replay_call(call, 8192)
        assert (got.value.kind, got.value.message) == (exc.kind, exc.message)
    else:
        assert replay_call(call, 8192) == expected


def test_a_call_whose_stored_form_is_over_the_size_limit_is_refused_in_a_replay_too():
    call = ToolCall(name="find_items", arguments={"query": "é" * 40})  # 40 chars, 240 as JSON escapes
    limit = len('{"name": "find_items", "arguments": {"query": ""}, "id": ""}') + 100
    with pytest.raises(ActionError) as exc:
        parse_action(call, limit)
    with pytest.raises(ActionError) as got:
        replay_call(call, limit)
    assert got.value.kind == exc.value.kind == "action_too_large"


# -- records from a template ---------------------------------------------------------------------
@pytest.mark.parametrize("cls, fields", [
    (Step, {"index": 0, "observation": "o", "result": "r"}),
    (Step, {"result": "r", "index": 2, "observation": "o", "error": "x", "latency_s": 0.5}),
    (Step, {"index": 1, "observation": "o"}),  # a required field missing: as model_construct leaves it
    (ToolCall, {"name": "a", "arguments": {"k": 1}, "id": "i"}),
    (ToolCall, {"name": "a"}),  # the factory's default made per record
    (StepScore, {"rollout_id": "r", "step_index": 0, "layer": "rules", "scorer_id": "s", "scorer_version": "1",
                 "status": "ok", "score": 0.5, "components": {"a": 1.0}, "rationale": None}),
    # every field, out of order: the record's fields in its own order
    (StepScore, {"rationale": None, "components": {"a": 1.0}, "score": 0.5, "status": "ok", "scorer_version": "1",
                 "scorer_id": "s", "layer": "rules", "step_index": 0, "rollout_id": "r"}),
    # as many keys as fields, one of them no field: not the every-field path
    (StepScore, {"rollout_id": "r", "step_index": 0, "layer": "rules", "scorer_id": "s", "scorer_version": "1",
                 "status": "ok", "score": 0.5, "components": {"a": 1.0}, "not_a_field": None}),
    (StepScore, {"rollout_id": "r", "step_index": 0, "layer": "rules", "scorer_id": "s", "scorer_version": "1"}),
])
def test_construct_makes_what_model_construct_makes(cls, fields):
    made, reference = construct(cls, dict(fields)), cls.model_construct(**fields)
    assert list(made.__dict__.items()) == list(reference.__dict__.items())
    assert made.model_fields_set == reference.model_fields_set
    assert type(made) is cls and made.__pydantic_extra__ is None and made.__pydantic_private__ is None
    assert type(made.__pydantic_fields_set__) is set and made.__pydantic_fields_set__ is not made.__dict__
    if cls is ToolCall and "arguments" not in fields:
        assert construct(cls, dict(fields)).arguments is not made.arguments


def test_the_size_bound_that_lets_a_replay_skip_the_json_is_never_below_the_json():
    import json
    import random

    from gymfoundry.envs.parsing import _json_bound, _shallow_plain

    rng = random.Random(7)
    alphabet = ["a", "\x00", "\x1f", '"', "\\", "é", "\u2028", "\U0001F600", "\ud7ff", "\uffff"]
    scalars = [None, True, False, 0, -2**63, 2**63 - 1, -1.2345678901234567e-300, 1e308, 0.1]
    for _ in range(500):
        text = lambda: "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 20)))  # noqa: E731
        arguments = {text(): rng.choice([text(), rng.choice(scalars)]) for _ in range(rng.randrange(0, 5))}
        form = {"name": text() or "n", "arguments": arguments, "id": text()}
        assert _shallow_plain(form)
        assert _json_bound(form) >= len(json.dumps(form))


def test_a_replayed_call_just_over_the_limit_is_refused_and_one_at_it_is_not():
    import json

    call = ToolCall(name="find_items", arguments={"query": "\U0001F600" * 30})
    size = len(json.dumps({"name": call.name, "arguments": call.arguments, "id": call.id}))
    assert replay_call(call, size) is call
    with pytest.raises(ActionError, match="limit is"):
        replay_call(call, size - 1)
