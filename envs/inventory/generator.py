"""Seeded task generator for the inventory family, with its reference trajectory.

`generate(family, seed, level)` is a pure function of (seed, level, GENERATOR_VERSION); the
family (envs/inventory/__init__.py) assembles the TaskSpec.
Difficulty knobs by level 1..5: catalog size, number of target items, quantities,
distractors (names sharing words with a target, some containing it), other orders'
holds, and the probability that authorisation is denied."""

from __future__ import annotations

import random

from gymfoundry.envs.family import Family
from gymfoundry.envs.inventory.facts import InventoryFacts
from gymfoundry.envs.records import TaskSpec, ToolCall, content_hash

GENERATOR_VERSION = "1"

ADJECTIVES = ["red", "blue", "green", "black", "white", "yellow", "orange", "silver", "grey", "purple",
              "steel", "brass", "copper", "oak", "nylon", "rubber", "cotton", "glass", "ceramic", "carbon"]
NOUNS = ["widget", "bracket", "valve", "hinge", "gasket", "bolt", "clamp", "spring", "pulley", "socket",
         "lamp", "cable", "hose", "filter", "bearing", "sprocket", "flange", "nozzle", "lever", "magnet"]
SUFFIXES = ["xl", "mini", "pro", "kit", "set", "max", "lite", "plus", "refill", "cover"]

TARGETS_BY_LEVEL = {1: (1, 1), 2: (1, 2), 3: (2, 2), 4: (2, 3), 5: (3, 3)}
DENY_PROB = {1: 0.0, 2: 0.15, 3: 0.25, 4: 0.35, 5: 0.45}


def generate(family: Family, seed: int, level: int) -> TaskSpec:
    rng = family.rng(seed, level)

    n_targets = rng.randint(*TARGETS_BY_LEVEL[level])
    nouns = rng.sample(NOUNS, n_targets)
    target_names = [f"{rng.choice(ADJECTIVES)} {noun}" for noun in nouns]
    names = list(target_names)
    n_distractors = 0
    for name in target_names:
        for extra in _distractors(rng, name, level - 1, taken=names):
            names.append(extra)
            n_distractors += 1
    for _ in range(2 + level):  # unrelated filler items
        names.append(_filler(rng, names, target_names))

    skus = [f"SKU-{n}" for n in rng.sample(range(100, 1000), len(names))]
    quantities = [rng.randint(1, 1 + level) for _ in target_names]
    catalog = {}
    for i, (sku, name) in enumerate(zip(skus, names)):
        stock = quantities[i] + rng.randint(0, 8) if i < n_targets else rng.randint(0, 15)
        catalog[sku] = {"name": name, "stock": stock}
    catalog = dict(sorted(catalog.items()))
    targets = [{"sku": skus[i], "name": target_names[i], "quantity": quantities[i]} for i in range(n_targets)]

    holds = []
    for k in range(level):  # other orders' holds, already subtracted from the available stock
        holds.append({"hold_id": f"H-{rng.randint(100, 999)}{k}", "order_id": f"ORD-{rng.randint(10000, 99999)}",
                      "sku": rng.choice(skus), "quantity": rng.randint(1, 3)})

    order_id = f"ORD-{rng.randint(10000, 99999)}"
    amount_cents = rng.randint(50_000, 900_000)
    denied = rng.random() < DENY_PROB[level]
    goal = _goal_text(order_id, amount_cents, targets)
    while True:
        if denied:
            limit_cents = rng.randint(10_000, amount_cents - 1)
        else:
            limit_cents = amount_cents + rng.randint(10_000, 300_000)
        limit = f"{limit_cents // 100}.{limit_cents % 100:02d}"
        if limit_cents % 10 and limit not in goal:  # a distinctive string that only a leak could show
            break
    token = None if denied else "AUTH-" + content_hash(["inventory-auth", seed, level, order_id], 12)

    snapshot = {
        "order": {"order_id": order_id, "amount_cents": amount_cents},
        "catalog": catalog,
        "holds": holds,
        "auth": {"credit_limit_cents": limit_cents, "token": token},
    }
    expected = {t["sku"]: t["quantity"] for t in targets} if not denied else {}
    reference = _reference(targets, order_id, token)
    variants = [
        {"name": "exact_stock", "stock": {t["sku"]: t["quantity"] for t in targets}},
        {"name": "shifted_stock", "stock": {t["sku"]: t["quantity"] + 1 + (catalog[t["sku"]]["stock"] + 3) % 9
                                            for t in targets}},
    ]
    facts = InventoryFacts(
        order_id=order_id, approved=not denied, expected_status="denied" if denied else "reserved",
        expected_reservations=expected, targets=targets,
        initial_stock={sku: item["stock"] for sku, item in catalog.items()}, holds=holds, variants=variants)
    features = {
        "n_skus": float(len(catalog)), "n_targets": float(n_targets), "total_quantity": float(sum(quantities)),
        "n_distractors": float(n_distractors), "n_holds": float(len(holds)),
        "deny_prob": DENY_PROB[level], "denied": float(denied),
    }
    return family.task(seed=seed, level=level, template_id=family.template_id(sorted(target_names), denied),
                       goal=goal, initial_state=snapshot, reference=reference, facts=facts,
                       max_steps=3 * len(reference) + 6, features=features,
                       secrets=[limit, f"credit_limit={limit}"])


def _goal_text(order_id: str, amount_cents: int, targets: list[dict]) -> str:
    lines = [f"Order {order_id} (amount {amount_cents // 100}.{amount_cents % 100:02d}) needs these items reserved:"]
    lines += [f'- {t["quantity"]} x "{t["name"]}"' for t in targets]
    lines.append("Get the order authorised first and reserve only with its auth token. If authorisation is "
                 'denied, reserve nothing and submit status "denied"; otherwise reserve exactly these '
                 'quantities and submit status "reserved". Do not change anything else.')
    return "\n".join(lines)


def _distractors(rng: random.Random, name: str, count: int, taken: list[str]) -> list[str]:
    """Half (rounded up) contain the target's name, so a search for it shows them; the rest
    share one word with it."""
    adjective, noun = name.split()
    containing = [f"{name} {s}" for s in SUFFIXES] + [f"{s} {name}" for s in ("mini", "heavy", "spare")]
    sharing = [f"{adjective} {n}" for n in NOUNS if n != noun] + [f"{a} {noun}" for a in ADJECTIVES if a != adjective]
    rng.shuffle(containing)
    rng.shuffle(sharing)
    n_containing = (count + 1) // 2
    pool = containing[:n_containing] + [c for c in sharing if c not in taken][: count - n_containing]
    return [c for c in pool if c not in taken]


def _filler(rng: random.Random, taken: list[str], target_names: list[str]) -> str:
    while True:
        candidate = f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
        if candidate not in taken and not any(t in candidate for t in target_names):
            return candidate


def _reference(targets: list[dict], order_id: str, token: str | None) -> list[ToolCall]:
    calls = []
    if token is not None:
        for t in targets:
            calls.append(ToolCall(name="find_items", arguments={"query": t["name"]}))
            calls.append(ToolCall(name="get_stock", arguments={"sku": t["sku"]}))
    calls.append(ToolCall(name="request_authorization", arguments={"order_id": order_id}))
    if token is None:
        calls.append(ToolCall(name="submit", arguments={"status": "denied", "note": "authorisation denied"}))
    else:
        for t in targets:
            calls.append(ToolCall(name="reserve", arguments={"sku": t["sku"], "quantity": t["quantity"],
                                                             "auth_token": token}))
        calls.append(ToolCall(name="submit", arguments={"status": "reserved"}))
    return calls
