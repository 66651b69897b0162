"""The inventory verifier loads its initial state and the variants' starts from the pickle the
world keeps (InventoryEnv.initial_pickle) instead of asking for a state and pickling it again:
the same states, byte for byte, and the same reports or errors, on played episodes, first sights
and snapshots edited in place (wrong types, values pickle refuses)."""

from __future__ import annotations

import pickle
import threading

import pytest

import gymfoundry.envs.inventory.verifier as inv
from gymfoundry.envs.inventory import InventoryEnv, generate_task
from gymfoundry.envs.inventory.tests.test_inventory_check_shortcuts import outcome, played

verifier = inv.InventoryVerifier()


def test_the_pickle_loads_the_state_initial_state_makes_first_sight_or_not():
    for seed in range(40, 46):
        for level in (1, 3, 5):
            task = generate_task(seed, level)
            first = InventoryEnv.initial_pickle(task)  # made here: nothing remembered yet
            again = InventoryEnv.initial_pickle(task)
            state = InventoryEnv().initial_state(task)
            assert first == again == pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
            assert pickle.loads(first) == state and list(pickle.loads(first)) == list(state)


def reports(episodes, monkeypatch, shortcut: bool):
    with monkeypatch.context() as m:
        if not shortcut:
            m.setattr(inv.InventoryVerifier, "_initial_pickle", lambda self, task: None)
        return [outcome(lambda: verifier.verify(task, env.steps, env.state()).model_dump())
                for task, env in episodes]


def test_reports_equal_those_made_from_a_fresh_initial_state(monkeypatch):
    episodes = list(played(range(10)))
    ours = reports(episodes, monkeypatch, shortcut=True)
    assert ours == reports(episodes, monkeypatch, shortcut=False)
    assert all(r[0] == "ok" for r in ours)
    assert any(r[1]["success"] for r in ours) and any(not r[1]["checks"]["hidden_variation"]["passed"] for r in ours)


@pytest.mark.parametrize("edit", [
    lambda s, sku: s["catalog"][sku].__setitem__("stock", True),      # not an int stock: refused
    lambda s, sku: s.pop("holds"),                                   # not an inventory world
    lambda s, sku: s["catalog"][sku].__setitem__("lock", threading.Lock()),  # pickle refuses it
    lambda s, sku: s["catalog"][sku].__setitem__("note", {"nested": [1, 2]}),  # plain, but new content
    lambda s, sku: s["catalog"][sku].__setitem__("stock", 0),
])
def test_a_snapshot_edited_in_place_gets_what_the_general_path_gets(edit, monkeypatch):
    results = []
    for shortcut in (True, False):
        (task, env), = played([3], levels=(4,))
        sku = next(iter(task.initial_state["catalog"]))
        edit(task.initial_state, sku)
        results.append(reports([(task, env)], monkeypatch, shortcut))
    assert results[0] == results[1]


def test_a_verifier_whose_initial_state_is_its_own_does_not_use_the_worlds_pickle():
    class Own(inv.InventoryVerifier):
        def initial_state(self, task):
            return super().initial_state(task)

    task = generate_task(2, 2)
    assert Own()._initial_pickle(task) is None and verifier._initial_pickle(task) is not None
