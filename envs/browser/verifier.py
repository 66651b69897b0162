"""Outcome verifier and progress potential of the browser family.

The verdict is read from the site's final database (the orders placed: product, option,
quantity, price paid, address; the account's contact details and addresses) and how the episode
ended, against the task's hidden facts; never from text the agent wrote, except the final answer
of a question, which is read as one number and compared with the site's own value (and succeeds only
if the page holding it, the product's or the order's own, showed it to the agent before answering:
a 404 or results page repeating the agent's own url or query shows nothing), and a purchase's answer, which must name the
order the database holds (ids are only extracted from it). An infeasible task is solved only by
`report_infeasible` with nothing bought or changed, after the site showed what makes it so (a blind
report leaves the same database as a justified one): the account's addresses page, for an address
that is not there; for a product, the results of a search that would list any product fitting the
goal, each of them shown not to fit by its line in the results (price, listed attributes) or its own
page (every attribute, the options).

Three checks of the outcome: `observation` (what the agent was shown: the order confirmation page,
the value on a page it saw, the site's "saved" notice), `invariants` (the final hidden state), and
`hidden_variation`: the agent's calls replayed on two variants of the site, its results listed in
another order and the distractor nearest the target changed. Element ids name what an element does
(a product's link is the same id wherever the product is listed), so a replay acts on the same
products, buttons and options: a trajectory that chose by attributes holds on the variants; one
that depended on where a product sat (paging through unfiltered results to the page it was on)
clicks an id that is not on the variant's page and buys nothing there."""

from __future__ import annotations

import copy
import re
from typing import Any
from urllib.parse import urlsplit

from gymfoundry.envs.records import CheckResult, OutcomeReport, Step, TaskSpec, ToolCall
from gymfoundry.envs.scripted import tool_result
from gymfoundry.envs.verifier import Ending, ReplayVerifier, calls_of

from .facts import BrowserFacts
from .rules import affordable, as_number, describe, misses, offers, satisfying
from .site import ACCOUNT, FORM, HOST, PROFILE_LINK, SAVE, Site, money
from .world import BrowserEnv

CONTACT = ("email", "phone", "default_address")


def judge(facts: BrowserFacts, site: dict[str, Any], state: dict[str, Any]) -> dict[str, list[str]]:
    """Why the task is not done, by aspect: incomplete, violation (over budget), regression (an
    existing account value changed unasked), side_effects (orders or addresses added unasked)."""
    out = {"incomplete": [], "violation": [], "regression": [], "side_effects": []}
    ending = state["ending"]
    if ending is None:
        out["incomplete"].append("the task was not finished (no answer or report_infeasible)")
    elif not facts.feasible and ending["tool"] != "report_infeasible":
        out["incomplete"].append(f"the task is infeasible ({facts.why_infeasible}), but it ended with "
                                 f"{ending['tool']} {ending['text'][:80]!r} instead of report_infeasible")
    elif facts.feasible and ending["tool"] == "report_infeasible":
        out["incomplete"].append(f"reported the task infeasible, but it can be done{_how(facts, site)}")
    if facts.kind == "buy":
        _judge_orders(facts, site, state, out)
        if facts.feasible and state["orders"] and ending and ending["tool"] == "answer":
            _judge_order_number(state["orders"][-1]["order_id"], ending["text"], out)
    else:
        out["side_effects"] += [f"placed order {o['order_id']} though the task buys nothing" for o in state["orders"]]
    if facts.kind == "info" and facts.feasible and ending and ending["tool"] == "answer":
        value = as_number(ending["text"])
        if value is None:
            out["incomplete"].append(f"the answer {ending['text'][:80]!r} is not one number")
        elif round(value, 2) != round(facts.answer, 2):
            out["incomplete"].append(f"answered {value:g}, which is not the {_asked(facts)} shown on the site")
    _judge_account(facts, site, state, out)
    return out


ORDER_NUMBER = re.compile(r"(?<![A-Za-z0-9])W(\d+)(?![A-Za-z0-9])", re.IGNORECASE)


def _judge_order_number(placed: str, text: str, out: dict[str, list[str]]) -> None:
    """A buy goal asks for the order number: the answer must name exactly the order the site placed
    (the database's id; the text is only searched for ids like W58823, never trusted beyond that)."""
    named = sorted({f"W{n}" for n in ORDER_NUMBER.findall(text)})
    if named != [placed]:
        says = f"names {', '.join(named)}" if named else "names no order number"
        out["incomplete"].append(f"the answer {text[:80]!r} {says}; the order placed is {placed}")


def _how(facts: BrowserFacts, site: dict[str, Any]) -> str:
    if facts.target:
        return f": {facts.target} ({site['products'][facts.target]['name']}) fits"
    return ""


def _asked(facts: BrowserFacts) -> str:
    return {"price": "product's price", "rating": "product's rating", "order_total": "order's total"}[facts.question]


def _judge_orders(facts: BrowserFacts, site: dict[str, Any], state: dict[str, Any], out: dict[str, list[str]]) -> None:
    orders, wanted, products = state["orders"], facts.wanted, site["products"]
    if not facts.feasible:
        for order in orders:
            pids = ", ".join(f"{x['pid']} ({x['name']})" for x in order["lines"])
            out["incomplete"].append(f"placed order {order['order_id']} for {pids}, but the task is infeasible: "
                                     f"{facts.why_infeasible}")
        return
    if not orders:
        out["incomplete"].append("no order was placed")
        return
    if len(orders) > 1:
        out["side_effects"].append(f"placed {len(orders)} orders ({', '.join(o['order_id'] for o in orders)}); "
                                   "the task asks for one")
    order = orders[-1]
    if len(order["lines"]) != 1:
        out["incomplete"].append(f"order {order['order_id']} holds {len(order['lines'])} products; the task asks for one")
    for line in order["lines"]:
        product = products[line["pid"]]
        for what, got, want in misses(product, wanted):
            out["incomplete"].append(f"bought {line['pid']} ({line['name']}), whose {what} is {got}; the task asks "
                                     f"for {want}")
        name, value = wanted.option
        if line["options"].get(name) != value:
            out["incomplete"].append(f"bought {line['name']} in {name} {line['options'].get(name)}; the task asks "
                                     f"for {name} {value}")
        if line["qty"] != wanted.quantity:
            out["incomplete"].append(f"bought {line['qty']} of {line['name']}; the task asks for {wanted.quantity}")
    if order["total"] > wanted.budget:
        out["violation"].append(f"paid {money(order['total'])} for order {order['order_id']}, over the budget of "
                                f"{money(wanted.budget)}")
    if order["address_id"] != facts.address_id:
        want = next(a["label"] for a in site["account"]["addresses"] if a["id"] == facts.address_id)
        out["incomplete"].append(f"shipped order {order['order_id']} to {order['ship_to'].split(':')[0]}; the task "
                                 f"asks for {want}")


def _judge_account(facts: BrowserFacts, site: dict[str, Any], state: dict[str, Any], out: dict[str, list[str]]) -> None:
    before, now = site["account"], state["account"]
    want = facts.account_after or {**{k: before[k] for k in CONTACT}, "addresses": before["addresses"]}
    asked = facts.change if facts.feasible else None
    for field in CONTACT:
        if now[field] != want[field]:
            line = f"the account's {field.replace('_', ' ')} is {now[field]!r}; it should be {want[field]!r}"
            (out["incomplete"] if field == _field(asked) else out["regression"]).append(line)
    old = {a["id"]: a for a in before["addresses"]}
    wanted_new = [_place(a) for a in want["addresses"] if a["id"] not in old]
    for a in now["addresses"]:
        if a["id"] in old:
            if a != old[a["id"]]:
                out["regression"].append(f"the address {old[a['id']]['label']!r} changed")
        elif _place(a) in wanted_new:
            wanted_new.remove(_place(a))
        else:
            out["side_effects"].append(f"added the address {a['label']!r} ({a['street']}, {a['city']} {a['zip']}), "
                                       "which the task does not ask for")
    out["incomplete"] += [f"no address {a['label']!r} ({a['street']}, {a['city']} {a['zip']}) was added"
                          for a in wanted_new]


def _place(address: dict[str, str]) -> dict[str, str]:
    return {k: address[k] for k in ("label", "street", "city", "zip")}


def _field(change: str | None) -> str | None:
    return {"phone": "phone", "default_address": "default_address"}.get(change)


def unshown(facts: BrowserFacts, site: dict[str, Any], state: dict[str, Any]) -> list[str]:
    """Why what the site showed does not establish that an infeasible task cannot be done (empty
    when it does, and for a feasible task). Read from what the world recorded it showed: the pages
    visited, the searches run and the product lines in view on their results."""
    if facts.feasible:
        return []
    if facts.kind == "account":
        if "/account/addresses" in state["visited"]:
            return []
        return [f"the account's addresses page, which shows that {facts.why_infeasible}, was never opened"]
    products, wanted = site["products"], facts.wanted

    def ruled_out(pid: str) -> bool:
        p = products[pid]
        if f"/product/{pid}" in state["visited"]:  # its page shows every attribute, the price and the options
            return bool(misses(p, wanted)) or facts.kind == "buy" and not (offers(p, wanted) and affordable(p, wanted))
        if pid in state["listed"]:  # its line: the name (so the category), the price, the listed attributes
            return (p["category"] != wanted.category or facts.kind == "buy" and not affordable(p, wanted)
                    or any(p[k] != v for k, v in wanted.attributes.items() if k in site["listing_attrs"]))
        return False

    shop = Site(site)
    for search in state["searched"]:
        if shop.lists_any(search, wanted) and all(map(ruled_out, shop.results(shop.query_of(search))[0])):
            return []
    return [f"the site never showed that {facts.why_infeasible}: no search that would list "
            f"{describe(wanted)} had each of its results shown not to fit (by its line or its own page)"]


def _infeasibility_seen(verifier: BrowserVerifier, task: TaskSpec, before: list[Step]) -> list[str]:
    """The evidence of `report_infeasible`: what the world showed in the steps before it."""
    facts = verifier.facts(task)
    if facts.feasible:  # the verdict already fails the report
        return []
    return unshown(facts, task.initial_state["site"], verifier.final_state(task, calls_of(before)))


class BrowserVerifier(ReplayVerifier):
    verifier_id = "browser-outcome"
    version = "4"  # bump when a verdict changes; `gymfoundry reverify` re-judges stored rollouts
    family = "browser"
    # what the browser shows and where it is, not the shop's data (orders, cart, account, ending):
    # a click that only moved or typed changed no world (the audit's collateral)
    ephemeral_state = ("events", "url", "history", "scroll", "inputs", "visited", "searched", "listed")
    endings = (Ending(tool="report_infeasible", evidence=_infeasibility_seen,
                      why="the site showed that nothing fits: the results of a search that would list any "
                          "fitting product, each shown not to fit by its line or its page; or the account's "
                          "addresses without the one named"),)

    def verify(self, task: TaskSpec, steps: list[Step], final_state: dict[str, Any] | None = None) -> OutcomeReport:
        facts, calls = self.facts(task), calls_of(steps)
        final = self.final_state(task, calls) if final_state is None else final_state
        found = judge(facts, task.initial_state["site"], final)
        invariants = CheckResult(passed=not any(found.values()), reasons=[r for v in found.values() for r in v])
        checks = {"observation": _observation(facts, task.initial_state["site"], steps), "invariants": invariants,
                  "hidden_variation": self._variation(task, facts, calls, final)}
        verdicts = {"completed": not found["incomplete"], "no_constraint_violation": not found["violation"],
                    "no_regression": not found["regression"], "no_side_effects": not found["side_effects"]}
        success = all(verdicts[rule] for rule in self.profile_rules())
        reasons = list(invariants.reasons)
        # a success must hold on the variants too; an answer to a question must also have been read
        # off a page the agent saw before answering, or a blind guess of the number would win
        required = ["observation", "hidden_variation"] if facts.kind == "info" and facts.feasible else ["hidden_variation"]
        for name in required:
            if success and not checks[name].passed:
                success = False
                reasons += [f"{name}: {r}" for r in checks[name].reasons]
        return OutcomeReport(verifier_id=self.verifier_id, verifier_version=self.version, success=success,
                             completed=verdicts["completed"], regression=bool(found["regression"]),
                             constraint_violation=bool(found["violation"]), side_effects=found["side_effects"],
                             reasons=reasons, checks=checks)

    @staticmethod
    def profile_rules() -> list[str]:
        return BrowserEnv.profile.outcome_rules

    def precondition(self, task: TaskSpec) -> str | None:
        """Why the task is broken before any action: its facts disagree with its own site."""
        facts, site = self.facts(task), task.initial_state["site"]
        for variant in [None, *facts.variants]:
            products = {**site["products"], **(variant.products if variant else {})}
            if facts.wanted is not None and facts.kind == "buy":
                fits = satisfying(products, facts.wanted)
                if fits != ([facts.target] if facts.feasible else []):
                    where = f"variant {variant.name}" if variant else "the site"
                    return f"the task says {facts.target or 'nothing'} fits, {where} says {fits or 'nothing'}"
        if facts.kind == "info" and facts.question in ("price", "rating") and facts.feasible:
            p = site["products"][facts.target]
            if (p["price"] / 100 if facts.question == "price" else p["rating"]) != facts.answer:
                return f"the answer {facts.answer} is not {facts.target}'s {facts.question}"
        return None

    def potential(self, task: TaskSpec, state: dict[str, Any]) -> float:
        """Φ in [0, 1]: partial credit for the best product looked at, put in the cart or ordered
        (its share of the goal's attributes, the option and quantity, the price within budget);
        for a question, having opened the page that shows the value; for an account change, being
        on its page, the fields typed, the change saved; for an infeasible task, having been shown
        what makes it so, with nothing ordered. 1.0 only after an ending the verdict accepts (right,
        and shown by the site), 0.0 after any other."""
        facts, site = self.facts(task), task.initial_state["site"]
        if state["ending"] is not None:
            if any(judge(facts, site, state).values()) or _blind(facts, state) or unshown(facts, site, state):
                return 0.0
            return 1.0
        if not facts.feasible:
            return 0.0 if state["orders"] or unshown(facts, site, state) else 0.5
        if facts.kind == "buy":
            return round(_buy_progress(facts, site, state), 6)
        if facts.kind == "info":
            return 0.0 if _blind(facts, state) else 0.5
        return _account_progress(facts, site, state)

    def crafted_disagreement(self, task: TaskSpec) -> list[ToolCall] | None:
        """A right purchase, then the account's phone changed before the answer: every page the
        agent saw about the order is right (observation passes); the database holds an unasked
        change (invariants fail). None for tasks that buy nothing."""
        facts = self.facts(task)
        if facts.kind != "buy" or not facts.feasible:
            return None
        *calls, answer = task.hidden.reference
        edit = [ToolCall(name="click", arguments={"id": ACCOUNT}), ToolCall(name="click", arguments={"id": PROFILE_LINK}),
                ToolCall(name="type", arguments={"id": FORM["phone"], "text": "555-0000"}),
                ToolCall(name="click", arguments={"id": SAVE})]
        return [*calls, *edit, answer]

    def _variation(self, task: TaskSpec, facts: BrowserFacts, calls: list[ToolCall | None],
                   final: dict[str, Any]) -> CheckResult:
        reasons = []
        for variant in facts.variants:
            world = copy.deepcopy(task.initial_state)
            world["site"]["products"].update(copy.deepcopy(variant.products))
            if variant.order is not None:
                world["site"]["order"] = list(variant.order)
            variant_task = TaskSpec.model_validate({**task.model_dump(), "initial_state": world, "task_id": ""})
            there = self.final_state(variant_task, calls)
            found = [r for v in judge(facts, world["site"], there).values() for r in v]
            if found:  # say where the replay first went another way: a call refused there only
                refused = [e for e, o in zip(there["events"], final["events"]) if e["outcome"] != o["outcome"]]
                found += [f"call {e['seq']} ({e['tool']} {e['args']}) was refused there: {e['outcome']}"
                          for e in refused[:1]]
            reasons += [f"{variant.name}: {r}" for r in found]
        return CheckResult(passed=not reasons, reasons=reasons)


def _blind(facts: BrowserFacts, state: dict[str, Any]) -> bool:
    """A question whose page holding the value (the product's or the order's) was never opened."""
    page = f"/product/{facts.target}" if facts.target else f"/account/orders/{facts.order_id}"
    return facts.kind == "info" and facts.feasible and page not in state["visited"]


def _quality(facts: BrowserFacts, product: dict[str, Any], options: dict | None, qty: int) -> float:
    """How close one product (with the options and quantity chosen, if any) is to the goal, 0..1."""
    wanted = facts.wanted
    missed = misses(product, wanted)
    if any(what == "category" for what, _, _ in missed):
        return 0.0
    share = 1 - len(missed) / max(1, len(wanted.attributes))
    name, value = wanted.option
    option_ok = options is not None and options.get(name) == value and qty == wanted.quantity
    price_ok = product["price"] * qty <= wanted.budget
    return 0.5 * share + 0.25 * option_ok + 0.25 * price_ok


def _buy_progress(facts: BrowserFacts, site: dict[str, Any], state: dict[str, Any]) -> float:
    products, wanted = site["products"], facts.wanted
    best = 0.0
    on_page = state["url"].split("?")[0].removeprefix("/product/")
    for path in state["visited"]:
        pid = path.removeprefix("/product/")
        if path.startswith("/product/") and pid in products:
            chosen = {wanted.option[0]: state["inputs"].get("option")} if pid == on_page else None
            qty = state["inputs"].get("qty", "1") if pid == on_page else "1"
            qty = int(qty) if qty.isascii() and qty.isdigit() and len(qty) < 4 else 0
            best = max(best, 0.25 * _quality(facts, products[pid], chosen, qty or wanted.quantity))
    for line in state["cart"]:
        best = max(best, 0.5 * _quality(facts, products[line["pid"]], line["options"], line["qty"]))
    if best >= 0.5 and state["url"].startswith("/checkout"):
        address = state["inputs"].get("address")
        ids = {a["label"]: a["id"] for a in state["account"]["addresses"]}
        best += 0.05 * (ids.get(address) == facts.address_id)
    for order in state["orders"]:
        for line in order["lines"]:
            q = _quality(facts, products[line["pid"]], line["options"], line["qty"])
            best = max(best, 0.8 * q + 0.1 * (order["address_id"] == facts.address_id))
    return best


def _account_progress(facts: BrowserFacts, site: dict[str, Any], state: dict[str, Any]) -> float:
    want, now, url = facts.account_after, state["account"], state["url"]
    if facts.change == "new_address":
        new = want["addresses"][-1]
        if any(_place(a) == _place(new) for a in now["addresses"]):
            return 0.9
        if url == "/account/addresses/new":
            typed = sum(state["inputs"].get(k) == new[k] for k in ("label", "street", "city", "zip"))
            return 0.3 + 0.1 * typed
        return 0.1 if url == "/account/addresses" else 0.0
    field = _field(facts.change)
    if now[field] == want[field]:
        return 0.9
    page = "/account/profile" if field == "phone" else "/account/addresses"
    if url == page:
        return 0.5 if state["inputs"].get(field) == want[field] else 0.3
    return 0.0


def _observation(facts: BrowserFacts, site: dict[str, Any], steps: list[Step]) -> CheckResult:
    """Success as the agent was shown it: the confirmation page of a right order, the value on a page
    it saw before answering, the site's notice that the change was saved; or, for an infeasible
    task, an accepted report and no order confirmation."""
    pages, alerts, paths, ending = [], [], [], None
    for step in steps:
        result = tool_result(step.result) if step.tool_call else None
        if result is None:
            continue
        if "page" in result and ending is None:
            pages.append(str(result["page"]))
            alerts.append(str(result.get("alert", "")))
            paths.append(_path_of(result.get("url")))
        if step.tool_call.name in ("answer", "report_infeasible") and ending is None:
            ending = (step.tool_call.name, str(result.get("answered", result.get("reported", ""))))
    placed = [p for p, a in zip(pages, alerts) if "has been placed" in a]
    reasons = []
    if ending is None:
        return CheckResult(passed=False, reasons=["saw no accepted answer or report"])
    if not facts.feasible:
        if ending[0] != "report_infeasible":
            reasons.append(f"ended with {ending[0]} on an infeasible task")
        reasons += ["saw an order confirmation on an infeasible task"] * bool(placed)
        return CheckResult(passed=not reasons, reasons=reasons)
    if ending[0] != "answer":
        return CheckResult(passed=False, reasons=["reported infeasible on a feasible task"])
    if facts.kind == "buy":
        if not placed:
            return CheckResult(passed=False, reasons=["saw no order confirmation"])
        page, wanted = placed[-1], facts.wanted
        label = next(a["label"] for a in site["account"]["addresses"] if a["id"] == facts.address_id)
        product = site["products"][facts.target]
        line = f"{product['name']} - {wanted.option[0]}: {wanted.option[1]} - qty {wanted.quantity}"
        if line not in page:
            reasons.append(f"the confirmation shows no line {line!r}")
        if f"Shipped to: {label}:" not in page:
            reasons.append(f"the confirmation does not ship to {label}")
        total = re.search(r"Order total: \$([\d,]+\.\d\d)", page)
        if total is None or round(float(total.group(1).replace(",", "")) * 100) > wanted.budget:
            reasons.append(f"the confirmation's total is not within {money(wanted.budget)}")
    elif facts.kind == "info":
        shown = {"price": f"Price: {money(round(facts.answer * 100))}", "rating": f"Rating: {facts.answer} out of 5",
                 "order_total": f"Order total: {money(round(facts.answer * 100))}"}[facts.question]
        # only the page that holds the value counts: a 404 page or a results page repeats what the
        # agent wrote (its url, its query), and another product may share the number
        home = f"/product/{facts.target}" if facts.question != "order_total" else f"/account/orders/{facts.order_id}"
        if not any(shown in p for p, path in zip(pages, paths) if path == home):
            value = f"{facts.answer:.2f}" if facts.question != "rating" else f"{facts.answer}"
            reasons.append(f"the value {value} was never shown: no page visited before answering shows {shown!r} "
                           "(the product's own page or the order's page)")
        value = as_number(ending[1])
        if value is None or round(value, 2) != round(facts.answer, 2):
            reasons.append("the accepted answer is not the value shown")
    else:
        after = facts.account_after
        if facts.change == "phone":  # the saved form shows the number it holds now
            shown = any("your contact details were saved" in a and f"value={after['phone']!r}" in p
                        for p, a in zip(pages, alerts))
            notice = f"contact details saved with phone {after['phone']}"
        elif facts.change == "default_address":
            label = next(a["label"] for a in after["addresses"] if a["id"] == after["default_address"])
            notice = f"{label} is now your default address"
            shown = notice in alerts
        else:
            notice = f"address {after['addresses'][-1]['label']!r} saved"
            shown = notice in alerts
        if not shown:
            reasons.append(f"saw no notice {notice!r}")
    return CheckResult(passed=not reasons, reasons=reasons)


def _path_of(url: Any) -> str | None:
    """The path of a url the site showed (https://shop.example/product/P-1?x=1 -> /product/P-1)."""
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 host: the site showed its 404 page there
        return None
    return (parts.path.rstrip("/") or "/") if parts.netloc == HOST else None


__all__ = ["BrowserVerifier", "judge"]
