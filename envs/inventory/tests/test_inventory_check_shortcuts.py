"""The inventory verifier's cheaper checks (envs/inventory/verifier.py: `_held` a plain dict, the
unsorted "nothing to report" passes of `_regression` and `invariant_check`, the variants' read-only
initial states) against the code they replaced, written out here: the same reasons in the same
order, the same potentials and reports, on played episodes and on hostile hidden states."""

from __future__ import annotations

import copy
import pickle
import random
from collections import Counter

import pytest

import gymfoundry.envs.inventory.verifier as inv
from gymfoundry.envs.inventory import InventoryEnv, generate_task
from gymfoundry.envs.inventory.policy import ScriptedInventoryPolicy
from gymfoundry.envs.records import CheckResult
from gymfoundry.envs.verifier import calls_of

verifier = inv.InventoryVerifier()


# -- the replaced code, as it was ----------------------------------------------------------------
def old_held(state):
    out = Counter()
    for r in state.get("reservations", []):
        if r["active"]:
            out[r["sku"]] += r["quantity"]
    return out


def old_regression(initial, state, have):
    reasons = []
    if state["holds"] != initial["holds"]:
        reasons.append("other orders' holds changed")
    for sku, item in sorted(initial["catalog"].items()):
        now = state["catalog"].get(sku, {}).get("stock")
        if now is None or now + have[sku] != item["stock"] or now < 0:
            reasons.append(f"{sku} stock not conserved: {item['stock']} -> {now} with {have[sku]} held by us")
    return reasons


def old_invariant_check(checks, initial, state):
    expected = checks.expected_reservations
    have = old_held(state)
    reasons = []
    if dict(have) != expected:
        reasons.append(f"reservations {dict(sorted(have.items()))} != expected {dict(sorted(expected.items()))}")
    reasons += old_regression(initial, state, have)
    for sku, item in sorted(initial["catalog"].items()):
        if sku not in expected and state["catalog"].get(sku, {}).get("stock") != item["stock"]:
            reasons.append(f"non-target {sku} stock changed")
    decision = "approved" if checks.approved else "denied"
    blind_denied = state["auth"]["status"] is None and state["submitted"] and state["status"] == "denied"
    if state["auth"]["status"] != decision and not blind_denied:  # that ending's evidence decides it
        reasons.append(f"authorisation status {state['auth']['status']!r}, the service decides {decision!r}")
    if not state["submitted"] or state["status"] != checks.expected_status:
        reasons.append(f"final status {state['status']!r} does not match the authorisation decision {decision!r}")
    return CheckResult(passed=not reasons, reasons=reasons)


def old_potential(task, checks, state):
    expected = checks.expected_reservations
    have = old_held(state)
    if inv._violations(state):
        return 0.0
    if state["submitted"]:  # after the submit, the verdict (the ending's evidence as the state keeps it)
        correct = state["status"] == checks.expected_status and dict(have) == expected
        justified = state["status"] != "denied" or state["auth"]["status"] == "denied"
        return 1.0 if correct and justified and verifier._report(task, inv._logged_calls(state), state, None).success \
            else 0.0
    if not checks.approved:
        return 0.5 if state["auth"]["status"] == "denied" else 0.0
    covered = sum(min(have[sku], q) / q for sku, q in expected.items()) / len(expected)
    wrong = sum(max(0, n - expected.get(sku, 0)) for sku, n in have.items()) / sum(expected.values())
    phi = 0.2 * (state["auth"]["status"] == "approved") + 0.7 * covered - 0.7 * wrong
    return round(min(0.9, max(0.0, phi)), 6)


def old_variant_initial(initial, stock):
    start = pickle.loads(pickle.dumps(initial, protocol=pickle.HIGHEST_PROTOCOL))
    for sku, units in stock.items():
        start["catalog"][sku]["stock"] = units
    return start


# -- hostile states --------------------------------------------------------------------------------
def hostile_states(task, final, rng):
    """Edits of a final state that each break (or almost break) one thing the checks read."""
    skus = sorted(final["catalog"])
    target = rng.choice(skus)
    edits = [
        lambda s: s["catalog"][target].__setitem__("stock", s["catalog"][target]["stock"] + 1),
        lambda s: s["catalog"][target].__setitem__("stock", -1),
        lambda s: s["catalog"][target].__setitem__("stock", True),
        lambda s: s["catalog"][target].__setitem__("stock", float(s["catalog"][target]["stock"])),
        lambda s: s["catalog"][target].__setitem__("stock", None),
        lambda s: s["catalog"][target].pop("stock"),
        lambda s: s["catalog"].pop(target),
        lambda s: s["catalog"].__setitem__("SKU-NEW", {"name": "new", "stock": 3}),
        lambda s: s["catalog"].__setitem__(target, {**s["catalog"][target]}) or s["catalog"].pop(skus[0]),
        lambda s: s["reservations"].append({"reservation_id": "R-x", "sku": target, "quantity": 0, "active": True}),
        lambda s: s["reservations"].append({"reservation_id": "R-y", "sku": target, "quantity": 2, "active": True}),
        lambda s: s["reservations"].append({"reservation_id": "R-z", "sku": "SKU-GONE", "quantity": 1, "active": True}),
        lambda s: [r.__setitem__("active", False) for r in s["reservations"]],
        lambda s: s["holds"].append({"hold_id": "H-x", "order_id": "O-x", "sku": target, "quantity": 1}),
        lambda s: s.update(submitted=True, status="reserved"),
        lambda s: s.update(submitted=False),
        lambda s: s["auth"].update(status="denied"),
        lambda s: s.__setitem__("catalog", []),
        lambda s: s["catalog"].__setitem__(target, ["not", "an", "item"]),
    ]
    for edit in edits:
        state = copy.deepcopy(final)
        edit(state)
        yield state


def outcome(fn, *args):
    """What `fn(*args)` returns, or the type and text of what it raises."""
    try:
        return ("ok", fn(*args))
    except Exception as exc:
        return ("raised", type(exc).__name__, str(exc))


def played(seeds, levels=(1, 2, 3, 4, 5), mistake_rate=0.5):
    for seed in seeds:
        for level in levels:
            task = generate_task(seed, level)
            env = InventoryEnv()
            ts = env.reset(task)
            policy = ScriptedInventoryPolicy(mistake_rate=mistake_rate)
            policy.reset(seed)
            while not ts.done and len(env.steps) < 30:
                ts = env.step(policy.act(ts.observation))
            yield task, env


def test_checks_and_potential_equal_the_replaced_code_on_played_and_hostile_states():
    rng = random.Random(7)
    compared = 0
    for task, env in played(range(12)):
        checks = verifier.facts(task)
        initial = verifier.initial_state(task)
        final = env.state()
        for state in [final, *hostile_states(task, final, rng)]:
            assert outcome(inv.invariant_check, checks, initial, state) == outcome(old_invariant_check, checks, initial,
                                                                                     state)
            assert outcome(verifier.potential, task, state) == outcome(old_potential, task, checks, state)
            assert outcome(inv._held, state) == outcome(lambda s: dict(old_held(s)), state)
            assert outcome(lambda: list(inv._held(state))) == outcome(lambda: list(old_held(state)))
            if isinstance(state.get("catalog"), dict):
                have = old_held(state)
                assert outcome(inv._regression, initial, state, dict(have)) == outcome(old_regression, initial, state,
                                                                                       have)
            compared += 1
    assert compared > 1000


def test_a_variant_view_holds_what_a_copy_with_the_stocks_set_holds():
    for task, _ in played(range(6)):
        initial = verifier.initial_state(task)
        before = pickle.dumps(initial)
        for variant in verifier.facts(task).variants:
            view = inv._variant_view(initial, variant.stock)
            old = old_variant_initial(initial, variant.stock)
            assert view == old and list(view) == list(old) and list(view["catalog"]) == list(old["catalog"])
            assert all(list(view["catalog"][s]) == list(old["catalog"][s]) for s in old["catalog"])
            assert pickle.dumps(view) == pickle.dumps(old)  # a crash rollback copies it: the same copy
        assert pickle.dumps(initial) == before  # the view changed nothing of `initial`
    with pytest.raises(KeyError):
        inv._variant_view(initial, {"SKU-NOT-THERE": 1})


def test_the_variation_check_and_reports_equal_those_made_with_copies(monkeypatch):
    """Episodes' reports with the variants read from views, and with copies as before."""
    episodes = list(played(range(10)))
    new = [verifier.verify(task, env.steps, env.state()).model_dump() for task, env in episodes]
    crashing = [verifier._variation_check(task, verifier.facts(task), verifier.initial_state(task),
                                          calls_of(env.steps)[:-1] + [None]) for task, env in episodes]
    monkeypatch.setattr(inv, "_variant_view", old_variant_initial)
    # the old check works out what it reads itself (verify hands the new one its own `have` and regression)
    monkeypatch.setattr(inv, "invariant_check", lambda checks, initial, state, *_: old_invariant_check(
        checks, initial, state))
    old = [verifier.verify(task, env.steps, env.state()).model_dump() for task, env in episodes]
    assert new == old
    assert crashing == [verifier._variation_check(task, verifier.facts(task), verifier.initial_state(task),
                                                  calls_of(env.steps)[:-1] + [None]) for task, env in episodes]
    assert any(not r["success"] for r in new) and any(r["success"] for r in new)
