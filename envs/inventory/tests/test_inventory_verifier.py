import json

import pytest

from gymfoundry.envs.base import EnvFault
from gymfoundry.envs.inventory import InventoryEnv, generate_task
from gymfoundry.envs.inventory.policy import ScriptedInventoryPolicy
from gymfoundry.envs.records import Step, TaskSpec, ToolCall
from gymfoundry.envs.verifier import calls_of
from gymfoundry.envs.inventory.verifier import InventoryVerifier

verifier = InventoryVerifier()


def find_task(pred, level=1) -> TaskSpec:
    return next(t for s in range(500) if pred(t := generate_task(s, level)))


def approved(task):
    return task.hidden.checks["approved"]


def play(task: TaskSpec, actions: list, env: InventoryEnv | None = None) -> InventoryEnv:
    env = env or InventoryEnv()
    env.reset(task)
    for action in actions:
        env.step(action)
    return env


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


def auth(task):
    return call("request_authorization", order_id=task.hidden.checks["order_id"])


def reserve(task, sku, quantity):
    return call("reserve", sku=sku, quantity=quantity, auth_token=task.initial_state["auth"]["token"])


def has_room(t, extra=1):
    """Approved, and the first target's stock is at least its quantity plus `extra`."""
    first = t.hidden.checks["targets"][0]
    return approved(t) and t.initial_state["catalog"][first["sku"]]["stock"] >= first["quantity"] + extra


def passed(report):
    return {name: c.passed for name, c in report.checks.items()}


def test_reference_passes_everything_and_ids_are_versioned():
    task = generate_task(2, 3)
    env = play(task, task.hidden.reference)
    report = verifier.verify(task, env.steps, env.state())
    assert report.verifier_id == "inventory-outcome" and report.verifier_version == "2"
    assert report.success and report.completed and not report.regression and not report.constraint_violation
    assert report.side_effects == [] and report.reasons == [] and not report.disagreement


def test_distractor_reservation_passes_observation_but_breaks_invariants():
    def has_spare_item(t):
        targets = {x["sku"] for x in t.hidden.checks["targets"]}
        return approved(t) and any(s not in targets and i["stock"] > 0 for s, i in t.initial_state["catalog"].items())

    task = find_task(has_spare_item, level=3)
    targets = {x["sku"] for x in task.hidden.checks["targets"]}
    extra = next(s for s, i in task.initial_state["catalog"].items() if s not in targets and i["stock"] > 0)
    actions = [auth(task)] + [reserve(task, t["sku"], t["quantity"]) for t in task.hidden.checks["targets"]]
    env = play(task, actions + [reserve(task, extra, 1), call("submit", status="reserved")])
    report = verifier.verify(task, env.steps, env.state())
    assert passed(report) == {"observation": True, "invariants": False, "hidden_variation": False}
    assert report.disagreement and not report.success
    assert report.completed and not report.regression and not report.constraint_violation
    assert report.side_effects == [f"{extra} held 1 units, goal 0"]
    assert f"non-target {extra} stock changed" in report.checks["invariants"].reasons


def test_slack_stock_rollout_passes_invariants_but_fails_hidden_variation():
    task = find_task(lambda t: has_room(t, extra=t.hidden.checks["targets"][0]["quantity"]))
    target = task.hidden.checks["targets"][0]
    sku, q = target["sku"], target["quantity"]
    env = play(task, [auth(task), reserve(task, sku, q), reserve(task, sku, q),
                      call("release", reservation_id="R-1"), call("submit", status="reserved")])
    report = verifier.verify(task, env.steps, env.state())
    assert passed(report) == {"observation": True, "invariants": True, "hidden_variation": False}
    assert report.disagreement
    # a success that only held thanks to slack stock is not a success
    assert report.completed and not report.regression and not report.constraint_violation
    assert not report.success and report.reasons[-1].startswith("hidden_variation: exact_stock")
    assert report.checks["hidden_variation"].reasons[0] == (
        f"exact_stock: reservations {{}} != expected {{'{sku}': {q}}}")


def test_over_reservation_is_a_side_effect():
    task = find_task(has_room)
    t = task.hidden.checks["targets"][0]
    env = play(task, [auth(task), reserve(task, t["sku"], t["quantity"] + 1), call("submit", status="reserved")])
    report = verifier.verify(task, env.steps, env.state())
    assert report.completed and not report.success
    assert report.side_effects == [f"{t['sku']} held {t['quantity'] + 1} units, goal {t['quantity']}"]
    assert passed(report)["observation"] and not passed(report)["invariants"]


def test_reserve_before_authorisation_is_a_constraint_violation_even_when_refused():
    task = find_task(approved)
    t = task.hidden.checks["targets"][0]
    early = call("reserve", sku=t["sku"], quantity=t["quantity"], auth_token="")
    env = play(task, [early, auth(task), reserve(task, t["sku"], t["quantity"]), call("submit", status="reserved")])
    report = verifier.verify(task, env.steps, env.state())
    assert report.constraint_violation and not report.success
    assert report.reasons == [f"attempted reserve {t['sku']} before authorisation (call 0)"]
    assert all(passed(report).values()) and not report.disagreement


def test_releasing_another_orders_hold_is_a_constraint_violation():
    task = find_task(approved)
    hold = task.initial_state["holds"][0]["hold_id"]
    actions = task.hidden.reference[:-1] + [call("release", reservation_id=hold), task.hidden.reference[-1]]
    report = verifier.verify(task, play(task, actions).steps)
    assert report.constraint_violation and not report.success
    assert report.reasons == [f"attempted to release {hold}, a hold of another order (call {len(actions) - 2})"]


def test_denied_orders():
    task = find_task(lambda t: not approved(t), level=5)
    assert verifier.verify(task, play(task, task.hidden.reference).steps).success

    blind = verifier.verify(task, play(task, [call("submit", status="reserved")]).steps)
    assert not blind.completed and not blind.success
    assert blind.reasons == ["authorisation was never requested", "submitted status 'reserved', expected 'denied'"]

    t = task.hidden.checks["targets"][0]
    pushy = play(task, [auth(task), call("reserve", sku=t["sku"], quantity=1, auth_token="AUTH-x"),
                        call("submit", status="denied")])
    report = verifier.verify(task, pushy.steps)
    assert report.constraint_violation and report.completed and not report.success
    assert report.reasons == [f"attempted reserve {t['sku']} after authorisation was denied (call 1)"]


class WithoutEndings(InventoryVerifier):
    """The verifier with its evidence rule for a denied submit removed."""

    endings = ()


def test_a_blind_denied_submit_fails_for_want_of_the_services_denial():
    task = find_task(lambda t: not approved(t), level=5)
    blind = play(task, [call("submit", status="denied")])
    report = verifier.verify(task, blind.steps, blind.state())
    assert not report.success and not report.completed
    assert report.reasons == ["submit without evidence: authorisation was never requested"]
    assert verifier.potentials(task, blind.steps) == [0.0, 0.0]
    # the rule is the declaration alone: without it the same blind guess is a success, Φ 1.0
    lax = WithoutEndings()
    assert lax.verify(task, blind.steps, blind.state()).success and lax.potentials(task, blind.steps) == [0.0, 1.0]
    # the honest path asks first and is a success under both
    honest = play(task, task.hidden.reference)
    assert verifier.verify(task, honest.steps).success and lax.verify(task, honest.steps).success
    assert [c.name for c in task.hidden.reference] == ["request_authorization", "submit"]


def test_a_denied_submit_of_an_approved_order_names_the_approval():
    task = find_task(approved)
    env = play(task, [auth(task), call("submit", status="denied")])
    report = verifier.verify(task, env.steps)
    assert not report.success and report.reasons[0] == "submitted status 'denied', expected 'reserved'"
    assert report.reasons[-1] == ("submit without evidence: the authorisation service approved the order; "
                                  "it never denied it")
    blind = verifier.verify(task, play(task, [call("submit", status="denied")]).steps)
    assert not blind.success and blind.reasons[-1] == "submit without evidence: authorisation was never requested"


def test_replayed_final_state_matches_the_env_state():
    policy = ScriptedInventoryPolicy(mistake_rate=0.4, seed=3)
    for seed in range(30):
        task = generate_task(seed, 1 + seed % 5)
        env = InventoryEnv()
        policy.reset(seed)
        ts = env.reset(task)
        while not ts.done:
            ts = env.step(policy.act(ts.observation))
        assert InventoryVerifier().replay(task, calls_of(env.steps))[-1] == env.state()
        assert verifier.verify(task, env.steps) == verifier.verify(task, env.steps, env.state())


def test_regression_is_reported_for_a_changed_hold_or_stock():
    task = find_task(approved)
    env = play(task, task.hidden.reference)
    state = env.state()
    state["holds"][0]["quantity"] += 1
    other = next(s for s in state["catalog"] if s not in task.hidden.checks["expected_reservations"])
    state["catalog"][other]["stock"] += 2
    report = verifier.verify(task, env.steps, state)
    assert report.regression and not report.success and not report.checks["invariants"].passed
    assert "other orders' holds changed" in report.reasons
    assert any(r.startswith(f"{other} stock not conserved") for r in report.reasons)


class FlakyEnv(InventoryEnv):
    faults = 1

    def tool_reserve(self, state, **args):
        if self.faults:
            self.faults -= 1
            raise EnvFault("reservation service unavailable")
        return super().tool_reserve(state, **args)


def test_env_fault_steps_are_not_replayed():
    task = find_task(approved)
    t = task.hidden.checks["targets"][0]
    r = reserve(task, t["sku"], t["quantity"])
    env = play(task, [auth(task), r, r, call("submit", status="reserved")], env=FlakyEnv())
    assert [s.error for s in env.steps] == [None, "env_fault", None, None]
    assert calls_of(env.steps)[1] is None
    report = verifier.verify(task, env.steps)
    assert report.success and report == verifier.verify(task, env.steps, env.state())


def test_potential_values():
    task = find_task(has_room, level=3)  # level 3: two targets
    a, b = task.hidden.checks["targets"]
    actions = [auth(task), reserve(task, a["sku"], a["quantity"]), reserve(task, b["sku"], b["quantity"]),
               call("submit", status="reserved")]
    assert verifier.potentials(task, play(task, actions).steps) == [0.0, 0.2, 0.55, 0.9, 1.0]
    wrong_submit = verifier.potentials(task, play(task, actions[:2] + [call("submit", status="denied")]).steps)
    assert wrong_submit == [0.0, 0.2, 0.55, 0.0]
    over = play(task, [auth(task), reserve(task, a["sku"], a["quantity"] + 1)])
    expected = max(0.0, 0.2 + 0.35 - 0.7 / (a["quantity"] + b["quantity"]))
    assert verifier.potential(task, over.state()) == pytest.approx(expected)

    denied = find_task(lambda t: not approved(t), level=5)
    assert verifier.potentials(denied, play(denied, denied.hidden.reference).steps) == [0.0, 0.5, 1.0]


def test_observation_check_reads_only_results():
    task = find_task(approved)
    t = task.hidden.checks["targets"][0]
    confirmation = {"tool": "reserve", "ok": True,
                    "result": {"reservation_id": "R-1", "sku": t["sku"], "quantity": t["quantity"]}}
    fake = [Step(index=0, observation="", result=json.dumps(confirmation)),
            Step(index=1, observation="", result='{"tool": "submit", "ok": true, "result": {"status": "reserved"}}')]
    report = verifier.verify(task, fake)  # level 1: a single target
    assert report.checks["observation"].passed and not report.checks["invariants"].passed
    assert report.disagreement and not report.success and report.reasons[:2] == [
        "authorisation was never requested", "never submitted"]


def test_lookups_change_nothing_but_the_event_log():
    """The variant replay skips `LOOKUPS` (envs/inventory/verifier.py): they must change nothing else,
    whatever the state (before and after authorising, reserving, submitting) and the arguments."""
    import copy

    from gymfoundry.envs.inventory.verifier import LOOKUPS

    for level in (1, 3, 5):
        for seed in range(3):
            task = generate_task(seed, level)
            env = InventoryEnv()
            env.reset(task=task)
            skus = list(task.initial_state["catalog"]) + ["SKU-nope", ""]
            names = [item["name"] for item in task.initial_state["catalog"].values()] + ["valve", "zzz", " "]
            lookups = [call("get_stock", sku=s) for s in skus] + [call("find_items", query=q) for q in names]
            for step in [None, *task.hidden.reference]:
                if step is not None and not env._done:
                    env.step(step)
                for lookup in lookups:
                    assert lookup["name"] in LOOKUPS
                    before = copy.deepcopy(env._state)
                    try:
                        env._run_tool(ToolCall(**lookup))
                    except Exception:
                        pass
                    after = env._state
                    assert {k: v for k, v in after.items() if k != "events"} == \
                           {k: v for k, v in before.items() if k != "events"}
                    assert after["events"][:len(before["events"])] == before["events"]
