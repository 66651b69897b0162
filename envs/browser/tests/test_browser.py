"""The browser family through its public interface: a distractor, a wrong option and an over-budget
purchase fail with reasons naming what is wrong; an infeasible task is solved only by
report_infeasible, after the site showed what makes it so (a blind report, or one after unrelated
pages, fails and earns no progress); a question's answer is checked against the site's value; stale ids, unknown
urls and malformed input are error observations that leave the database as it was; the potential
gives partial credit and never falls along a reference; the hidden variants catch a choice that
hung on the listing order; the scripted policy's mistakes fail for the reasons they should."""

import json
import re

import pytest

from gymfoundry.envs.browser import FAMILY
from gymfoundry.envs.browser.policy import ScriptedBrowserPolicy
from gymfoundry.envs.browser.rules import CATEGORIES, describe, misses, offers
from gymfoundry.envs.browser.site import (ADD_TO_CART, ADDRESS, CART, CHECKOUT, NEXT, OPTION, PLACE_ORDER, PRODUCT_LINK, QUANTITY,
                               SEARCH_BOX, SEARCH_BUTTON, Site)
from gymfoundry.envs.family import add
from gymfoundry.envs.leaks import find_leaks
from gymfoundry.envs.records import ToolCall
from gymfoundry.envs.wrappers import standard_stack

add(FAMILY)  # a no-op once discovery found it
DB = ("orders", "cart", "account", "ending")
SAVE_ID = 79
NOUN = {category: noun for category, (noun, _, _) in CATEGORIES.items()}


def call(name, **arguments):
    return ToolCall(name=name, arguments=arguments)


def task_where(predicate, levels=(1, 2, 3, 4, 5), seeds=300):
    return next(t for seed in range(seeds) for level in levels
                if predicate(t := FAMILY.generate(seed, level), FAMILY.facts_of(t)))


def play(task, calls):
    env = FAMILY.make()
    ts = env.reset(task)
    for c in calls:
        ts = env.step(c)
    return env, ts


def outcome(ts):
    assert ts.terminated, ts.observation
    return ts.info["outcome"]


def result(ts):
    return json.loads(ts.observation)


def products(task):
    return task.initial_state["site"]["products"]


def link(task, pid):
    return PRODUCT_LINK + sorted(products(task)).index(pid)


def purchase(task, facts, pid, option=None, label=None):
    """Open `pid` by its url and buy it (the goal's quantity), shipped to `label` (the goal's)."""
    label = label or next(a["label"] for a in task.initial_state["site"]["account"]["addresses"]
                          if a["id"] == facts.address_id)
    calls = [call("goto", url=f"/product/{pid}"), call("select", id=OPTION, option=option or facts.wanted.option[1])]
    if facts.wanted.quantity > 1:
        calls.append(call("type", id=QUANTITY, text=str(facts.wanted.quantity)))
    return calls + [call("click", id=ADD_TO_CART), call("click", id=CART), call("click", id=CHECKOUT),
                    call("select", id=ADDRESS, option=label), call("click", id=PLACE_ORDER),
                    call("answer", text=f"W{task.initial_state['site']['next_order']}")]  # the order's number


def feasible_buy(t, f):
    return f.kind == "buy" and f.feasible


def test_passes_the_conformance_checks(conformance):
    report = conformance(FAMILY.name)
    assert report.ok, report.render()


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_every_reference_succeeds_with_its_checks_at_every_level(level):
    verifier = FAMILY.outcome_verifier
    kinds = set()
    for seed in range(16):
        task = FAMILY.generate(seed, level)
        facts = FAMILY.facts_of(task)
        kinds.add((facts.kind, facts.feasible))
        assert verifier.precondition(task) is None
        env, ts = play(task, task.hidden.reference)
        report = outcome(ts)
        assert report["success"], (seed, report["reasons"])
        assert all(c["passed"] for c in report["checks"].values())
        phi = verifier.potentials(task, env.steps)
        assert all(b >= a for a, b in zip(phi, phi[1:])) and phi[-1] == 1.0 and phi[0] < 1.0
    assert {k for k, _ in kinds} == {"buy", "info", "account"}


def test_buying_a_distractor_fails_naming_the_attribute():
    task = task_where(lambda t, f: feasible_buy(t, f) and any(
        len(misses(p, f.wanted)) == 1 and offers(p, f.wanted) for p in products(t).values()), levels=(3, 4, 5))
    facts = FAMILY.facts_of(task)
    pid, p = next((pid, p) for pid, p in sorted(products(task).items())
                  if len(misses(p, facts.wanted)) == 1 and offers(p, facts.wanted))
    (what, got, want), = misses(p, facts.wanted)
    _, ts = play(task, purchase(task, facts, pid))
    report = outcome(ts)
    assert not report["success"] and not report["completed"]
    assert f"bought {pid} ({p['name']}), whose {what} is {got}; the task asks for {want}" in report["reasons"]


def test_the_right_product_with_the_wrong_option_fails_naming_the_option():
    task = task_where(lambda t, f: feasible_buy(t, f) and len(products(t)[f.target]["options"][f.wanted.option[0]]) > 1)
    facts = FAMILY.facts_of(task)
    name, value = facts.wanted.option
    other = next(v for v in products(task)[facts.target]["options"][name] if v != value)
    _, ts = play(task, purchase(task, facts, facts.target, option=other))
    report = outcome(ts)
    assert not report["success"]
    assert report["reasons"] == [f"bought {products(task)[facts.target]['name']} in {name} {other}; the task asks for "
                                 f"{name} {value}"]


def test_paying_over_the_budget_fails_naming_the_price():
    task = task_where(lambda t, f: feasible_buy(t, f) and any(
        not misses(p, f.wanted) and offers(p, f.wanted) and pid != f.target for pid, p in products(t).items()))
    facts = FAMILY.facts_of(task)
    pid, p = next((pid, p) for pid, p in sorted(products(task).items())
                  if not misses(p, facts.wanted) and offers(p, facts.wanted) and pid != facts.target)
    _, ts = play(task, purchase(task, facts, pid))
    report = outcome(ts)
    paid = p["price"] * facts.wanted.quantity
    assert not report["success"] and report["constraint_violation"] and report["completed"]
    assert paid > facts.wanted.budget
    assert any(f"over the budget of ${facts.wanted.budget // 100:,}.00" in r and
               f"paid ${paid // 100:,}.{paid % 100:02d}" in r for r in report["reasons"])


def test_the_wrong_address_fails_naming_it():
    task = task_where(lambda t, f: feasible_buy(t, f) and f.address_id != "A1")
    facts = FAMILY.facts_of(task)
    _, ts = play(task, purchase(task, facts, facts.target, label="Home"))
    assert any("to Home; the task asks for" in r for r in outcome(ts)["reasons"])


@pytest.mark.parametrize("how", ["costs more than", "offers"])
def test_an_infeasible_purchase_is_solved_only_by_reporting_it(how):
    task = task_where(lambda t, f: f.kind == "buy" and not f.feasible and how in f.why_infeasible)
    facts = FAMILY.facts_of(task)
    _, ts = play(task, task.hidden.reference)
    assert outcome(ts)["success"]
    nearest = min((pid for pid, p in products(task).items() if not misses(p, facts.wanted)),
                  key=lambda pid: products(task)[pid]["price"])
    options = products(task)[nearest]["options"][facts.wanted.option[0]]
    option = facts.wanted.option[1] if facts.wanted.option[1] in options else options[0]
    _, ts = play(task, purchase(task, facts, nearest, option=option))
    report = outcome(ts)
    assert not report["success"]
    assert any(r.startswith("placed order W") and f"but the task is infeasible: {facts.why_infeasible}" in r
               for r in report["reasons"])


def test_reporting_a_feasible_task_infeasible_fails():
    for predicate in (feasible_buy, lambda t, f: f.kind == "info" and f.feasible,
                      lambda t, f: f.kind == "account" and f.feasible):
        task = task_where(predicate)
        *calls, _ = task.hidden.reference
        _, ts = play(task, [*calls, call("report_infeasible", reason="I think this cannot be done.")])
        report = outcome(ts)
        assert not report["success"]
        assert report["reasons"][0].startswith("reported the task infeasible, but it can be done")


@pytest.mark.parametrize("question", ["price", "rating", "order_total"])
def test_a_question_is_answered_only_with_the_sites_value(question):
    task = task_where(lambda t, f: f.kind == "info" and f.feasible and f.question == question)
    facts = FAMILY.facts_of(task)
    *calls, right = task.hidden.reference

    def answer(text):
        return outcome(play(task, [*calls, call("answer", text=text)])[1])

    value = facts.answer
    assert answer(right.arguments["text"])["success"]
    shown = f"${value:,.2f}" if question != "rating" else f"{value} out of 5"
    assert answer(shown)["success"]
    assert not answer(task.goal)["success"]  # the goal echoed back
    assert not answer(f"{value} or {value + 1}")["success"]  # a hedge
    assert not answer(f"{value + 0.01:.2f}")["success"]
    if question == "order_total":
        others = [o["total"] / 100 for o in task.initial_state["site"]["past_orders"] if o["order_id"] != facts.order_id]
    else:
        others = [p["price"] / 100 if question == "price" else p["rating"] for pid, p in products(task).items()
                  if pid != facts.target and len(misses(p, facts.wanted)) == 1]
    assert others
    for other in others:
        assert other != value
        report = answer(f"{other:.2f}" if question != "rating" else str(other))
        assert not report["success"] and "which is not the" in report["reasons"][0]


def test_an_infeasible_question_is_solved_only_by_reporting_it():
    task = task_where(lambda t, f: f.kind == "info" and not f.feasible)
    facts = FAMILY.facts_of(task)
    assert outcome(play(task, task.hidden.reference)[1])["success"]
    near = [p for p in products(task).values() if len(misses(p, facts.wanted)) == 1]
    guess = near[0]["price"] / 100 if facts.question == "price" else near[0]["rating"]
    report = outcome(play(task, [*task.hidden.reference[:-1], call("answer", text=str(guess))])[1])
    assert not report["success"] and "the task is infeasible" in report["reasons"][0]


def test_bad_input_is_an_error_observation_and_changes_no_data():
    task = task_where(feasible_buy, levels=(3,))
    facts = FAMILY.facts_of(task)
    env = FAMILY.make()
    env.reset(task)
    ts = env.step(task.hidden.reference[0])  # the search: a results page
    listed = [int(x) for x in re.findall(r"\[(\d+)\] link", result(ts)["result"]["page"]) if int(x) >= PRODUCT_LINK]
    env.step(call("goto", url=f"/product/{facts.target}"))
    stale = listed[0]

    def refused(action, kind, words):
        before = {k: env.state()[k] for k in DB}
        ts = env.step(action)
        error = result(ts)["error"]
        assert (error["type"], ts.done) == (kind, False), ts.observation
        assert words in error["message"]
        assert {k: env.state()[k] for k in DB} == before

    refused(call("click", id=stale), "invalid_arguments", f"element [{stale}] is not on the current page")
    refused(call("click", id=999_999), "invalid_arguments", "not on the current page")
    refused(call("type", id=ADD_TO_CART, text="x"), "invalid_arguments", "is a button")
    refused(call("select", id=QUANTITY, option="2"), "invalid_arguments", "not a select box")
    refused(call("select", id=OPTION, option="XXL-nope"), "invalid_arguments", "has no option 'XXL-nope'; its options:")
    refused({"name": "click", "arguments": {"id": "12"}}, "invalid_arguments", "click")
    refused('{"name": "type", "arguments": {"id": 2}', "invalid_json", "")
    for url, title in [("/no/such/page", "404 - Page not found"), ("/product/P-0", "404 - Page not found"),
                       ("https://evil.example/steal", "This site can't be reached"),
                       ("http://[::1", "404 - Page not found"), ("/search?page=99999999999&sort=x", "Search results - Shop"),
                       ("\u202e\x00", "404 - Page not found")]:
        before = {k: env.state()[k] for k in DB}
        ts = env.step(call("goto", url=url))
        assert result(ts)["result"]["title"] == title and not ts.done
        assert {k: env.state()[k] for k in DB} == before
    fresh = FAMILY.make()
    fresh.reset(task)
    ts = fresh.step(call("back"))
    assert result(ts)["error"]["type"] == "no_history"
    assert outcome(play(task, task.hidden.reference)[1])["success"]  # the task itself is untouched


def test_add_to_cart_without_an_option_or_with_a_bad_quantity_is_a_page_notice():
    task = task_where(feasible_buy)
    facts = FAMILY.facts_of(task)
    env, ts = play(task, [call("goto", url=f"/product/{facts.target}"), call("click", id=ADD_TO_CART)])
    assert result(ts)["result"]["alert"] == f"please choose a {facts.wanted.option[0]} first"
    for qty in ["0", "11", "-1", "two", "\u0663"]:
        env.step(call("select", id=OPTION, option=facts.wanted.option[1]))
        env.step(call("type", id=QUANTITY, text=qty))
        ts = env.step(call("click", id=ADD_TO_CART))
        assert result(ts)["result"]["alert"] == "enter a quantity from 1 to 10"
    assert env.state()["cart"] == []


def test_the_potential_gives_partial_credit():
    task = task_where(lambda t, f: feasible_buy(t, f) and len(products(t)[f.target]["options"][f.wanted.option[0]]) > 1
                      and any(len(misses(p, f.wanted)) == 1 and offers(p, f.wanted) for p in products(t).values()),
                      levels=(3, 4, 5))
    facts = FAMILY.facts_of(task)
    verifier = FAMILY.outcome_verifier
    name, value = facts.wanted.option
    other = next(v for v in products(task)[facts.target]["options"][name] if v != value)
    near = next(pid for pid, p in sorted(products(task).items())
                if len(misses(p, facts.wanted)) == 1 and offers(p, facts.wanted))

    def phi_after_cart(pid, option):
        calls = purchase(task, facts, pid, option=option)[:-5]  # up to add to cart
        env, _ = play(task, calls)
        return verifier.potential(task, env.state())

    start = verifier.potential(task, FAMILY.make().initial_state(task))
    wrong_option = phi_after_cart(facts.target, other)
    right = phi_after_cart(facts.target, value)
    distractor = phi_after_cart(near, value)
    assert start == 0.0 < wrong_option < right < 1.0
    assert 0.0 < distractor < right
    env, _ = play(task, purchase(task, facts, near))
    assert verifier.potential(task, env.state()) == 0.0  # ended with a wrong purchase


def test_a_choice_that_hung_on_the_listing_order_fails_the_reordered_variant():
    """Paging through unfiltered results to the page the target sat on, then clicking it: right
    in this site, wrong when the results are listed in another order."""
    def later_page(t, f):
        if not feasible_buy(t, f):
            return False
        site = Site(t.initial_state["site"])
        order = next(v.order for v in f.variants if v.name == "results_reordered")
        found, _ = site.results({"q": NOUN[f.wanted.category]})
        there, _ = Site({**t.initial_state["site"], "order": order}).results({"q": NOUN[f.wanted.category]})
        page = found.index(f.target) // site.page_size  # a page on which the reordered results list it not
        return page > 0 and page != there.index(f.target) // site.page_size

    task = task_where(later_page, levels=(4, 5))
    facts = FAMILY.facts_of(task)
    site = Site(task.initial_state["site"])
    noun = NOUN[facts.wanted.category]
    found, _ = site.results({"q": noun})
    pages = found.index(facts.target) // site.page_size
    calls = [call("type", id=SEARCH_BOX, text=noun), call("click", id=SEARCH_BUTTON)] + [call("click", id=NEXT)] * pages
    calls.append(call("click", id=link(task, facts.target)))
    calls += purchase(task, facts, facts.target)[1:]
    _, ts = play(task, calls)
    report = outcome(ts)
    checks = {k: c["passed"] for k, c in report["checks"].items()}
    assert checks == {"observation": True, "invariants": True, "hidden_variation": False}
    assert not report["success"]
    assert "hidden_variation: results_reordered: no order was placed" in report["reasons"]
    assert f"hidden_variation: results_reordered: call {2 + pages} (click {{'id': {link(task, facts.target)}}}) was " \
           "refused there: invalid_arguments" in report["reasons"]


def test_element_ids_name_what_they_do_not_where_they_sit():
    task = task_where(feasible_buy, levels=(2,))
    facts = FAMILY.facts_of(task)
    variant = next(v for v in facts.variants if v.name == "results_reordered")
    site, reordered = Site(task.initial_state["site"]), Site({**task.initial_state["site"], "order": variant.order})
    state = FAMILY.make().initial_state(task)
    state["url"] = "/search?q=" + NOUN[facts.wanted.category]
    a, b, again = site.render(state), reordered.render(state), site.render(state)
    assert a.lines == again.lines  # one page state, one rendering
    links = {e.label: i for i, e in a.elements.items() if e.role == "link" and i >= 100}
    for i, e in b.elements.items():
        if e.role == "link" and i >= 100 and e.label in links:
            assert links[e.label] == i
    assert a.lines != b.lines


def test_the_card_number_is_never_shown():
    task = task_where(feasible_buy)
    number = task.initial_state["site"]["account"]["card"]["number"]
    env, ts = play(task, task.hidden.reference[:-2])
    assert f"ending in {number[-4:]}" in result(ts)["result"]["page"]
    assert number in task.hidden.secrets
    assert not find_leaks(task, [s.result for s in env.steps] + [env.reset(task).observation])


class Forced(ScriptedBrowserPolicy):
    """The scripted policy with its mistakes chosen: the n-th chance to err errs when n is listed."""

    def __init__(self, errs):
        super().__init__(mistake_rate=0.0)
        self.errs = set(errs)

    def reset(self, seed=None):
        super().reset(seed)
        self.chance = 0

    def _mistake(self):
        self.chance += 1
        return self.chance in self.errs


def run(policy, task, seed=0):
    env = standard_stack(FAMILY.make())
    policy.reset(seed)
    ts = env.reset(task)
    while not ts.done:
        ts = env.step(policy.act(ts.observation))
    bugs = [s for s in env.steps if s.error in ("env_bug", "env_fault")]
    assert not bugs, bugs[0].result
    return ts.info.get("outcome")


def test_the_scripted_policy_without_mistakes_solves_every_task():
    for level in (1, 3, 5):
        for seed in range(15):
            report = run(Forced([]), FAMILY.generate(seed, level), seed)
            assert report and report["success"], (level, seed, report and report["reasons"])


# Buy plans ask for a mistake in this order: 1 overlook an attribute, 2 ignore the budget,
# 3 browse unfiltered, 4 ignore the option, 5 keep the default address.
@pytest.mark.parametrize("errs,kind,reason", [
    ([1], "buy", ", whose "), ([2], "buy", "over the budget of"), ([3], "buy", "hidden_variation: results_reordered"),
    ([4], "buy", "; the task asks for size"), ([5], "buy", "to Home; the task asks for"),
    ([1], "info", "which is not the product's"), ([1], "phone", "the account's phone is"),
    ([2], "phone", "the account's phone is"), ([1], "default_address", "the account's default address is"),
    ([1], "new_address", "was added")])
def test_each_scripted_mistake_fails_for_its_reason(errs, kind, reason):
    seen = []
    for seed in range(80):
        for level in (3, 4, 5):
            task = FAMILY.generate(seed, level)
            facts = FAMILY.facts_of(task)
            if not facts.feasible or kind not in (facts.kind, facts.change):
                continue
            report = run(Forced(errs), task, seed)
            if report and not report["success"]:
                seen += report["reasons"]
                if any(reason in r for r in report["reasons"]):
                    return
    pytest.fail(f"mistake {errs} on {kind} never failed with {reason!r}; it failed with {seen[:5]}")


def test_a_long_page_is_cut_at_the_fold_and_scrolls():
    task = task_where(lambda t, f: len(t.initial_state["site"]["products"]) >= 14 and t.initial_state["site"][
        "page_size"] == 8, levels=(2,))
    env, ts = play(task, [call("goto", url="/search")])  # every product, eight a page
    first = result(ts)["result"]["page"]
    assert first.endswith("more lines below (scroll down)")
    hidden = [int(x) for x in re.findall(r"\[(\d+)\]", first)]
    ts = env.step(call("scroll", direction="down"))
    rest = result(ts)["result"]["page"]
    below = [int(x) for x in re.findall(r"\[(\d+)\]", rest)]
    assert below and not set(below) & set(hidden) and "Page 1 of" in rest
    assert result(env.step(call("scroll", direction="down")))["result"]["alert"] == "already at the bottom of the page"
    env.step(call("scroll", direction="up"))
    assert result(env.step(call("scroll", direction="up")))["result"]["alert"] == "already at the top of the page"
    target = next(i for i in below if i >= PRODUCT_LINK)  # below the fold, still on the page: the browser scrolls to it
    assert result(env.step(call("click", id=target)))["result"]["url"].startswith("https://shop.example/product/P-")


def test_an_answer_or_a_claim_is_no_purchase():
    task = task_where(feasible_buy)
    report = outcome(play(task, [call("answer", text="Order W12345 placed for the item you asked for.")])[1])
    assert not report["success"] and report["reasons"] == ["no order was placed"]


def test_a_second_order_is_a_side_effect():
    task = task_where(feasible_buy)
    facts = FAMILY.facts_of(task)
    calls = purchase(task, facts, facts.target)
    _, ts = play(task, calls[:-1] + calls)
    report = outcome(ts)
    assert not report["success"] and len(report["side_effects"]) == 1
    assert "placed 2 orders" in report["side_effects"][0]


@pytest.mark.parametrize("change", ["phone", "default_address", "new_address"])
def test_an_account_change_is_judged_from_the_account(change):
    task = task_where(lambda t, f: f.kind == "account" and f.change == change)
    facts = FAMILY.facts_of(task)
    assert outcome(play(task, task.hidden.reference)[1])["success"]
    *calls, done = task.hidden.reference
    last = max(i for i, c in enumerate(calls) if c.name == "click")  # the click that saves the change
    forgot = outcome(play(task, calls[:last] + calls[last + 1:] + [done])[1])
    assert not forgot["success"] and not forgot["completed"]
    extra = [call("goto", url="/account/addresses/new"), call("type", id=71, text="Boathouse"),
             call("type", id=72, text="1 Quay St"), call("type", id=73, text="Port"), call("type", id=74, text="12345"),
             call("click", id=SAVE_ID)]
    report = outcome(play(task, [*calls, *extra, done])[1])
    assert not report["success"]
    assert report["side_effects"] == ["added the address 'Boathouse' (1 Quay St, Port 12345), which the task does "
                                      "not ask for"]


def test_an_infeasible_account_change_is_reported_not_made():
    task = task_where(lambda t, f: f.kind == "account" and not f.feasible)
    assert outcome(play(task, task.hidden.reference)[1])["success"]
    report = outcome(play(task, [call("goto", url="/account/addresses"), call("click", id=401),
                                 call("report_infeasible", reason="No such address.")])[1])
    assert not report["success"] and report["regression"]
    assert report["reasons"][0].startswith("the account's default address is 'A2'")


def test_urls_are_read_as_a_browser_reads_them():
    task = task_where(feasible_buy)
    env = FAMILY.make()
    env.reset(task)
    for url in ["/cart", "cart", "shop.example/cart", "https://shop.example/cart", "http://shop.example/cart/"]:
        page = result(env.step(call("goto", url=url)))["result"]
        assert (page["url"].rstrip("/"), page["title"]) == ("https://shop.example/cart", "Your cart - Shop"), url
    page = result(env.step(call("goto", url="https://shop.example.evil/cart")))["result"]
    assert page["title"] == "This site can't be reached"
    page = result(env.step(call("back")))["result"]
    assert page["title"] == "Your cart - Shop"


def test_a_task_whose_facts_disagree_with_its_site_is_refused_before_any_action():
    from gymfoundry.envs.errors import InvalidTask
    from gymfoundry.envs.records import TaskSpec

    task = task_where(feasible_buy)
    facts = FAMILY.facts_of(task)
    other = next(pid for pid in sorted(products(task)) if pid != facts.target)
    data = task.model_dump(mode="json")
    data["hidden"]["checks"]["target"] = other
    tampered = TaskSpec.model_validate({**data, "task_id": ""})
    why = FAMILY.outcome_verifier.precondition(tampered)
    assert why == f"the task says {other} fits, the site says ['{facts.target}']"
    data = task.model_dump(mode="json")
    del data["initial_state"]["site"]["order"]
    with pytest.raises(InvalidTask, match="is not a browser world"):
        FAMILY.make().reset(TaskSpec.model_validate({**data, "task_id": ""}))


def test_a_blind_guess_at_a_question_fails_though_the_number_is_right():
    """Hostile: answering a question at once, with no page visited, even with the site's own value,
    is not a success: the value was never shown. The reference, which opens the page, succeeds."""
    verifier = FAMILY.outcome_verifier
    seen = set()
    for seed in range(60):
        task = FAMILY.generate(seed, 1 + seed % 5)
        facts = FAMILY.facts_of(task)
        if facts.kind != "info" or not facts.feasible or facts.question in seen and len(seen) == 3:
            continue
        seen.add(facts.question)
        right = task.hidden.reference[-1].arguments["text"]
        for calls in ([call("answer", text=right)], [call("goto", url="/"), call("answer", text=right)]):
            env, ts = play(task, calls)
            o = outcome(ts)
            assert not o["success"] and not o["checks"]["observation"]["passed"], (task.goal, o)
            assert any("never shown" in r for r in o["reasons"]), o["reasons"]
            assert verifier.potential(task, env.state()) == 0.0
        env, ts = play(task, task.hidden.reference)
        assert outcome(ts)["success"], outcome(ts)["reasons"]
        assert verifier.potential(task, env.state()) == 1.0
    assert seen == {"price", "rating", "order_total"}


def test_a_purchase_answered_with_a_wrong_or_missing_order_number_fails():
    """Hostile: the buy goal asks for the order number, so a made-up id, "done", a sentence or two
    ids fail, naming the answer and the order the site placed; the real id, in any wording, succeeds."""
    task = task_where(feasible_buy)
    *calls, answer = task.hidden.reference
    placed = answer.arguments["text"]
    for text in ("W00000", "done", "the order is placed", f"{placed} or W00001", placed[1:]):
        _, ts = play(task, [*calls, call("answer", text=text)])
        o = outcome(ts)
        assert not o["success"] and not o["completed"], (text, o)
        assert any(placed in r and text[:20] in r for r in o["reasons"]), o["reasons"]
    for text in (placed, f"Order {placed.lower()}.", f"My order number is #{placed}"):
        _, ts = play(task, [*calls, call("answer", text=text)])
        assert outcome(ts)["success"], (text, outcome(ts)["reasons"])


def test_an_account_change_still_ends_with_any_answer():
    """Account goals say 'call answer with "done"' and ask for no content: the database is judged."""
    task = task_where(lambda t, f: f.kind == "account" and f.feasible)
    _, ts = play(task, [*task.hidden.reference[:-1], call("answer", text="finished")])
    assert outcome(ts)["success"], outcome(ts)["reasons"]


def test_a_value_the_agent_wrote_onto_a_page_is_not_a_value_the_site_showed():
    """Hostile: a blind guess at a question, echoed onto a page by the agent itself (a 404 page
    repeats the url, a results page repeats the query), or the same value read off another
    product's page, was never shown by the page that holds it: no success, though the number is
    right. Only the target's own page (the product's, or the order's) counts."""
    from gymfoundry.envs.browser.site import money

    def shown(facts):
        return {"price": f"Price: {money(round(facts.answer * 100))}", "rating": f"Rating: {facts.answer} out of 5",
                "order_total": f"Order total: {money(round(facts.answer * 100))}"}[facts.question]

    seen = set()
    for seed in range(120):
        task = FAMILY.generate(seed, 1 + seed % 5)
        facts = FAMILY.facts_of(task)
        if facts.kind != "info" or not facts.feasible:
            continue
        seen.add(facts.question)
        right = task.hidden.reference[-1].arguments["text"]
        tricks = [[call("goto", url="/" + shown(facts))], [call("goto", url="/search?q=" + shown(facts))]]
        if facts.question == "rating":  # another product that happens to have the same rating
            twins = [pid for pid, p in products(task).items() if pid != facts.target and p["rating"] == facts.answer]
            tricks += [[call("goto", url=f"/product/{pid}")] for pid in twins[:1]]
        for calls in tricks:
            env, ts = play(task, [*calls, call("answer", text=right)])
            assert shown(facts) in json.loads(env.steps[-2].result)["result"]["page"]  # the text is on the page
            o = outcome(ts)
            assert not o["success"] and not o["checks"]["observation"]["passed"], (calls, o)
    assert seen == {"price", "rating", "order_total"}


def test_a_url_python_cannot_split_is_judged_like_any_other_page():
    """Hostile: a url urlsplit refuses (an unclosed IPv6 host) was the site's 404 page; the verdict
    over a trajectory that visited it is a verdict, never a verifier error."""
    task = task_where(lambda t, f: f.kind == "info" and f.feasible)
    *calls, right = task.hidden.reference
    for url in ("http://[::1", "https://[shop.example/x"):
        _, ts = play(task, [call("goto", url=url), *calls, right])
        assert "verifier_error" not in ts.info, ts.info["verifier_error"]
        assert outcome(ts)["success"], outcome(ts)["reasons"]


def test_a_page_opened_with_a_fragment_counts_as_visited_for_the_potential():
    """Hostile: /product/P-1#reviews renders the product page, and the verdict counts it as seen,
    but the visited list kept the fragment, so the potential called the answer blind: a success
    whose last step lost all progress (1.0 -> 0.0). A visited page is its path, as the site reads it."""
    verifier = FAMILY.outcome_verifier
    task = task_where(lambda t, f: f.kind == "info" and f.feasible and f.question != "order_total")
    target = FAMILY.facts_of(task).target
    for url in (f"/product/{target}#reviews", f"https://shop.example/product/{target}/#top"):
        env, ts = play(task, [call("goto", url=url), task.hidden.reference[-1]])
        assert outcome(ts)["success"], (url, outcome(ts)["reasons"])
        assert verifier.potential(task, env.state()) == 1.0, (url, env.state()["visited"])


def never_shown(task):
    """The reason a report_infeasible that the site never justified fails with."""
    facts = FAMILY.facts_of(task)
    if facts.kind == "account":
        return (f"report_infeasible without evidence: the account's addresses page, which shows that "
                f"{facts.why_infeasible}, was never opened")
    return (f"report_infeasible without evidence: the site never showed that {facts.why_infeasible}: no search "
            f"that would list {describe(facts.wanted)} had each of its results shown not to fit (by its line or its "
            "own page)")


def report_of(task):
    """The reference's own report (the right words), or a plausible one on a feasible task."""
    last = task.hidden.reference[-1]
    return last if last.name == "report_infeasible" else call("report_infeasible", reason="The shop cannot do this.")


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_a_blind_report_of_infeasibility_fails_and_earns_no_progress(level):
    """Hostile: report_infeasible at turn 1, never looking, leaves the database exactly as a
    justified report does; it fails on every task, naming what the site never showed, and Φ after
    it is 0, as after any failure. The reference, which looks first, succeeds with Φ 1.0."""
    verifier = FAMILY.outcome_verifier
    infeasible = 0
    for seed in range(40):
        task = FAMILY.generate(seed, level)
        env, ts = play(task, [report_of(task)])
        report = outcome(ts)
        assert not report["success"], (seed, task.goal)
        assert verifier.potentials(task, env.steps) == [0.0, 0.0]
        if not FAMILY.facts_of(task).feasible:
            infeasible += 1
            assert report["reasons"] == [never_shown(task)]
            env, ts = play(task, task.hidden.reference)
            assert outcome(ts)["success"], outcome(ts)["reasons"]
            assert verifier.potentials(task, env.steps)[-2:] == [0.5, 1.0]
    assert infeasible >= 4 or level == 1  # level 1 has no infeasible task


def infeasible_tasks(kind, count=6):
    return [t for seed in range(120) for level in (2, 3, 4, 5)
            if (f := FAMILY.facts_of(t := FAMILY.generate(seed, level))).kind == kind and not f.feasible][:count]


@pytest.mark.parametrize("kind", ["buy", "info", "account"])
def test_a_report_after_looking_elsewhere_fails(kind):
    """Hostile: pages that do not show what makes the task infeasible (the account, the orders, the
    cart, the profile, a search for another kind of product, a search filtered by a colour the goal
    does not ask for; the addresses page for a product) before report_infeasible: a failure with
    Φ 0, as for a blind report."""
    verifier = FAMILY.outcome_verifier
    tasks = infeasible_tasks(kind)
    assert len(tasks) == 6
    for task in tasks:
        facts = FAMILY.facts_of(task)
        category = facts.wanted.category if facts.wanted else "jackets"
        other = next(c for c in sorted(CATEGORIES) if c != category)
        color = next(c for c in ("red", "green") if facts.wanted is None or facts.wanted.attributes.get("color") != c)
        looks = [call("goto", url=url) for url in ("/account", "/account/orders", "/cart", "/account/profile",
                                                   f"/search?q={NOUN[other]}", f"/search?q={NOUN[category]}&color={color}")]
        if kind != "account":
            looks.append(call("goto", url="/account/addresses"))
        env, ts = play(task, [*looks, report_of(task)])
        report = outcome(ts)
        assert not report["success"] and report["reasons"] == [never_shown(task)], report["reasons"]
        assert verifier.potentials(task, env.steps)[-1] == 0.0


def test_a_product_within_budget_must_be_opened_to_show_it_lacks_the_option():
    """Hostile: the right search shows each product's price on its line, not its options: a report
    without opening the products within the budget (which lack the option) fails; the reference,
    which opens each of them, succeeds."""
    tasks = [t for t in infeasible_tasks("buy", 20) if "offers" in FAMILY.facts_of(t).why_infeasible]
    assert tasks
    for task in tasks:
        *look, report = task.hidden.reference
        searched = [c for c in look if c.name != "back" and not (c.name == "click" and c.arguments["id"] >= PRODUCT_LINK)]
        assert len(searched) < len(look)
        assert outcome(play(task, [*searched, report])[1])["reasons"] == [never_shown(task)]
        assert outcome(play(task, task.hidden.reference)[1])["success"]


def test_the_honest_policy_justifies_every_infeasible_report():
    """The scripted policy without mistakes looks before it reports (the search and each result, or
    the addresses page): every infeasible task is a success, its last Φ 1.0."""
    verifier = FAMILY.outcome_verifier
    for kind in ("buy", "info", "account"):
        for task in infeasible_tasks(kind):
            env = standard_stack(FAMILY.make())
            policy = Forced([])
            policy.reset(0)
            ts = env.reset(task)
            while not ts.done:
                ts = env.step(policy.act(ts.observation))
            assert env.steps[-1].tool_call.name == "report_infeasible"
            assert ts.info["outcome"]["success"], ts.info["outcome"]["reasons"]
            assert verifier.potentials(task, env.steps)[-1] == 1.0


def test_a_large_catalog_never_runs_out_of_product_names():
    """Every model of a brand's noun may be taken in a 44-product catalog (level 5, seed 587): the
    generator numbers a name rather than fail to make the task."""
    task = FAMILY.generate(587, 5)
    names = [p["name"] for p in products(task).values()]
    assert len(set(names)) == len(names) == 44 and any(n[-1].isdigit() for n in names)
    assert outcome(play(task, task.hidden.reference)[1])["success"]
