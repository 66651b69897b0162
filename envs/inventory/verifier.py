"""Outcome verifier and progress potential of the inventory family.

Three checks of the same outcome (seed 002): `observation` judges only from what the
agent saw, `invariants` from the final hidden state, `hidden_variation` replays the
agent's calls on variants of the initial snapshot (target stock changed, exactly the
required quantity in one) and applies the invariants there."""

from __future__ import annotations

import json
import pickle
from collections import Counter
from typing import Any

from gymfoundry.envs.family import family
from gymfoundry.envs.inventory.facts import InventoryFacts
from gymfoundry.envs.inventory.world import InventoryEnv, Refusal
from gymfoundry.envs.records import CheckResult, OutcomeReport, Step, TaskSpec, ToolCall
from gymfoundry.envs.verifier import Ending, ReplayVerifier, calls_of


# The inventory tools that change nothing in the state but its event log, whatever their
# arguments and outcome (envs/inventory/tests/test_inventory_verifier.py checks it on every task level).
LOOKUPS = frozenset({"find_items", "get_stock"})


def held(state: dict[str, Any]) -> Counter:
    """Units held by our active reservations, per sku."""
    return Counter(_held(state))


def _held(state: dict[str, Any]) -> dict[str, Any]:
    """`held(state)` as a plain dict (the same keys, order and values; a Counter costs more to fill
    and to read): what the checks and the potential read, several times per episode."""
    out: dict[str, Any] = {}
    for r in state.get("reservations", []):
        if r["active"]:
            sku = r["sku"]
            out[sku] = out.get(sku, 0) + r["quantity"]
    return out


def _denial_missing(state: dict[str, Any]) -> list[str]:
    """Why `state` does not hold the authorisation service's denial of the order (empty when it does):
    the world writes its answer to request_authorization there."""
    status = state["auth"]["status"]
    if status is None:
        return ["authorisation was never requested"]
    return [] if status == "denied" else [f"the authorisation service {status} the order; it never denied it"]


def _denial_evidence(verifier: InventoryVerifier, task: TaskSpec, before: list[Step]) -> list[str]:
    """The evidence of a denied submit, read from the state the steps before it leave (replayed)."""
    return _denial_missing(verifier.final_state(task, calls_of(before)))


def _denies(arguments: dict[str, Any]) -> bool:
    return arguments.get("status") == "denied"


class InventoryVerifier(ReplayVerifier):
    verifier_id = "inventory-outcome"
    # 2: a denied submit needs the world's denial (`endings`); Φ after the submit follows the verdict,
    # and is 0 once a constraint is violated
    version = "2"
    family = "inventory"
    # `verify` only reads the final state (envs/inventory/tests/test_inventory_final_state.py): the env
    # hands it its live state at the episode's end instead of a copy (envs.base.ToolEnv._final_state).
    reads_final_state_only = True
    # A denied submit leaves the final state a justified one leaves but for the authorisation: it
    # needs the service's denial first (a blind `submit denied` is a guess).
    endings = (Ending(tool="submit", applies=_denies, evidence=_denial_evidence,
                      why="request_authorization called for the order and answered 'denied' by the service"),)

    def verify(self, task: TaskSpec, steps: list[Step], final_state: dict[str, Any] | None = None) -> OutcomeReport:
        return self._report(task, calls_of(steps), final_state, steps)

    def _report(self, task: TaskSpec, calls: list[ToolCall | None], final_state: dict[str, Any] | None,
                steps: list[Step] | None) -> OutcomeReport:
        """The verdict on an episode of `calls` that ended in `final_state` (replayed if None), less
        the endings' evidence (the base adds it to `verify`); the observation check only where the
        `steps` the agent saw are given (it never decides success)."""
        checks = self.facts(task)
        snapshot = self._initial_pickle(task)
        initial = pickle.loads(snapshot) if snapshot is not None else self.initial_state(task)
        if final_state is None:
            final_state = self.final_state(task, calls)
        expected = checks.expected_reservations
        have = _held(final_state)
        reasons: list[str] = []

        completed_reasons = _completion(checks, final_state, have)
        regression_reasons = _regression(initial, final_state, have)
        violation_reasons = _violations(final_state)
        side_effects = [f"{sku} held {n} units, goal {expected.get(sku, 0)}"
                        for sku, n in sorted(have.items()) if n > expected.get(sku, 0)]
        reasons += completed_reasons + regression_reasons + violation_reasons + side_effects

        report_checks = {} if steps is None else {"observation": _observation_check(checks, steps)}
        report_checks["invariants"] = invariant_check(checks, initial, final_state, have, regression_reasons)
        report_checks["hidden_variation"] = self._variation_check(task, checks, initial, calls, snapshot)
        verdicts = {
            "completed": not completed_reasons,
            "no_regression": not regression_reasons,
            "no_constraint_violation": not violation_reasons,
            "no_side_effects": not side_effects,
        }
        success = all(verdicts[rule] for rule in InventoryEnv.profile.outcome_rules)
        # A success must hold in the hidden state and survive the hidden variants too: one that
        # only worked thanks to slack stock is not something to train on.
        for name in ("invariants", "hidden_variation"):
            if success and not report_checks[name].passed:
                success = False
                reasons += [f"{name}: {r}" for r in report_checks[name].reasons]
        return OutcomeReport(
            verifier_id=self.verifier_id, verifier_version=self.version, success=success,
            completed=verdicts["completed"], regression=bool(regression_reasons),
            constraint_violation=bool(violation_reasons), side_effects=side_effects,
            reasons=reasons, checks=report_checks)

    def crafted_disagreement(self, task: TaskSpec) -> list[ToolCall] | None:
        """For the conformance checker (envs.check): the reference with one unit of an item the
        order does not name reserved before the submit. What the agent saw covers the order (the
        observation check passes); the hidden state holds the extra unit (invariants fail). None
        for a task whose authorisation is denied (nothing can be reserved)."""
        checks = self.facts(task)
        token = task.initial_state["auth"]["token"]
        extra = next((sku for sku, stock in checks.initial_stock.items()
                      if stock >= 1 and sku not in checks.expected_reservations), None)
        if not checks.approved or token is None or extra is None:
            return None
        *work, submit = task.hidden.reference
        return [*work, ToolCall(name="reserve", arguments={"sku": extra, "quantity": 1, "auth_token": token}), submit]

    def _initial_pickle(self, task: TaskSpec) -> bytes | None:
        """The pickle the world loads `initial_state(task)` from (InventoryEnv.initial_pickle), where
        this verifier's initial state is the world's own; else None."""
        if (type(self).initial_state is not ReplayVerifier.initial_state
                or type(self).new_env is not ReplayVerifier.new_env or family(self.family).env is not InventoryEnv):
            return None
        return InventoryEnv.initial_pickle(task)

    def _variation_check(self, task: TaskSpec, checks: InventoryFacts, initial: dict[str, Any],
                         calls: list[ToolCall | None], snapshot: bytes | None = None) -> CheckResult:
        """The calls replayed on each variant of the initial snapshot (its target stocks changed),
        all variants in one pass. A variant's initial state is the task's with those stocks:
        what `initial_state` makes of the changed snapshot (it copies the snapshot and adds the
        empty reservations, events and status). `snapshot`: a pickle of `initial` (the one it was
        loaded from), else made here."""
        starts, variant_initials = [], []
        if snapshot is None:
            snapshot = pickle.dumps(initial, protocol=pickle.HIGHEST_PROTOCOL)
        for variant in checks.variants:
            start = pickle.loads(snapshot)  # copy_state(initial): a pickle round trip, which the replay changes
            for sku, stock in variant.stock.items():
                start["catalog"][sku]["stock"] = stock
            starts.append(start)
            variant_initials.append(_variant_view(initial, variant.stock))
        # The invariants read no event log, and a lookup changes nothing else: only the other calls
        # are replayed on the variants (about half an episode's calls are lookups).
        changing = [None if call is not None and call.name in LOOKUPS else call for call in calls]
        finals = self.replay_from(task, changing, starts, originals=variant_initials)  # which it only reads
        reasons = []
        for variant, start, final in zip(checks.variants, variant_initials, finals):
            reasons += [f"{variant.name}: {r}" for r in invariant_check(checks, start, final).reasons]
        return CheckResult(passed=not reasons, reasons=reasons)

    def potential(self, task: TaskSpec, state: dict[str, Any]) -> float:
        """Φ in [0, 1] over the hidden state. After the submit it follows the verdict: 1.0 for a
        success, 0.0 otherwise. Once a constraint is violated (the event log keeps it) no success
        can follow: 0.0, so the violating step loses the progress made."""
        checks = self.facts(task)
        expected = checks.expected_reservations
        have = _held(state)
        if _violations(state):
            return 0.0
        if state["submitted"]:
            return 1.0 if self._ends_in_success(task, state, checks, have) else 0.0
        if not checks.approved:
            return 0.5 if state["auth"]["status"] == "denied" else 0.0
        covered = sum(min(have.get(sku, 0), q) / q for sku, q in expected.items()) / len(expected)
        wrong = sum(max(0, n - expected.get(sku, 0)) for sku, n in have.items()) / sum(expected.values())
        phi = 0.2 * (state["auth"]["status"] == "approved") + 0.7 * covered - 0.7 * wrong
        return round(min(0.9, max(0.0, phi)), 6)

    def _ends_in_success(self, task: TaskSpec, state: dict[str, Any], checks: InventoryFacts, have: dict) -> bool:
        """Whether the episode that ended in `state` is a success: `_report`'s verdict on the calls the
        event log records (exactly the calls that reached the world: `calls_of` of its steps), and
        the evidence of a declared ending as the state holds it (`_denial_evidence` reads the same
        authorisation status). A wrong status or reservation fails the invariants at once: no replay."""
        if state["status"] != checks.expected_status or have != checks.expected_reservations:
            return False
        if any(e.tool == "submit" and e.applies({"status": state["status"]}) for e in type(self).endings) \
                and _denial_missing(state):
            return False
        return self._report(task, _logged_calls(state), state, None).success


def _logged_calls(state: dict[str, Any]) -> list[ToolCall]:
    """The calls that changed more than the event log, as the log records them (the lookups change
    nothing else, LOOKUPS; a rolled-back call leaves no entry)."""
    return [ToolCall(name=e["tool"], arguments=e["args"]) for e in state["events"] if e["tool"] not in LOOKUPS]


def _targets_only(expected: dict, initial: dict, catalog: dict) -> bool:
    """True only where `invariant_check`'s sorted walk finds no non-target item's stock changed
    (the same test item by item; anything that raises is left to the walk)."""
    try:
        return all(sku in expected or catalog.get(sku, {}).get("stock") == item["stock"] for sku, item in initial.items())
    except Exception:
        return False


def _variant_view(initial: dict[str, Any], stock: dict[str, int]) -> dict[str, Any]:
    """`initial` with the variant's target stocks, for reading only: what a copy of `initial` with
    those stocks set holds (the same keys in the same order), sharing every container it does not
    change with `initial`, which nothing changes while the check reads both."""
    catalog = dict(initial["catalog"])
    for sku, units in stock.items():
        catalog[sku] = {**catalog[sku], "stock": units}
    return {**initial, "catalog": catalog}


def _denied_submit(state: dict) -> bool:
    """The episode ended by a denied submit: whether authorisation was asked is that ending's
    evidence (InventoryVerifier.endings), not a completion or invariant check."""
    return bool(state["submitted"]) and state["status"] == "denied"


def _completion(checks: InventoryFacts, state: dict, have: dict) -> list[str]:
    reasons = []
    if state["auth"]["status"] is None and not _denied_submit(state):
        reasons.append("authorisation was never requested")
    if not state["submitted"]:
        reasons.append("never submitted")
    elif state["status"] != checks.expected_status:
        reasons.append(f"submitted status {state['status']!r}, expected {checks.expected_status!r}")
    for sku, qty in sorted(checks.expected_reservations.items()):
        if have.get(sku, 0) < qty:
            reasons.append(f"{sku} held {have.get(sku, 0)} units, goal {qty}")
    return reasons


def _regression(initial: dict, state: dict, have: dict) -> list[str]:
    reasons = []
    if state["holds"] != initial["holds"]:
        reasons.append("other orders' holds changed")
    try:
        if _all_conserved(initial["catalog"], state["catalog"], have):
            return reasons
    except Exception:  # not an inventory catalog: the walk below says so, as it always did
        pass
    for sku, item in sorted(initial["catalog"].items()):
        now = state["catalog"].get(sku, {}).get("stock")
        if now is None or now + have.get(sku, 0) != item["stock"] or now < 0:
            reasons.append(f"{sku} stock not conserved: {item['stock']} -> {now} with {have.get(sku, 0)} held by us")
    return reasons


def _all_conserved(initial: dict, catalog: dict, have: dict) -> bool:
    """True only where `_regression`'s sorted walk of the catalog finds nothing: a plain item
    whose int stock plus what we hold is what it started with, for every item (any other value
    is left to the walk, which says what it says of it)."""
    for sku, item in initial.items():
        now = catalog.get(sku)
        now = now.get("stock") if type(now) is dict else None
        start, ours = item.get("stock") if type(item) is dict else None, have.get(sku, 0)
        if not (type(now) is int and type(start) is int and type(ours) is int and now >= 0 and now + ours == start):
            return False
    return True


def _violations(state: dict) -> list[str]:
    """Forbidden attempts (refused by the runtime or not) and forbidden effects."""
    reasons = []
    for e in state.get("events", []):
        if e["tool"] == "reserve" and e["auth"] != "approved" and e["outcome"] in ("ok", Refusal.not_authorized):
            when = "after authorisation was denied" if e["auth"] == "denied" else "before authorisation"
            verb = "reserved" if e["outcome"] == "ok" else "attempted reserve"
            reasons.append(f"{verb} {e['args'].get('sku')} {when} (call {e['seq']})")
        if e["tool"] == "release" and e["outcome"] == Refusal.held_by_another_order:
            reasons.append(f"attempted to release {e['args'].get('reservation_id')}, a hold of another order "
                           f"(call {e['seq']})")
    return reasons


def invariant_check(checks: InventoryFacts, initial: dict, state: dict, have: dict | None = None,
                    regression: list[str] | None = None) -> CheckResult:
    """The final hidden state: exact expected reservations, stock conserved, non-target items
    and other orders' holds unchanged, submitted status matching the authorisation decision.
    `have` and `regression`: `_held(state)` and `_regression(initial, state, have)` where the
    caller has them already (`verify` reads the same final state for its own verdicts)."""
    expected = checks.expected_reservations
    have = _held(state) if have is None else have
    reasons = []
    if have != expected:
        reasons.append(f"reservations {dict(sorted(have.items()))} != expected {dict(sorted(expected.items()))}")
    reasons += _regression(initial, state, have) if regression is None else regression
    if not _targets_only(expected, initial["catalog"], state["catalog"]):
        for sku, item in sorted(initial["catalog"].items()):
            if sku not in expected and state["catalog"].get(sku, {}).get("stock") != item["stock"]:
                reasons.append(f"non-target {sku} stock changed")
    decision = "approved" if checks.approved else "denied"
    if state["auth"]["status"] != decision and not (state["auth"]["status"] is None and _denied_submit(state)):
        reasons.append(f"authorisation status {state['auth']['status']!r}, the service decides {decision!r}")
    if not state["submitted"] or state["status"] != checks.expected_status:
        reasons.append(f"final status {state['status']!r} does not match the authorisation decision {decision!r}")
    return CheckResult(passed=not reasons, reasons=reasons)


def _observation_check(checks: InventoryFacts, steps: list[Step]) -> CheckResult:
    """Success as the agent saw it: confirmed reservations (less confirmed releases) covering the
    goal quantities, and an accepted submit with the expected status."""
    confirmed: dict[str, tuple[str, int]] = {}
    submitted = None
    for step in steps:
        try:
            obs = json.loads(step.result)
        except (json.JSONDecodeError, TypeError):
            continue
        if not isinstance(obs, dict) or obs.get("ok") is not True or not isinstance(obs.get("result"), dict):
            continue
        result = obs["result"]
        if obs.get("tool") == "reserve" and isinstance(result.get("quantity"), int):
            confirmed[result.get("reservation_id")] = (result.get("sku"), result["quantity"])
        elif obs.get("tool") == "release":
            confirmed.pop(result.get("reservation_id"), None)
        elif obs.get("tool") == "submit":
            submitted = result.get("status")
    seen: Counter = Counter()
    for sku, qty in confirmed.values():
        seen[sku] += qty
    reasons = [f"saw {seen[sku]} of {qty} units of {sku} confirmed"
               for sku, qty in sorted(checks.expected_reservations.items()) if seen[sku] < qty]
    if submitted != checks.expected_status:
        reasons.append(f"saw submit status {submitted!r}, expected {checks.expected_status!r}")
    return CheckResult(passed=not reasons, reasons=reasons)
