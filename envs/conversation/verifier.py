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
  refunded to another payment method, an exchange for a different product, and anything the agent
  told the customer that the world did not do (a cancellation, return, exchange or address change
  of an order, a refund of an amount to a payment method) or a return window the policy does not
  have (`false_statements`);
- side effects: the database changed outside the orders.
Ending the conversation (or transferring it) needs its evidence (`endings`, enforced by the base):
the customer's identity verified and the order of each request the policy refuses read, as the
world's event log shows; a refusal sent blind leaves the database exactly as a justified one.
Three checks of the same outcome: `observation` (what the agent saw and said), `invariants` (the
final database's hash equals the gold's; the diff in the reasons) and `hidden_variation` (the
agent's calls and the gold replayed on databases where a distractor order differs)."""

from __future__ import annotations

import copy
import re
import unicodedata
from typing import Any

from gymfoundry.envs.conversation.facts import ConversationFacts, Mention, Request
from gymfoundry.envs.conversation.world import ACCOUNT_TOOLS, ConversationEnv, Refusal, _days_since, money
from gymfoundry.envs.records import CheckResult, OutcomeReport, Step, TaskSpec, ToolCall, content_hash
from gymfoundry.envs.scripted import tool_result
from gymfoundry.envs.verifier import Ending, ReplayVerifier, calls_of, ending_step

REFUSAL_WORDS = ("cannot", "can't", "can not", "unable", "not able", "not allowed", "not possible", "won't be able")
MESSAGE_TOOLS = ("respond", "end_conversation")
ENDING_TOOLS = ("end_conversation", "transfer_to_human")
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


def decision_problems(facts: ConversationFacts, state: dict[str, Any]) -> list[str]:
    """What the agent had not looked at when the conversation ended: the customer's identity
    verified (find_customer) and the order of each request the policy refuses read (get_order):
    whether a request is refused turns on the order's status and dates, which only the world shows."""
    problems = [] if state["verified"] == facts.customer_id else [
        "the customer's identity was never verified (find_customer)"]
    read = {e["args"].get("order_id") for e in state["events"] if e["tool"] == "get_order" and e["outcome"] == "ok"}
    problems += [f"order {r.order_id} ({r.product}), whose {r.kind} the policy refuses, was never read (get_order)"
                 for r in facts.requests if r.order_id and not r.allowed and r.order_id not in read]
    return problems


def _ending_evidence(verifier: ConversationVerifier, task: TaskSpec, before: list[Step]) -> list[str]:
    return decision_problems(verifier.facts(task), verifier.final_state(task, calls_of(before)))


class ConversationVerifier(ReplayVerifier):
    verifier_id = "conversation-outcome"
    # 2: endings need their evidence, what the customer is told is checked against the world, Φ
    # after the end follows the verdict
    version = "2"
    family = "conversation"
    endings = tuple(Ending(tool=tool, evidence=_ending_evidence,
                           why="the customer's identity verified and the order of every request the policy "
                               "refuses read, before the conversation ends")
                    for tool in ENDING_TOOLS)
    statements = {"respond": ("message",), "end_conversation": ("message",)}

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
        if final["ended"] is not None and ending_step(steps, set(ENDING_TOOLS)) is None:
            completed += decision_problems(facts, final)  # the customer closed it: no ending to hold the evidence
        regression = [f"another order changed: {d}" for oid in sorted(initial["orders"]) if oid not in targets
                      for d in diff(initial["orders"][oid], final["orders"].get(oid), f"orders.{oid}")]
        violations = policy_violations(final, initial["return_days"]) + false_statements(final, initial)
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
        said; less after a violation or a regression. Once the conversation ended it follows the
        verdict: 1.0 with everything right (the evidence of the ending gathered, nothing false told,
        the rest of the database as it was), else 0.0."""
        facts: ConversationFacts = self.facts(task)
        initial = task.initial_state
        with_orders = [r for r in facts.requests if r.order_id]
        settled = [not request_problems(r, initial, state) for r in with_orders]
        said = [not mention_problems(facts, state, initial["return_days"], only=[m]) for m in facts.mentions]
        bad = bool(policy_violations(state, initial["return_days"])) or any(
            state["orders"].get(oid) != order for oid, order in initial["orders"].items()
            if oid not in {r.order_id for r in with_orders})
        if state["ended"] is not None:
            right = (all(settled) and all(said) and not bad and not end_problems(facts, state)
                     and not decision_problems(facts, state) and not false_statements(state, initial)
                     and all(state[k] == initial[k] for k in ("customers", "products")))
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
            if not done or not any(seq > done[0] and any(m.text in c and not _negated(c, c.index(m.text))
                                                          for c in clauses(text)) for seq, text in messages):
                problems.append(f"the customer was never told the refund of {m.text} for {m.order_id}")
        elif not any(any(w in part for w in REFUSAL_WORDS) for _, text in messages
                     for part in about(text, normal(m.text), others=[normal(r.product) for r in facts.requests
                                                                     if r.product and r.product != m.text])):
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


# -- what the agent tells the customer, against the world ----------------------------------------
# A message is read normalised (`normal`), by sentences (a question states nothing) cut into
# clauses at commas, colons, dashes and contrast words. A clause claims nothing where a negation
# comes before its claim ("I cannot cancel") or a negated auxiliary after it ("was not refunded"),
# or where it opens with what the customer wants ("I see you would like a refund"). Claims are judged
# against the world at the end (a refund announced before it is made is true once it is made).
_DASHES = re.compile("[\u2010-\u2015\u2212\ufe58\ufe63\uff0d]")
_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")
_CLAUSE = re.compile(r",|:(?:\s|$)|\s-+\s|\b(?:but|however|although|though|whereas)\b")
_NEG_BEFORE = re.compile(r"\b(?:not|no|never|cannot|unable|nor|neither|cant|wont|didnt|couldnt|wasnt|hasnt|havent)\b"
                         r"|n't\b")
_NEG_AFTER = re.compile(r"\b(?:is|are|was|were|has|have|had|will|would|could|can|be|been|do|does|did)\s+(?:not|never)\b"
                        r"|\b(?:isn|aren|wasn|weren|hasn|haven|hadn|won|wouldn|couldn|can|didn)'?t\b")
_THEIR_WISH = re.compile(r"^(?:\S+ ){0,3}you(?:'d like| would like| want| wanted| asked| said| mentioned| requested"
                         r"| wish)\b")
_AMOUNT = re.compile(r"\$\s?(\d+(?:\.\d{1,2})?)|(?<![\d.])(\d+(?:\.\d{1,2})?)\s?(?:usd|dollars?)\b"
                     r"|\busd\s?(\d+(?:\.\d{1,2})?)")
_REFUND = re.compile(r"\brefund|\breimburs|\bcredited\b|\bmoney back\b|\b(?:paid|sent|put|given) back\b")
_PAID_WITH = {"gift_card": re.compile(r"\bgift ?-?cards?\b"), "credit_card": re.compile(r"\bcredit ?-?cards?\b"),
              "paypal": re.compile(r"\bpay ?-?pal\b"),
              "original": re.compile(r"\b(?:original|same) (?:payment|method|card|account)")}
PAID_WITH_NAMES = {"gift_card": "gift card", "credit_card": "credit card", "paypal": "PayPal account",
                   "original": "original payment method"}
_DONE = {"cancel_order": re.compile(r"\bcancell?ed\b"),
         "return_items": re.compile(r"\breturned\b|\bprocessed (?:the |your )?return\b"),
         "exchange_items": re.compile(r"\bexchanged\b|\bswapped\b"),
         "modify_address": re.compile(r"\b(?:changed|updated|modified|corrected)\b(?=.*\baddress\b)"
                                      r"|\baddress\b.*\b(?:changed|updated|modified|corrected)\b")}
# "... was not cancelled", "did not return ...": a denial, false where the world did it
_DENIED = {tool: re.compile(r"\b(?:(?:was|were|is|are|has|have|had)(?:n't| not| never)(?: been)?|did not|didn't|never) "
                            rf"(?:{verbs})\b")
           for tool, verbs in {"cancel_order": "cancell?ed|cancel", "return_items": "returned|return",
                               "exchange_items": "exchanged|exchange|swapped",
                               "modify_address": "changed|updated|modified|change|update|modify"}.items()}
_ORDER_ID = re.compile(r"(?<![a-z0-9])#?w(\d{6})\b")
_DAYS = re.compile(r"\b(\d+)\s?-?\s?days?\b")
_WINDOW = re.compile(r"\breturn|\bwindow\b|\bpolicy\b")


def normal(text: str) -> str:
    """Unicode NFKC, format characters (zero-width, soft hyphen) dropped, case folded, dashes and
    quotes made ASCII, thousands separators dropped, spaces collapsed."""
    text = "".join(c for c in unicodedata.normalize("NFKC", text) if unicodedata.category(c) != "Cf").casefold()
    text = _DASHES.sub("-", text).replace("\u2019", "'").replace("\u2018", "'")
    return " ".join(re.sub(r"(?<=\d),(?=\d{3}\b)", "", text).split())


def clauses(text: str) -> list[str]:
    """The clauses of the statements (not the questions) of a message, normalised."""
    return [c.strip() for sentence in _SENTENCE.split(normal(text)) if not sentence.rstrip().endswith("?")
            for c in _CLAUSE.split(sentence) if c and c.strip()]


def about(text: str, name: str, others: list[str]) -> list[str]:
    """The parts of a message about `name`: from each sentence naming it up to the next sentence
    that names one of `others` (normalised)."""
    parts, current = [], None
    for sentence in _SENTENCE.split(normal(text)):
        if name in sentence:
            current = [sentence]
            parts.append(current)
        elif current is not None and any(o in sentence for o in others):
            current = None
        elif current is not None:
            current.append(sentence)
    return [" ".join(part) for part in parts]


def _negated(clause: str, at: int) -> bool:
    return bool(_NEG_BEFORE.search(clause, 0, at) or _NEG_AFTER.search(clause, at))


def false_statements(state: dict[str, Any], initial: dict[str, Any]) -> list[str]:
    """What the agent's messages claim that the world did not do: a cancellation, return, exchange
    or address change (of the order or product the clause names, else of any order), a refund (of
    the amount, to the kind of payment method the clause names), or a return window other than the
    policy's (a number of days that is neither the window nor any order's days since delivery)."""
    events = [e for e in state["events"] if e["outcome"] == "ok"]
    kind_of = {p["payment_method_id"]: p["kind"] for c in state["customers"].values() for p in c["payment_methods"]}
    refunds = [(f["amount_cents"], kind_of.get(f["payment_method_id"]), False) for o in initial["orders"].values()
               for f in o["refunds"]]
    refunds += [(e["refund_cents"], kind_of.get(e["refund_to"]), e["tool"] == "cancel_order" or e["original_payment"])
                for e in events if "refund_cents" in e]
    done = {(e["tool"], e["args"].get("order_id")) for e in events if e["tool"] in WRITE_TOOLS}
    for oid, order in initial["orders"].items():  # what was so before the conversation may be said too
        done |= {("cancel_order", oid)} if order["status"] == "cancelled" else set()
        done |= {("return_items", oid) for i in order["items"] if i["status"] == "returned"}
        done |= {("exchange_items", oid) for i in order["items"] if i["status"] == "exchanged"}
    products = {p["name"].casefold(): pid for pid, p in state["products"].items()}
    with_product = {pid: {o["order_id"] for o in state["orders"].values()
                          if any(i["product_id"] == pid for i in o["items"])} for pid in products.values()}
    days = {initial["return_days"]} | {_days_since(initial, o) for o in initial["orders"].values()}
    out = []
    for e in state["events"]:
        if e["tool"] not in MESSAGE_TOOLS or e["outcome"] != "ok":
            continue
        for clause in clauses(e["args"].get("message", "")):
            why = _clause_falsity(clause, refunds, done, products, with_product, days)
            if why:
                out.append(f"told the customer \"{_short_text(clause)}\" (call {e['seq']}), but {why}")
    return out


def _clause_falsity(clause: str, refunds: list[tuple[int, str | None, bool]], done: set[tuple[str, str]],
                    products: dict[str, str], with_product: dict[str, set[str]], days: set[int]) -> str | None:
    """Why one clause is false, or None."""
    for found in _DAYS.finditer(clause):  # a rule stated, negated or not ("no returns after 14 days")
        if _WINDOW.search(clause) and int(found.group(1)) not in days:
            return f"the policy's return window is not {found.group(1)} days"
    if _THEIR_WISH.search(clause):
        return None
    amounts = [round(float(next(g for g in m.groups() if g)) * 100) for m in _AMOUNT.finditer(clause)]
    paid_with = [k for k, pattern in _PAID_WITH.items() if pattern.search(clause)]
    refund = _REFUND.search(clause)
    if refund or (amounts and paid_with):
        at = min(x.start() for x in [refund, _AMOUNT.search(clause), *(p.search(clause) for p in _PAID_WITH.values())]
                 if x is not None)
        if not _negated(clause, at):
            fits = [r for r in refunds
                    if not paid_with or any(r[2] if k == "original" else r[1] == k for k in paid_with)]
            to = f" to the {' or '.join(PAID_WITH_NAMES[k] for k in paid_with)}" if paid_with else ""
            if not fits:
                return f"no refund{to} was made"
            possible = {r[0] for r in fits} | {sum(r[0] for r in fits)}
            wrong = [a for a in amounts if a not in possible]
            if wrong:
                made = ", ".join(money(r[0]) for r in fits)
                return f"no refund of {money(wrong[0])}{to} was made (only {made})"
    targets = {f"#W{m.group(1)}" for m in _ORDER_ID.finditer(clause)} or {
        oid for name, pid in products.items() if name in clause for oid in with_product[pid]}
    for tool, pattern in _DONE.items():
        if tool == "modify_address" and "address" not in clause:
            continue
        denied = _DENIED[tool].search(clause)
        if denied and targets and "already" not in clause:
            if any((tool, oid) in done for oid in targets):
                return f"{tool} was done on {', '.join(sorted(oid for oid in targets if (tool, oid) in done))}"
            continue
        found = pattern.search(clause)
        if found is None or _negated(clause, found.start()):
            continue
        happened = any((tool, oid) in done for oid in targets) if targets else any(t == tool for t, _ in done)
        if not happened:
            return f"{tool} was never done on {', '.join(sorted(targets)) or 'any order'}"
    return None


def _short_text(text: str) -> str:
    return text if len(text) <= 100 else text[:97] + "..."


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
