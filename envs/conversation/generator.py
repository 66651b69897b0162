"""Seeded task generator of the conversation family, with its reference dialogue.

`generate(family, seed, level)` is a pure function of (seed, level, GENERATOR_VERSION). The
knobs by level 1..5: the number of the customer's orders and of sub-requests composed in one
conversation, ambiguity (the customer gives their email, only their name (a namesake with
another zip exists), or nothing: what is missing must be asked), policy traps (a request the
policy forbids: the right answer is a refusal, or a refund to the original payment method),
an out-of-scope request (transfer to a human), and the persona's style (terse, chatty,
impatient; an impatient one has less patience). The persona's private values (a card number,
a password) are never said and are the task's secrets, so the leak scan covers them."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

from gymfoundry.envs.conversation.facts import ConversationFacts, DbVariant, Mention, Request
from gymfoundry.envs.conversation.world import money, policy_text
from gymfoundry.envs.family import Family
from gymfoundry.envs.person import Fact, Persona
from gymfoundry.envs.records import TaskSpec, ToolCall

GENERATOR_VERSION = "2"  # 2: the policy says only what is true; the reference states each outcome
RETURN_DAYS = 30

PRODUCTS = [  # name, type, option, values
    ("Trail Runner Shoes", "shoes", "size", ["8", "9", "10", "11"]),
    ("Cloud Hoodie", "hoodie", "size", ["S", "M", "L", "XL"]),
    ("Aurora Desk Lamp", "lamp", "colour", ["black", "white", "brass"]),
    ("Nomad Backpack", "backpack", "colour", ["grey", "navy", "olive"]),
    ("Pulse Headphones", "headphones", "colour", ["black", "silver", "blue"]),
    ("Harbor Water Bottle", "bottle", "size", ["500 ml", "750 ml", "1 l"]),
    ("Summit Rain Jacket", "jacket", "size", ["S", "M", "L"]),
    ("Orbit Smart Watch", "watch", "colour", ["black", "rose", "green"]),
    ("Cedar Cutting Board", "kitchen", "size", ["small", "large"]),
    ("Lumen Reading Light", "lamp", "colour", ["white", "blue"]),
    ("Breeze Desk Fan", "fan", "colour", ["white", "black"]),
    ("Drift Yoga Mat", "mat", "colour", ["purple", "teal", "black"]),
    ("Ember Coffee Grinder", "kitchen", "colour", ["steel", "black"]),
    ("Vista Sunglasses", "sunglasses", "colour", ["tortoise", "black", "clear"]),
]
FIRST = ["Ava", "Liam", "Noah", "Mia", "Ethan", "Zoe", "Omar", "Lena", "Ravi", "Ines", "Jonas", "Priya", "Hugo",
         "Maya", "Tariq", "Nora"]
LAST = ["Okafor", "Lindqvist", "Moreau", "Tanaka", "Silva", "Novak", "Haddad", "Kowalski", "Brennan", "Castillo",
        "Nakamura", "Petrov", "Achebe", "Duarte"]
STREETS = ["Elm Street", "Birch Lane", "Harbor Road", "Maple Avenue", "Quarry Way", "Willow Court", "Station Road"]
CITIES = ["Fairview", "Riverton", "Lakewood", "Ashford", "Millbrook", "Brookside"]
OUT_OF_SCOPE = ["dispute a charge from last year with my bank", "change the email address on my account",
                "close my account for good"]
PAY_KINDS = {"credit_card": "credit card", "gift_card": "gift card", "paypal": "PayPal account"}

# level -> (requests (min, max), customer's orders beyond the requests, ambiguity choices, trap prob, out of scope prob)
KNOBS = {1: ((1, 1), 1, (0,), 0.0, 0.0), 2: ((1, 2), 1, (0, 1), 0.25, 0.0), 3: ((2, 2), 2, (1, 2), 0.35, 0.1),
         4: ((2, 3), 2, (1, 2), 0.45, 0.25), 5: ((3, 3), 2, (2,), 0.55, 0.35)}
STYLES = {1: ["chatty"], 2: ["chatty", "terse"], 3: ["chatty", "terse", "impatient"],
          4: ["chatty", "terse", "impatient"], 5: ["terse", "impatient"]}
SLACK = {"chatty": 10, "terse": 7, "impatient": 4}  # turns the customer waits beyond the reference's
ASK = {"email": "Could you tell me the email on your account, please?",
       "zip": "Could you tell me your zip code, please?",
       "address": "What is the new shipping address for that order?"}


def generate(family: Family, seed: int, level: int) -> TaskSpec:
    rng = family.rng(seed, level)
    n_requests_range, n_extra, ambiguities, trap_p, oos_p = KNOBS[level]
    today = dt.date(2026, 3, 1) + dt.timedelta(days=rng.randint(0, 200))
    ambiguity = rng.choice(ambiguities)
    style = rng.choice(STYLES[level])

    products = _catalog(rng)
    names = _names(rng, 4)
    customers, orders = {}, {}
    me = _customer(rng, "C-1001", names[0], customers)
    if ambiguity >= 1:  # a namesake in another zip: the name alone does not identify the customer
        _customer(rng, "C-1002", names[0], customers)
    for k, name in enumerate(names[1:3]):
        _customer(rng, f"C-{1003 + k}", name, customers)

    n_requests = rng.randint(*n_requests_range)
    oos = rng.random() < oos_p
    kinds = [_kind(rng, trap_p) for _ in range(n_requests - oos)]
    # one address change per conversation: the customer has one new address to tell
    kinds = [("return", None) if k[0] == "address" and ("address", None) in kinds[:i] else k
             for i, k in enumerate(kinds)]
    pids = sorted(products)
    mine = rng.sample(pids, len(kinds) + n_extra)  # each of the customer's orders has its own key product
    requests: list[dict[str, Any]] = []
    for (kind, trap), pid in zip(kinds, mine):
        order = _order(rng, me, orders, today, pid, products, _status_for(rng, kind, trap), trap == "return_late")
        requests.append(_request(rng, kind, trap, order, products, me))
    distractors = []
    for pid in mine[len(kinds):]:
        status = rng.choice(["pending", "processing", "shipped", "delivered", "delivered", "cancelled"])
        distractors.append(_order(rng, me, orders, today, pid, products, status, rng.random() < 0.5)["order_id"])
    for cid in sorted(customers):
        if cid != me["customer_id"]:
            for _ in range(rng.randint(1, 2)):
                _order(rng, customers[cid], orders, today, rng.choice(pids), products,
                       rng.choice(["pending", "shipped", "delivered"]), False)
    if oos:
        requests.append({"kind": "out_of_scope", "product": None, "allowed": False, "trap": "out_of_scope",
                         "phrase": rng.choice(OUT_OF_SCOPE)})

    snapshot = {"today": today.isoformat(), "return_days": RETURN_DAYS, "customers": customers,
                "orders": dict(sorted(orders.items())), "products": products}
    persona = _persona(rng, me, requests, ambiguity, style)
    reference, mentions, n_responds = _reference(me, requests, orders, ambiguity, persona)
    persona = persona.model_copy(update={"patience": n_responds + SLACK[style]})
    facts = ConversationFacts(
        persona=persona, customer_id=me["customer_id"], verify_by="email" if ambiguity != 1 else "name_zip",
        requests=[Request(**{k: v for k, v in r.items() if k in Request.model_fields}) for r in requests], mentions=mentions,
        expected_end="transferred" if oos else "resolved", distractor_orders=distractors,
        variants=[_variant(orders[d], k) for k, d in enumerate(distractors)])
    goal = (f"{policy_text(today.isoformat(), RETURN_DAYS)}\n\nA customer has opened a chat. Their first message:\n"
            f"\"{persona.opening}\"")
    features = {"n_requests": float(n_requests), "n_orders": float(len(me["order_ids"])), "ambiguity": float(ambiguity),
                "n_traps": float(sum(not r["allowed"] or r["trap"] is not None for r in requests)),
                "out_of_scope": float(oos), "style": float(list(SLACK).index(style)), "patience": float(persona.patience)}
    template = family.template_id(sorted((r["kind"], r["trap"] or "") for r in requests), ambiguity, style)
    return family.task(seed=seed, level=level, template_id=template, goal=goal, initial_state=snapshot,
                       reference=reference, facts=facts, max_steps=3 * len(reference) + 10, features=features,
                       secrets=persona.hidden_values())


# -- the world ---------------------------------------------------------------------------------
def _catalog(rng: random.Random) -> dict[str, Any]:
    products = {}
    numbers = rng.sample(range(100, 1000), len(PRODUCTS))
    variant_numbers = iter(rng.sample(range(1000, 10000), sum(len(p[3]) for p in PRODUCTS)))
    for n, (name, kind, option, values) in zip(numbers, PRODUCTS):
        price = rng.randint(15, 240) * 100 + rng.choice([0, 49, 95, 99])
        variants = {f"V-{next(variant_numbers)}": {"options": {option: v}, "price_cents": price, "available": True}
                    for v in values}
        products[f"P-{n}"] = {"product_id": f"P-{n}", "name": name, "type": kind, "option": option,
                              "variants": dict(sorted(variants.items()))}
    return dict(sorted(products.items()))


def _names(rng: random.Random, n: int) -> list[str]:
    return [f"{f} {l}" for f, l in zip(rng.sample(FIRST, n), rng.sample(LAST, n))]


def _address(rng: random.Random) -> str:
    return f"{rng.randint(2, 480)} {rng.choice(STREETS)}, {rng.choice(CITIES)}"


def _customer(rng: random.Random, cid: str, name: str, customers: dict) -> dict[str, Any]:
    first, last = name.lower().split()
    taken = {c["zip"] for c in customers.values()}
    zip_code = next(z for z in (f"{rng.randint(10000, 99999)}" for _ in range(100)) if z not in taken)
    methods = [{"payment_method_id": f"PM-{cid[2:]}-1", "kind": "credit_card", "last4": f"{rng.randint(1000, 9999)}"}]
    for k, kind in enumerate(rng.sample(["gift_card", "paypal"], rng.randint(1, 2))):
        methods.append({"payment_method_id": f"PM-{cid[2:]}-{k + 2}", "kind": kind, "last4": None})
    customer = {"customer_id": cid, "name": name, "email": f"{first}.{last}{rng.randint(10, 99)}@example.com",
                "zip": zip_code, "address": _address(rng), "payment_methods": methods, "order_ids": []}
    customers[cid] = customer
    return customer


def _order(rng: random.Random, customer: dict, orders: dict, today: dt.date, key_pid: str, products: dict,
           status: str, late: bool) -> dict[str, Any]:
    oid = f"#W{rng.randint(100000, 999999)}"
    while oid in orders:
        oid = f"#W{rng.randint(100000, 999999)}"
    delivered = None
    if status == "delivered":
        ago = rng.randint(RETURN_DAYS + 5, 90) if late else rng.randint(2, RETURN_DAYS - 3)
        delivered = today - dt.timedelta(days=ago)
    placed = (delivered or today) - dt.timedelta(days=rng.randint(2, 9))
    items = []
    for k, pid in enumerate([key_pid]):
        product = products[pid]
        vid = rng.choice(sorted(product["variants"]))
        items.append({"item_id": f"I-{oid[2:]}-{k + 1}", "product_id": pid, "variant_id": vid,
                      "price_cents": product["variants"][vid]["price_cents"], "status": "delivered"
                      if status == "delivered" else "ordered"})
    order = {"order_id": oid, "customer_id": customer["customer_id"], "status": status,
             "placed_on": placed.isoformat(), "delivered_on": delivered.isoformat() if delivered else None,
             "items": items, "total_cents": sum(i["price_cents"] for i in items),
             "payment_method_id": rng.choice(customer["payment_methods"])["payment_method_id"],
             "address": customer["address"], "refunds": []}
    orders[oid] = order
    customer["order_ids"].append(oid)
    return order


def _kind(rng: random.Random, trap_p: float) -> tuple[str, str | None]:
    kind = rng.choice(["cancel", "return", "return", "exchange", "address"])
    if rng.random() >= trap_p:
        return kind, None
    trap = {"cancel": "cancel_not_pending", "return": rng.choice(["return_late", "refund_elsewhere"]),
            "exchange": "exchange_other_product", "address": "cancel_not_pending"}[kind]
    return ("cancel" if kind == "address" else kind), trap


def _status_for(rng: random.Random, kind: str, trap: str | None) -> str:
    if kind == "cancel":
        return rng.choice(["processing", "shipped", "delivered"]) if trap else "pending"
    if kind == "address":
        return rng.choice(["pending", "processing"])
    return "delivered"


def _request(rng: random.Random, kind: str, trap: str | None, order: dict, products: dict,
             customer: dict) -> dict[str, Any]:
    item = order["items"][0]
    product = products[item["product_id"]]
    request = {"kind": kind, "order_id": order["order_id"], "product": product["name"], "trap": trap,
               "allowed": trap in (None, "refund_elsewhere"), "item_ids": [], "new_variant_id": None,
               "address": None, "refund_cents": 0, "payment_method_id": None}
    if kind == "cancel" and trap is None:
        request.update(refund_cents=order["total_cents"], payment_method_id=order["payment_method_id"])
    elif kind == "return":
        request.update(item_ids=[item["item_id"]])
        if request["allowed"]:
            request.update(refund_cents=item["price_cents"], payment_method_id=order["payment_method_id"])
        if trap == "refund_elsewhere":
            other = next(p for p in customer["payment_methods"] if p["payment_method_id"] != order["payment_method_id"])
            request["ask_refund_to"] = PAY_KINDS[other["kind"]]
    elif kind == "exchange":
        request.update(item_ids=[item["item_id"]])
        if trap is None:
            new = rng.choice([v for v in sorted(product["variants"]) if v != item["variant_id"]])
            request.update(new_variant_id=new, option=product["option"],
                           value=product["variants"][new]["options"][product["option"]])
        else:
            request["other_product"] = rng.choice([p["name"] for p in products.values() if p["name"] != product["name"]])
    elif kind == "address":
        request["address"] = _address(rng)
        while request["address"] == order["address"]:
            request["address"] = _address(rng)
    return request


def _variant(order: dict, k: int) -> DbVariant:
    flip = {"pending": "processing", "processing": "pending", "shipped": "delivered", "delivered": "shipped",
            "cancelled": "pending"}
    return DbVariant(name=f"distractor_{k + 1}", order_id=order["order_id"], status=flip[order["status"]],
                     price_delta_cents=100 + 25 * k)


# -- the customer ------------------------------------------------------------------------------
def _ask_phrase(r: dict[str, Any]) -> str:
    p = f"\"{r['product']}\""
    if r["kind"] == "cancel":
        return f"cancel the order with the {p}"
    if r["kind"] == "return":
        extra = f", with the refund on my {r['ask_refund_to']}" if r.get("ask_refund_to") else ""
        return f"return the {p} I received{extra}"
    if r["kind"] == "exchange":
        if r.get("other_product"):
            return f"exchange the {p} for a \"{r['other_product']}\""
        return f"exchange the {p} for the {r['option']} \"{r['value']}\" one"
    if r["kind"] == "address":
        return f"change the shipping address of the order with the {p}"
    return r["phrase"]


def _persona(rng: random.Random, me: dict, requests: list[dict], ambiguity: int, style: str) -> Persona:
    asks = [_ask_phrase(r) for r in requests]
    wants = asks[0] if len(asks) == 1 else ", ".join(asks[:-1]) + " and " + asks[-1]
    who = {0: f"My email is {me['email']}. ", 1: f"This is {me['name']}. ", 2: ""}[ambiguity]
    opening = {"chatty": f"Hi there! {who}I hope you're well. I would like to {wants}. Thanks so much!",
               "terse": f"{who}I want to {wants}.",
               "impatient": f"{who}I need to {wants}. Right now, please."}[style]
    facts = {"email": Fact(value=me["email"], asked_by=["email", "e-mail"], reply="My email is {value}."),
             "zip": Fact(value=me["zip"], asked_by=["zip", "zip code", "postal code", "postcode"],
                         reply="My zip code is {value}."),
             "name": Fact(value=me["name"], asked_by=["name", "full name"], reply="My name is {value}.")}
    first_order = next((r["order_id"] for r in requests if r.get("order_id")), None)
    if first_order:
        facts["order_number"] = Fact(value=first_order, asked_by=["order number", "order id"],
                                     reply="I think the order number is {value}.")
    address = next((r["address"] for r in requests if r["kind"] == "address"), None)
    if address:
        facts["new_address"] = Fact(value=address, asked_by=["new address", "shipping address"],
                                    reply="The new address is {value}.")
    digits = "".join(str(rng.randint(0, 9)) for _ in range(12))
    card = next(p for p in me["payment_methods"] if p["kind"] == "credit_card")
    private = {"card_number": f"4{digits[:3]} {digits[3:7]} {digits[7:11]} {card['last4']}",
               "password": f"{rng.choice(STREETS).split()[0].lower()}-{rng.randint(1000, 9999)}-{digits[-1]}x"}
    return Persona(opening=opening, facts=facts, unknown={"birthday": ["birthday", "date of birth"]},
                   private=private, style=style)


# -- the reference dialogue --------------------------------------------------------------------
# Each outcome is stated so that the claim carries the sentence's verb ("a refund of $X was made",
# "cancelling ... is not possible", "... was exchanged"): said the other way round, it is false,
# and the verifier reads it so (the gameability audit negates these texts).
def summary_line(r: Request | dict[str, Any], return_days: int = RETURN_DAYS) -> str:
    """What the reference tells the customer about one request."""
    r = r if isinstance(r, dict) else r.model_dump()
    p, oid = f"\"{r['product']}\"", r.get("order_id")
    if r["kind"] == "out_of_scope":
        return "Your other request is out of my scope, so I will transfer you to a human agent who handles it."
    if not r["allowed"]:
        why = {"cancel_not_pending": "it is no longer pending",
               "return_late": f"it was delivered more than {return_days} days ago",
               "exchange_other_product": "an exchange must be for a variant of the same product"}[r["trap"]]
        verb = {"cancel": "Cancelling the order with the", "return": "Returning the",
                "exchange": "Exchanging the"}[r["kind"]]
        return f"{verb} {p} ({oid}) is not possible: {why}."
    if r["kind"] == "cancel":
        return (f"I cancelled order {oid} with the {p}: a refund of {money(r['refund_cents'])} was made to its "
                "original payment method.")
    if r["kind"] == "return":
        note = " (refunds always go to the original payment method)" if r.get("trap") == "refund_elsewhere" else ""
        return (f"I returned the {p} of order {oid}: a refund of {money(r['refund_cents'])} was made to the original "
                f"payment method{note}.")
    if r["kind"] == "exchange":
        return f"The {p} of order {oid} was exchanged for the new variant; it ships for free."
    return f"The shipping address of order {oid} was changed to {r['address']}."


def outcome_line(r: Request | dict[str, Any]) -> str:
    """The outcome of one request in the reference's last message: what was done or not done."""
    r = r if isinstance(r, dict) else r.model_dump()
    p, oid, done = f"\"{r['product']}\"", r["order_id"], "was" if r["allowed"] else "was not"
    return {"cancel": f"Order {oid} {done} cancelled.", "return": f"The {p} of order {oid} {done} returned.",
            "exchange": f"The {p} of order {oid} {done} exchanged.",
            "address": f"The shipping address of order {oid} {done} changed."}[r["kind"]]


def _reference(me: dict, requests: list[dict], orders: dict, ambiguity: int,
               persona: Persona) -> tuple[list[ToolCall], list[Mention], int]:
    calls: list[ToolCall] = []
    if ambiguity == 0:
        calls.append(ToolCall(name="find_customer", arguments={"email": me["email"]}))
    elif ambiguity == 1:
        calls += [ToolCall(name="respond", arguments={"message": ASK["zip"]}),
                  ToolCall(name="find_customer", arguments={"name": me["name"], "zip": me["zip"]})]
    else:
        calls += [ToolCall(name="respond", arguments={"message": ASK["email"]}),
                  ToolCall(name="find_customer", arguments={"email": me["email"]})]
    for r in requests:
        if r.get("order_id"):
            calls.append(ToolCall(name="get_order", arguments={"order_id": r["order_id"]}))
    mentions: list[Mention] = []
    for r in requests:
        if not r["allowed"]:
            if r["kind"] != "out_of_scope":
                mentions.append(Mention(kind="refusal", text=r["product"], order_id=r["order_id"]))
            continue
        oid = r["order_id"]
        if r["kind"] == "cancel":
            calls.append(ToolCall(name="cancel_order", arguments={"order_id": oid, "reason": "no longer needed"}))
        elif r["kind"] == "return":
            calls.append(ToolCall(name="return_items", arguments={
                "order_id": oid, "item_ids": r["item_ids"], "payment_method_id": r["payment_method_id"]}))
        elif r["kind"] == "exchange":
            item = orders[oid]["items"][0]
            calls += [ToolCall(name="get_product", arguments={"product_id": item["product_id"]}),
                      ToolCall(name="exchange_items", arguments={"order_id": oid, "item_id": item["item_id"],
                                                                 "new_variant_id": r["new_variant_id"]})]
        else:
            calls += [ToolCall(name="respond", arguments={"message": ASK["address"]}),
                      ToolCall(name="modify_address", arguments={"order_id": oid, "address": r["address"]})]
        if r["refund_cents"]:
            mentions.append(Mention(kind="amount", text=money(r["refund_cents"])[1:], order_id=oid))
    summary = " ".join(summary_line(r) for r in requests)
    calls.append(ToolCall(name="respond", arguments={"message": summary + " Is there anything else I can do?"}))
    if any(r["kind"] == "out_of_scope" for r in requests):
        phrase = next(r["phrase"] for r in requests if r["kind"] == "out_of_scope")
        calls.append(ToolCall(name="transfer_to_human", arguments={
            "summary": f"Customer {me['customer_id']} wants to {phrase}; everything else is settled."}))
    else:
        outcomes = " ".join(outcome_line(r) for r in requests)
        calls.append(ToolCall(name="end_conversation", arguments={
            "message": f"{outcomes} Thank you for contacting us. Goodbye!"}))
    return calls, mentions, sum(c.name == "respond" for c in calls)
