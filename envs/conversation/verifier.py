"""Outcome verifier and progress potential of the conversation family.

The gold is the reference dialogue replayed (on a fresh env with the scripted customer: the
database never depends on what the customer says). Reported separately, with reasons:
- completed: each request settled as the policy makes of it (the facts' expectations, and the
  target orders equal to the gold replay's), everything the customer had to be told said in a
  message (a refund amount after its action, a refusal), the conversation ended as it must
  (resolved, or transferred to a human);
- regression: any other order changed;
- constraint violation (from the event log): an account action before identity was verified
  (refused or not), a cancel of an order that was not pending, a return outside the window or
  refunded to another payment method, an exchange for a different product;
- side effects: the database changed outside the orders.
Three checks of the same outcome: `observation` (what the agent saw and said), `invariants` (the
final database's hash equals the gold's; the diff in the reasons) and `hidden_variation` (the
agent's calls and the gold replayed on databases where a distractor order differs)."""

from __future__ import annotations

import copy
from typing import Any

from envs.conversation.facts import ConversationFacts, Mention, Request
from envs.conversation.world import ACCOUNT_TOOLS, ConversationEnv, Refusal
from envs.records import CheckResult, OutcomeReport, Step, TaskSpec, ToolCall, content_hash
from envs.scripted import tool_result
from verifiers.base import ReplayVerifier, calls_of

REFUSAL_WORDS = ("cannot", "can't", "can not", "unable", "not able", "not allowed", "not possible", "won't be able")
MESSAGE_TOOLS = ("respond", "end_conversation")
WRITE_TOOLS = ("cancel_order", "return_items", "exchange_items", "modify_address")
MAX_DIFF = 8


def database(state: dict[str, Any]) -> dict[str, Any]:
    return {k: state[k] for k in ("customers", "orders", "products")}


def db_hash(state: dict[str, Any]) -> str:
    return content_hash(database(state))


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON values differ, as `path: a -> b` lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in diff(a.get(k), b.get(k), f"{path}.{k}" if path
                                                                       else str(k))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {_short(a)} -> {_short(b)}"]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class ConversationVerifier(ReplayVerifier):
    verifier_id = "conversation-outcome"
    version = "1"
    family = "conversation"

    def __init__(self) -> None:
        self._gold: dict[str, dict[str, Any]] = {}

    def new_env(self):
        return ConversationEnv(outcome_fn=None, simulator="scripted")

    def gold(self, task: TaskSpec) -> dict[str, Any]:
        """The final state of the reference replayed (cached per task id; variants have their own)."""
        if task.task_id not in self._gold:
            if len(self._gold) > 256:
                self._gold.clear()
            self._gold[task.task_id] = self.final_state(task, list(task.hidden.reference))
        return self._gold[task.task_id]

    def verify(self, task: TaskSpec, steps: list[Step], final_state: dict[str, Any] | None = None) -> OutcomeReport:
        facts: ConversationFacts = self.facts(task)
        calls = calls_of(steps)
        initial = self.initial_state(task)
        final = self.final_state(task, calls) if final_state is None else final_state
        gold = self.gold(task)
        targets = {r.order_id for r in facts.requests if r.order_id}

        gold_diff = diff(database(gold), database(final))
        completed = [p for r in facts.requests for p in request_problems(r, initial, final)]
        completed += [f"target order differs from the gold replay: {d}" for d in gold_diff
                      if d.split(":")[0].split(".")[:2] in [["orders", t] for t in targets]]
        completed += mention_problems(facts, final, initial["return_days"])
        completed += end_problems(facts, final)
        regression = [f"another order changed: {d}" for oid in sorted(initial["orders"]) if oid not in targets
                      for d in diff(initial["orders"][oid], final["orders"].get(oid), f"orders.{oid}")]
        violations = policy_violations(final, initial["return_days"])
        side_effects = [d for d in gold_diff if not d.startswith("orders.")]

        checks = {"observation": observation_check(facts, steps),
                  "invariants": invariant_check(gold, final),
                  "hidden_variation": self._variation_check(task, facts, calls)}
        verdicts = {"completed": not completed, "no_regression": not regression,
                    "no_constraint_violation": not violations, "no_side_effects": not side_effects}
        success = all(verdicts[rule] for rule in ConversationEnv.profile.outcome_rules)
        reasons = completed + regression + violations + side_effects
        for name in ("invariants", "hidden_variation"):  # a success must hold there too
            if success and not checks[name].passed:
                success = False
                reasons += [f"{name}: {r}" for r in checks[name].reasons]
        return OutcomeReport(verifier_id=self.verifier_id, verifier_version=self.version, success=success,
                             completed=not completed, regression=bool(regression),
                             constraint_violation=bool(violations), side_effects=side_effects, reasons=reasons,
                             checks=checks)

    def potential(self, task: TaskSpec, state: dict[str, Any]) -> float:
        """Φ in [0, 1]: identity verified, target orders read, requests settled, what must be said
        said; less after a violation or a regression; 1.0 only once the conversation ended with
        everything right, 0.0 if it ended otherwise."""
        facts: ConversationFacts = self.facts(task)
        initial = task.initial_state
        with_orders = [r for r in facts.requests if r.order_id]
        settled = [not request_problems(r, initial, state) for r in with_orders]
        said = [not mention_problems(facts, state, initial["return_days"], only=[m]) for m in facts.mentions]
        bad = bool(policy_violations(state, initial["return_days"])) or any(
            state["orders"].get(oid) != order for oid, order in initial["orders"].items()
            if oid not in {r.order_id for r in with_orders})
        if state["ended"] is not None:
            right = all(settled) and all(said) and not bad and not end_problems(facts, state)
            return 1.0 if right else 0.0
        read = {e["args"].get("order_id") for e in state["events"] if e["tool"] == "get_order" and e["outcome"] == "ok"}

        def share(flags: list[bool]) -> float:
            return sum(flags) / len(flags) if flags else 1.0

        phi = (0.15 * (state["verified"] == facts.customer_id) + 0.1 * share([r.order_id in read for r in with_orders])
               + 0.4 * share(settled) + 0.2 * share(said) - 0.3 * bad)
        return round(min(0.9, max(0.0, phi)), 6)

    def crafted_disagreement(self, task: TaskSpec) -> list[ToolCall] | None:
        """The reference plus a change to a distractor order before the last call: everything the
        agent saw and said covers the requests (observation passes), the database differs from
        the gold's (invariants fail). None where no distractor can be changed."""
        facts: ConversationFacts = self.facts(task)
        *work, last = task.hidden.reference
        for oid in facts.distractor_orders:
            order = task.initial_state["orders"][oid]
            if order["status"] in ("pending", "processing"):
                extra = ToolCall(name="modify_address", arguments={"order_id": oid, "address": "1 Crafted Road, Nowhere"})
            elif order["status"] == "delivered":
                extra = ToolCall(name="return_items", arguments={"order_id": oid, "item_ids": [order["items"][0]["item_id"]],
                                                                 "payment_method_id": order["payment_method_id"]})
            else:
                continue
            return [*work, extra, last]
        return None

    def _variation_check(self, task: TaskSpec, facts: ConversationFacts, calls: list[ToolCall | None]) -> CheckResult:
        reasons = []
        for variant in facts.variants[:2]:
            snapshot = copy.deepcopy(task.initial_state)
            order = snapshot["orders"][variant.order_id]
            order["status"] = variant.status
            for item in order["items"]:
                item["price_cents"] += variant.price_delta_cents
            order["total_cents"] = sum(i["price_cents"] for i in order["items"])
            variant_task = TaskSpec.model_validate({**task.model_dump(), "initial_state": snapshot, "task_id": ""})
            result = invariant_check(self.gold(variant_task), self.final_state(variant_task, calls))
            reasons += [f"{variant.name} ({variant.order_id} {variant.status}): {r}" for r in result.reasons]
        return CheckResult(passed=not reasons, reasons=reasons)


def invariant_check(gold: dict[str, Any], final: dict[str, Any]) -> CheckResult:
    """The final database against the gold replay's: equal hashes, or the diff."""
    want, have = db_hash(gold), db_hash(final)
    if want == have:
        return CheckResult(passed=True, reasons=[])
    lines = diff(database(gold), database(final))
    more = [f"and {len(lines) - MAX_DIFF} more differences"] if len(lines) > MAX_DIFF else []
    return CheckResult(passed=False, reasons=[f"database hash {have} != gold {want}", *lines[:MAX_DIFF], *more])


def request_problems(r: Request, initial: dict[str, Any], state: dict[str, Any]) -> list[str]:
    """What is not as the policy makes of one request, in the state's database."""
    if r.order_id is None:
        return []
    before, after = initial["orders"][r.order_id], state["orders"].get(r.order_id) or {}
    label = f"{r.kind} of {r.order_id} ({r.product})"
    if not r.allowed:
        return [] if after == before else [f"{label}: the order changed although the policy forbids the request "
                                           f"({r.trap})"]
    refunds = after.get("refunds", [])
    refunded = any(f["amount_cents"] == r.refund_cents and f["payment_method_id"] == r.payment_method_id
                   for f in refunds[len(before["refunds"]):])
    items = {i["item_id"]: i for i in after.get("items", [])}
    problems = []
    if r.kind == "cancel" and after.get("status") != "cancelled":
        problems.append(f"{label}: status {after.get('status')!r}, expected 'cancelled'")
    if r.kind == "return" and any(items.get(i, {}).get("status") != "returned" for i in r.item_ids):
        problems.append(f"{label}: items {r.item_ids} not returned")
    if r.kind in ("cancel", "return") and not refunded and not problems:
        problems.append(f"{label}: no refund of {r.refund_cents} cents to {r.payment_method_id} (the original "
                        f"payment method); refunds {refunds[len(before['refunds']):]}")
    if r.kind == "exchange" and any((items.get(i, {}).get("exchanged_to") or {}).get("variant_id") != r.new_variant_id
                                    for i in r.item_ids):
        problems.append(f"{label}: not exchanged for variant {r.new_variant_id}")
    if r.kind == "address" and after.get("address") != r.address:
        problems.append(f"{label}: address {after.get('address')!r}, expected {r.address!r}")
    return problems


def _messages(state: dict[str, Any]) -> list[tuple[int, str]]:
    return [(e["seq"], e["args"].get("message", "")) for e in state["events"]
            if e["tool"] in MESSAGE_TOOLS and e["outcome"] == "ok"]


def mention_problems(facts: ConversationFacts, state: dict[str, Any], return_days: int,
                     only: list[Mention] | None = None) -> list[str]:
    """What the customer had to be told and was not: an amount said after its action, a refusal."""
    messages = _messages(state)
    problems = []
    for m in facts.mentions if only is None else only:
        if m.kind == "amount":
            done = [e["seq"] for e in state["events"] if e["tool"] in ("cancel_order", "return_items")
                    and e["outcome"] == "ok" and e["args"].get("order_id") == m.order_id]
            if not done or not any(seq > done[0] and m.text in text for seq, text in messages):
                problems.append(f"the customer was never told the refund of {m.text} for {m.order_id}")
        elif not any(m.text.lower() in text.lower() and any(w in text.lower() for w in REFUSAL_WORDS)
                     for _, text in messages):
            problems.append(f"the customer was never told that the request about {m.text!r} cannot be done")
    return problems


def end_problems(facts: ConversationFacts, state: dict[str, Any]) -> list[str]:
    if state["ended"] == facts.expected_end:
        return []
    if state["ended"] is None:
        return ["the conversation never ended"]
    return [f"the conversation ended {state['ended']!r}, expected {facts.expected_end!r}"]


def policy_violations(state: dict[str, Any], return_days: int) -> list[str]:
    """The policy's rules, judged from the event log (attempts before verification count too)."""
    out = []
    for e in state["events"]:
        where, oid = f"(call {e['seq']})", e["args"].get("order_id")
        if e["tool"] in ACCOUNT_TOOLS and e.get("verified") is None and e["outcome"] in (
                "ok", Refusal.identity_not_verified.value):
            out.append(f"{e['tool']} {oid} before the customer's identity was verified {where}")
        if e["outcome"] != "ok":
            continue
        if e["tool"] == "cancel_order" and e.get("status_before") != "pending":
            out.append(f"cancelled {oid} while it was {e.get('status_before')} (only pending orders) {where}")
        if e["tool"] == "return_items":
            if (e.get("days_since_delivery") or 0) > return_days:
                out.append(f"returned items of {oid} delivered {e['days_since_delivery']} days ago (the window is "
                           f"{return_days}) {where}")
            if not e.get("original_payment"):
                out.append(f"refunded {oid} to {e['args'].get('payment_method_id')}, not the original payment method "
                           f"{where}")
        if e["tool"] == "exchange_items" and not e.get("same_product"):
            out.append(f"exchanged an item of {oid} for a different product {where}")
    return out


def observation_check(facts: ConversationFacts, steps: list[Step]) -> CheckResult:
    """Success as the agent saw and said it: each allowed request's action confirmed, no confirmed
    action on an order whose request is refused, the messages, and the expected end confirmed."""
    confirmed: dict[str, list[tuple[str, dict]]] = {}
    said, ended = [], None
    for step in steps:
        result = tool_result(step.result) if step.tool_call else None
        if result is None:
            continue
        name = step.tool_call.name
        if name in WRITE_TOOLS:
            confirmed.setdefault(result.get("order_id"), []).append((name, result))
        if name in MESSAGE_TOOLS:
            said.append(step.tool_call.arguments.get("message", ""))
        if name == "end_conversation":
            ended = "resolved"
        elif name == "transfer_to_human":
            ended = "transferred"
    tool = {"cancel": "cancel_order", "return": "return_items", "exchange": "exchange_items", "address": "modify_address"}
    reasons = []
    for r in facts.requests:
        if r.order_id is None:
            continue
        seen = confirmed.get(r.order_id, [])
        if not r.allowed and seen:
            reasons.append(f"saw {seen[0][0]} confirmed on {r.order_id}, whose request the policy forbids")
        elif r.allowed and not any(name == tool[r.kind] for name, _ in seen):
            reasons.append(f"saw no {tool[r.kind]} confirmed on {r.order_id}")
    for m in facts.mentions:
        if not any(m.text.lower() in text.lower() for text in said):
            reasons.append(f"never said {m.text!r}")
    if ended != facts.expected_end:
        reasons.append(f"saw the conversation end {ended!r}, expected {facts.expected_end!r}")
    return CheckResult(passed=not reasons, reasons=reasons)
