"""Seeded browser tasks, with their reference trajectories and typed facts.

`generate(family, seed, level)` is a pure function of (seed, level, GENERATOR_VERSION). Three kinds
of task: buy the product the goal describes (category and attributes, an option, a quantity)
within a budget and ship it to a named address; answer a question from the site's pages (a
product's price or rating, a past order's total); change the account (phone number, default
address, a new address). A share of tasks is infeasible (every matching product is over budget,
the one that matches lacks the option, no product matches, no such address), solved only by
`report_infeasible`. Knobs by level 1..5: catalog size (8..44 products), attributes in the goal
(1..4), results per page (10..6), near-miss distractors (each differs from the target in one
attribute; 2..8), twins that match but are over budget or lack the option, navigation depth
(attributes the results list hides, seen only on product pages), a non-default shipping address,
a quantity of 2, and the infeasible share (0..30%)."""

from __future__ import annotations

import random

from gymfoundry.envs.family import Family
from gymfoundry.envs.records import TaskSpec, ToolCall

from .facts import BrowserFacts, Variant, Wanted
from .rules import ATTRIBUTES, CATEGORIES, VALUES, affordable, describe, misses, satisfying
from .site import (ACCOUNT, ADD_TO_CART, ADDRESS, ADDRESSES_LINK, CART, CHECKOUT, FILTERS, FORM, NEW_ADDRESS_LINK,
                   OPTION, ORDER_LINK, ORDERS_LINK, PLACE_ORDER, PRODUCT_LINK, PROFILE_LINK, QUANTITY, SAVE,
                   SET_DEFAULT, Site, money)

GENERATOR_VERSION = "3"  # 3: references open the search by url; an infeasible purchase's opens each product in budget

CATALOG_SIZE = {1: 8, 2: 14, 3: 22, 4: 32, 5: 44}
N_ATTRIBUTES = {1: 1, 2: 2, 3: 2, 4: 3, 5: 4}
PAGE_SIZE = {1: 10, 2: 8, 3: 8, 4: 6, 5: 6}
LISTED = {1: ATTRIBUTES, 2: ATTRIBUTES, 3: ATTRIBUTES[:3], 4: ATTRIBUTES[:3], 5: ATTRIBUTES[:2]}
NEAR_MISSES = {1: 2, 2: 3, 3: 4, 4: 6, 5: 8}
OVER_BUDGET = {1: 0, 2: 1, 3: 1, 4: 2, 5: 2}
NO_OPTION = {1: 0, 2: 0, 3: 1, 4: 1, 5: 2}
INFEASIBLE = {1: 0.0, 2: 0.15, 3: 0.2, 4: 0.25, 5: 0.3}
KINDS = {"buy": 0.5, "info": 0.3, "account": 0.2}
TODAY = "2026-04-02"
MODELS = ("Vista", "Trek", "Crest", "Pioneer", "Nomad", "Drift", "Haven", "Scout", "Echo", "Rover", "Atlas",
          "Orbit", "Sierra", "Tundra", "Canyon", "Glacier")
NAMES = ("Jordan Lee", "Sam Rivera", "Alex Chen", "Morgan Patel", "Riley Novak", "Casey Brooks")
STREETS = ("Elm St", "Oak Ave", "Maple Rd", "Birch Ln", "Cedar Ct", "Willow Way", "Harbor Dr", "Mill St")
CITIES = ("Springfield", "Riverton", "Lakeview", "Fairmont", "Brookside", "Ashford")
LABELS = ("Home", "Office", "Parents")
NEW_LABELS = ("Cabin", "Studio", "Gym", "Garage")
ANSWER_HINT = "Call answer with the number alone (e.g. 12.50)."
INFEASIBLE_HINT = "If the shop has no way to do this, call report_infeasible with the reason instead."


def generate(family: Family, seed: int, level: int) -> TaskSpec:
    rng = family.rng(seed, level)
    kind = rng.choices(sorted(KINDS), weights=[KINDS[k] for k in sorted(KINDS)])[0]
    feasible = rng.random() >= INFEASIBLE[level]
    account = _account(rng, level)
    if kind == "buy":
        products, facts, goal, reference, features = _buy(rng, level, feasible, account)
    elif kind == "info":
        products, facts, goal, reference, features = _info(rng, level, feasible, account)
    else:
        products, facts, goal, reference, features = _account_change(rng, level, feasible, account)
    order = sorted(products)
    rng.shuffle(order)
    past, next_order = _past_orders(rng, products, account)
    site = {"products": products, "order": order, "page_size": PAGE_SIZE[level], "listing_attrs": list(LISTED[level]),
            "account": account, "past_orders": past, "today": TODAY, "next_order": next_order}
    if facts.get("question") == "order_total":
        reference, facts, goal = _order_question(rng, past, facts)
        feasible = True
    reference = [(n, {"text": f"W{next_order}"} if a.get("text") == "{order}" else a) for n, a in reference]
    variants = [_reordered(rng, order), _distractor_changed(rng, products, facts)]
    facts = BrowserFacts(kind=kind, feasible=feasible, variants=variants, **facts)
    reference = [ToolCall(name=n, arguments=a) for n, a in reference]
    features.update(kind_buy=float(kind == "buy"), kind_info=float(kind == "info"),
                    kind_account=float(kind == "account"), infeasible=float(not feasible),
                    n_products=float(len(products)), page_size=float(PAGE_SIZE[level]),
                    hidden_attributes=float(len(ATTRIBUTES) - len(LISTED[level])))
    return family.task(seed=seed, level=level, goal=goal, initial_state={"site": site},
                       template_id=family.template_id(kind, facts.question or facts.change, feasible,
                                                      facts.wanted.model_dump() if facts.wanted else None),
                       reference=reference, facts=facts, max_steps=2 * len(reference) + 10,
                       features=features, secrets=[account["card"]["number"]])


# -- the account and its history -------------------------------------------------------------
def _account(rng: random.Random, level: int) -> dict:
    name = rng.choice(NAMES)
    labels = LABELS[:2] if level < 3 else LABELS
    addresses = [{"id": f"A{i + 1}", "label": label, "street": f"{rng.randint(2, 980)} {rng.choice(STREETS)}",
                  "city": rng.choice(CITIES), "zip": f"{rng.randint(1000, 99999):05d}"} for i, label in enumerate(labels)]
    card = "4" + "".join(str(rng.randint(0, 9)) for _ in range(15))
    return {"name": name, "email": f"{name.split()[0].lower()}.{name.split()[1].lower()}@mail.example",
            "phone": f"555-01{rng.randint(10, 99)}", "addresses": addresses, "default_address": "A1",
            "card": {"brand": "Visa", "number": card}}


def _past_orders(rng: random.Random, products: dict[str, dict], account: dict) -> tuple[list[dict], int]:
    number = rng.randint(40000, 80000)
    days = sorted(rng.sample(range(1, 85), rng.randint(2, 4)))
    orders = []
    for day in days:
        number += rng.randint(3, 900)
        lines = []
        for pid in rng.sample(sorted(products), rng.randint(1, 2)):
            p = products[pid]
            name, values = next(iter(p["options"].items()))
            lines.append({"pid": pid, "name": p["name"], "options": {name: rng.choice(values)},
                          "qty": rng.choice([1, 1, 2]), "price": p["price"]})
        address = rng.choice(account["addresses"])
        orders.append({"order_id": f"W{number}", "date": f"2026-{(day - 1) // 28 + 1:02d}-{(day - 1) % 28 + 1:02d}",
                       "status": "Delivered" if day < 70 else "Shipped", "lines": lines,
                       "total": sum(x["price"] * x["qty"] for x in lines), "address_id": address["id"],
                       "ship_to": f"{address['label']}: {address['street']}, {address['city']} {address['zip']}"})
    return orders, number + rng.randint(5, 50)


# -- the catalog ------------------------------------------------------------------------------
class _Catalog:
    """Products with unique ids, names and prices, built around a wanted product."""

    def __init__(self, rng: random.Random):
        self.rng, self.products, self.names, self.prices = rng, {}, set(), set()
        self.ids = iter(rng.sample(range(1000, 10000), 80))

    def add(self, category: str, attributes: dict[str, str], price: int, options: list[str] | None = None) -> str:
        rng = self.rng
        noun = category.removesuffix("s").capitalize() if category != "boots" else "Boots"
        names = [f"{attributes['brand']} {m} {noun}" for m in rng.sample(MODELS, len(MODELS))]
        # a brand's every model may be taken in a large catalog: then a numbered one
        names += (f"{names[0]} {k}" for k in range(2, len(self.names) + 3))
        name = next(n for n in names if n not in self.names)
        self.names.add(name)
        while price in self.prices:
            price += 100
        self.prices.add(price)
        option, values = CATEGORIES[category][1:]
        if options is None:
            options = rng.sample(values, rng.randint(2, len(values)))
        a = attributes
        pid = f"P-{next(self.ids)}"
        self.products[pid] = {
            "name": name, "category": category, **{k: a[k] for k in ATTRIBUTES}, "price": price,
            "rating": round(rng.uniform(3.0, 5.0), 1), "reviews": rng.randint(3, 900),
            "options": {option: [v for v in values if v in options]},
            "description": f"A {a['feature']} {a['material']} {noun.lower()} in {a['color']} by {a['brand']}."}
        return pid

    def random_attributes(self, fixed: dict[str, str] | None = None) -> dict[str, str]:
        return {k: (fixed or {}).get(k) or self.rng.choice(VALUES[k]) for k in ATTRIBUTES}

    def fill(self, size: int, wanted: Wanted) -> None:
        """Other products up to `size`, none of them the one the goal describes."""
        while len(self.products) < size:
            category = self.rng.choice(sorted(CATEGORIES))
            attributes = self.random_attributes()
            product = {"category": category, **attributes}
            if misses(product, wanted):
                self.add(category, attributes, self.rng.randint(15, 260) * 100 - 1)


def _wanted(rng: random.Random, level: int, budgeted: bool) -> tuple[Wanted, dict[str, str], int]:
    category = rng.choice(sorted(CATEGORIES))
    full = {k: rng.choice(VALUES[k]) for k in ATTRIBUTES}
    named = sorted(rng.sample(ATTRIBUTES, N_ATTRIBUTES[level]), key=ATTRIBUTES.index)
    price = rng.randint(30, 220) * 100 - 1
    if not budgeted:
        return Wanted(category=category, attributes={k: full[k] for k in named}), full, price
    option_name, values = CATEGORIES[category][1:]
    quantity = 2 if level == 5 and rng.random() < 0.5 else 1
    budget = (price * quantity // 100 + rng.randint(1, 15)) * 100
    return (Wanted(category=category, attributes={k: full[k] for k in named}, option=[option_name, rng.choice(values)],
                   quantity=quantity, budget=budget), full, price)


def _near_misses(catalog: _Catalog, wanted: Wanted, full: dict[str, str], count: int, price_range: tuple[int, int]):
    named = list(wanted.attributes)
    out = []
    for k in range(count):
        attribute = named[k % len(named)]
        attributes = catalog.random_attributes({a: full[a] for a in named})
        attributes[attribute] = catalog.rng.choice([v for v in VALUES[attribute] if v != full[attribute]])
        out.append(catalog.add(wanted.category, attributes, catalog.rng.randint(*price_range) * 100 - 1))
    return out


def _buy(rng: random.Random, level: int, feasible: bool, account: dict):
    wanted, full, price = _wanted(rng, level, budgeted=True)
    catalog = _Catalog(rng)
    option_name, option = wanted.option
    values = CATEGORIES[wanted.category][2]
    each = wanted.budget // wanted.quantity  # the most one unit may cost
    how = rng.choice(["budget", "option"]) if not feasible else None
    if how == "budget":
        price = each + rng.randint(3, 40) * 100
    others = [v for v in values if v != option]
    target_options = rng.sample(others, rng.randint(1, len(others))) + ([option] if how != "option" else [])
    target = catalog.add(wanted.category, catalog.random_attributes(full), price, target_options)
    near = _near_misses(catalog, wanted, full, NEAR_MISSES[level], (10, each // 100))
    twins = []
    for _ in range(OVER_BUDGET[level]):
        twins.append(catalog.add(wanted.category, catalog.random_attributes(wanted.attributes),
                                 each + rng.randint(2, 60) * 100 - 1, [option] + rng.sample(others, 1)))
    for _ in range(NO_OPTION[level]):
        twins.append(catalog.add(wanted.category, catalog.random_attributes(wanted.attributes),
                                 rng.randint(10, each // 100) * 100 - 1, rng.sample(others, rng.randint(1, len(others)))))
    catalog.fill(CATALOG_SIZE[level], wanted)
    products = catalog.products
    fits = satisfying(products, wanted)
    assert fits == ([target] if feasible else []), (fits, target, feasible)  # by construction
    address = account["addresses"][0] if level < 3 else rng.choice(account["addresses"])
    qty = "" if wanted.quantity == 1 else f"{wanted.quantity} "
    thing = describe(wanted, plural=wanted.quantity > 1)
    goal = (f"Buy {qty}{thing}, in {option_name} {option}, spending at most {money(wanted.budget)} in total, and "
            f"ship the order to your \"{address['label']}\" address. When the order is placed, call answer with its "
            f"order number. {INFEASIBLE_HINT}")
    reference = _find(wanted, catalog.products)
    if feasible:
        reference += [("click", {"id": PRODUCT_LINK + sorted(products).index(target)}),
                      ("select", {"id": OPTION, "option": option})]
        if wanted.quantity > 1:
            reference.append(("type", {"id": QUANTITY, "text": str(wanted.quantity)}))
        reference += [("click", {"id": ADD_TO_CART}), ("click", {"id": CART}), ("click", {"id": CHECKOUT})]
        if address["id"] != account["default_address"]:  # checkout ships to the default unless told
            reference.append(("select", {"id": ADDRESS, "option": address["label"]}))
        reference += [("click", {"id": PLACE_ORDER}), ("answer", {"text": "{order}"})]  # the number, filled in below
        why = None
    else:
        # the results line shows a product over budget; one within it must be opened to see it lacks the option
        within = [p for p in sorted(products) if not misses(products[p], wanted) and affordable(products[p], wanted)]
        for k, pid in enumerate(within):
            reference += [("back", {})] * (k > 0) + [("click", {"id": PRODUCT_LINK + sorted(products).index(pid)})]
        why = (f"no {describe(wanted, article=False)} within the budget offers {option_name} {option}" if within else
               f"every {describe(wanted, article=False)} costs more than {money(each)}")
        reference.append(("report_infeasible", {"reason": f"The shop cannot do this: {why}."}))
    facts = {"why_infeasible": why, "wanted": wanted, "target": target if feasible else None,
             "address_id": address["id"]}
    features = {"n_attributes": float(len(wanted.attributes)), "quantity": float(wanted.quantity),
                "n_near_misses": float(len(near)), "n_twins": float(len(twins))}
    return products, facts, goal, reference, features


def _find(wanted: Wanted, products: dict[str, dict]) -> list[tuple[str, dict]]:
    """Open the results of a search by the noun and the attributes the filters cannot set, filtered
    by the rest: one url the goal's words make (each call of a reference is one it needs)."""
    words = [CATEGORIES[wanted.category][0]] + [v for k, v in wanted.attributes.items() if k not in FILTERS]
    site = Site({"products": products, "order": sorted(products), "page_size": 1, "listing_attrs": [],
                 "past_orders": []})
    query = {"q": " ".join(words)}
    for k, v in wanted.attributes.items():
        if k in FILTERS:
            if v not in site.results(query)[1][k]:  # the filter does not offer it: nothing matches
                break
            query[k] = v
    return [("goto", {"url": site.search_url(query)})]


def _info(rng: random.Random, level: int, feasible: bool, account: dict):
    question = rng.choice(["price", "rating", "order_total"])
    wanted, full, price = _wanted(rng, level, budgeted=False)
    catalog = _Catalog(rng)
    target = catalog.add(wanted.category, catalog.random_attributes(full), price) if feasible else None
    near = _near_misses(catalog, wanted, full, NEAR_MISSES[level], (15, 260))
    if target and question == "rating":  # a near miss never shares the target's rating
        for pid in near:
            if catalog.products[pid]["rating"] == catalog.products[target]["rating"]:
                catalog.products[pid]["rating"] = round(catalog.products[pid]["rating"] + (0.1 if catalog.products[
                    pid]["rating"] < 5.0 else -0.1), 1)
    catalog.fill(CATALOG_SIZE[level], wanted)
    products = catalog.products
    if question == "order_total":  # filled in once the past orders exist
        return products, {"question": question}, "", [], {"n_near_misses": 0.0}
    asked = {"price": "What is the price of", "rating": "What is the customer rating (out of 5) of"}[question]
    goal = f"{asked} {describe(wanted).replace('a pair of ', 'the ', 1).replace('a ', 'the ', 1)} on the shop? " \
           f"{ANSWER_HINT} {INFEASIBLE_HINT}"
    reference = _find(wanted, products)
    if feasible:
        p = products[target]
        value = p["price"] / 100 if question == "price" else p["rating"]
        reference += [("click", {"id": PRODUCT_LINK + sorted(products).index(target)}),
                      ("answer", {"text": f"{value:.2f}" if question == "price" else str(value)})]
        why = None
    else:
        value, why = None, f"the shop has no {describe(wanted, article=False)}"
        reference.append(("report_infeasible", {"reason": f"There is no such product: {why}."}))
    facts = {"why_infeasible": why, "wanted": wanted, "target": target, "question": question, "answer": value}
    return products, facts, goal, reference, {"n_attributes": float(len(wanted.attributes)),
                                              "n_near_misses": float(len(near))}


def _order_question(rng: random.Random, past: list[dict], facts: dict):
    i = rng.randrange(len(past))
    order = past[i]
    goal = f"What was the total of your order placed on {order['date']}? {ANSWER_HINT} {INFEASIBLE_HINT}"
    total = order["total"] / 100
    reference = [("click", {"id": ACCOUNT}), ("click", {"id": ORDERS_LINK}), ("click", {"id": ORDER_LINK + i}),
                 ("answer", {"text": f"{total:.2f}"})]
    facts = {"question": "order_total", "order_id": order["order_id"], "answer": total}
    return reference, facts, goal


def _account_change(rng: random.Random, level: int, feasible: bool, account: dict):
    change = rng.choice(["phone", "default_address", "new_address"]) if feasible else "default_address"
    catalog = _Catalog(rng)
    catalog.fill(CATALOG_SIZE[level], Wanted(category="none", attributes={}))
    after = {k: v for k, v in account.items() if k in ("email", "phone", "default_address", "addresses")}
    after["addresses"] = [dict(a) for a in account["addresses"]]
    why = None
    if change == "phone":
        phone = next(p for p in (f"555-0{rng.randint(100, 199)}" for _ in range(50)) if p != account["phone"])
        after["phone"] = phone
        goal = f"Change the phone number on your account to {phone}. Then call answer with \"done\". {INFEASIBLE_HINT}"
        reference = [("click", {"id": ACCOUNT}), ("click", {"id": PROFILE_LINK}),
                     ("type", {"id": FORM["phone"], "text": phone}), ("click", {"id": SAVE})]
    elif change == "default_address" and feasible:
        i = rng.randrange(1, len(account["addresses"]))
        address = account["addresses"][i]
        after["default_address"] = address["id"]
        goal = (f"Make your \"{address['label']}\" address the default shipping address. Then call answer with "
                f"\"done\". {INFEASIBLE_HINT}")
        reference = [("click", {"id": ACCOUNT}), ("click", {"id": ADDRESSES_LINK}), ("click", {"id": SET_DEFAULT + i})]
    elif change == "default_address":
        label = rng.choice(NEW_LABELS)
        why = f"you have no address labelled \"{label}\""
        goal = (f"Make your \"{label}\" address the default shipping address. Then call answer with \"done\". "
                f"{INFEASIBLE_HINT}")
        reference = [("click", {"id": ACCOUNT}), ("click", {"id": ADDRESSES_LINK}),
                     ("report_infeasible", {"reason": f"There is nothing to set: {why}."})]
    else:
        new = {"label": rng.choice(NEW_LABELS), "street": f"{rng.randint(2, 980)} {rng.choice(STREETS)}",
               "city": rng.choice(CITIES), "zip": f"{rng.randint(1000, 99999):05d}"}
        after["addresses"].append({"id": f"A{len(account['addresses']) + 1}", **new})
        goal = (f"Add a new address to your account: label \"{new['label']}\", street \"{new['street']}\", city "
                f"\"{new['city']}\", zip \"{new['zip']}\". Then call answer with \"done\". {INFEASIBLE_HINT}")
        reference = [("click", {"id": ACCOUNT}), ("click", {"id": ADDRESSES_LINK}), ("click", {"id": NEW_ADDRESS_LINK})]
        reference += [("type", {"id": FORM[k], "text": new[k]}) for k in ("label", "street", "city", "zip")]
        reference.append(("click", {"id": SAVE}))
    if feasible:
        reference.append(("answer", {"text": "done"}))
    facts = {"why_infeasible": why, "change": change, "account_after": after}
    return catalog.products, facts, goal, reference, {"n_attributes": 0.0}


# -- hidden variants --------------------------------------------------------------------------
def _reordered(rng: random.Random, order: list[str]) -> Variant:
    """The same products listed in another order (so other products on each results page)."""
    other = list(reversed(order))
    cut = rng.randrange(len(other))
    return Variant(name="results_reordered", order=other[cut:] + other[:cut])


def _distractor_changed(rng: random.Random, products: dict[str, dict], facts: dict) -> Variant:
    """The distractor nearest the target made different (name, price, rating and the attribute it
    misses by); the verdict must not hang on a distractor's details."""
    wanted: Wanted | None = facts.get("wanted")
    target = facts.get("target")
    near = [pid for pid in sorted(products) if pid != target and wanted is not None
            and len(misses(products[pid], wanted)) == 1]
    pid = near[0] if near else sorted(p for p in products if p != target)[0]
    p = dict(products[pid])
    p["name"] = p["name"] + " II"
    p["rating"] = round(3.0 + (p["rating"] + 0.7 - 3.0) % 2.0, 1)
    p["price"] = p["price"] + 500
    if target and (p["rating"] == products[target]["rating"] or p["price"] == products[target]["price"]):
        p["rating"], p["price"] = round(3.0 + (p["rating"] + 0.3 - 3.0) % 2.0, 1), p["price"] + 200
    if near:
        (attribute, _, want), = misses(p, wanted)
        if attribute != "category":
            p[attribute] = next(v for v in VALUES[attribute] if v not in (want, products[pid][attribute]))
    return Variant(name="distractor_changed", products={pid: p})
