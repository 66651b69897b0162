"""The inventory env hands its verifier the live final state instead of a copy
(envs.base.ToolEnv._final_state, `reads_final_state_only`): that is only right while `verify`
never changes the state it reads. Checked on played episodes and hostile states (each must be
exactly as it was, and the report what a copy gets), and at the env: which outcome functions get
the live state and which a copy."""

from __future__ import annotations

import copy
import pickle
import random

import gymfoundry.envs.inventory.verifier as inv
from gymfoundry.envs.base import ToolEnv
from gymfoundry.envs.inventory import InventoryEnv, generate_task
from gymfoundry.envs.records import ToolCall
from gymfoundry.envs.inventory.tests.test_inventory_check_shortcuts import hostile_states, outcome, played

verifier = inv.InventoryVerifier()


def test_verify_leaves_every_state_exactly_as_it_was_and_reports_what_a_copy_gets():
    rng = random.Random(11)
    compared = 0
    for task, env in played(range(8)):
        final = env.state()
        for state in [final, *hostile_states(task, final, rng)]:
            before = pickle.dumps(state)
            spare = copy.deepcopy(state)
            live = outcome(lambda: verifier.verify(task, env.steps, state).model_dump())
            assert pickle.dumps(state) == before  # nothing of it changed, not even a key order
            assert live == outcome(lambda: verifier.verify(task, env.steps, spare).model_dump())
            compared += 1
    assert compared > 500


class Recording:
    """An outcome function's owner that keeps the state it was given (and may change it)."""

    reads_final_state_only = True

    def __init__(self):
        self.seen = []

    def terminal_reward(self, task, steps, final_state):
        self.seen.append(final_state)
        final_state["submitted"] = "changed by the outcome function"
        return 0.0, {}


class NotDeclared(Recording):
    reads_final_state_only = False


class Inherits(Recording):
    pass  # the flag must be declared by the class itself, not inherited


class OwnState(InventoryEnv):
    def state(self):
        return {**super().state(), "extra": True}


def finish(env: ToolEnv, task):
    env.reset(task)
    return env.step(ToolCall(name="submit", arguments={"status": "reserved"}))


def test_only_a_declared_reader_of_a_plain_state_gets_the_live_state():
    task = generate_task(3, 2)
    owner = Recording()
    env = InventoryEnv(outcome_fn=owner.terminal_reward)
    finish(env, task)
    assert owner.seen[0] is env._state  # the live state, no copy

    for kind in (NotDeclared, Inherits):
        owner = kind()
        env = InventoryEnv(outcome_fn=owner.terminal_reward)
        finish(env, task)
        assert owner.seen[0] is not env._state and env._state["submitted"] is True  # a copy: the env's is untouched

    owner = Recording()
    env = OwnState(outcome_fn=owner.terminal_reward)
    finish(env, task)
    assert owner.seen[0]["extra"] is True and env._state["submitted"] is True  # its own state(), as before

    seen = []
    env = InventoryEnv(outcome_fn=lambda t, s, f: seen.append(f) or (0.0, {}))
    finish(env, task)
    assert seen[0] is not env._state  # a plain function: a copy


def test_the_inventory_verifier_declares_it_and_an_episode_reports_what_a_copy_gets(monkeypatch):
    assert inv.InventoryVerifier.__dict__["reads_final_state_only"] is True
    task = generate_task(5, 4)
    calls = [*task.hidden.reference]
    live = InventoryEnv(outcome_fn=verifier.terminal_reward)
    live.reset(task)
    for call in calls:
        ts = live.step(call)
    monkeypatch.setattr(inv.InventoryVerifier, "reads_final_state_only", False)
    copied = InventoryEnv(outcome_fn=verifier.terminal_reward)
    copied.reset(task)
    for call in calls:
        ts_copy = copied.step(call)
    assert ts.terminated and ts.reward == ts_copy.reward == 1.0 and ts.info["outcome"] == ts_copy.info["outcome"]
    assert pickle.dumps(live._state) == pickle.dumps(copied._state)
