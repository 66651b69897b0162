"""Scripted, observation-only policy for the inventory family.

It reads the goal text and the tool results it is shown, nothing else. With probability
`mistake_rate` per opportunity it makes a realistic mistake (a distractor sku, a reserve
before authorising, one unit too many, giving up early, a repeated read) and sometimes
notices and recovers. Its thoughts keep count ("Item 2 of 3: ..."): what to do next after a
lookup or a reservation depends on how many goal items are done, and a model trained on these
thoughts can read that count from its own last turn instead of recounting the conversation."""

from __future__ import annotations

import re
from collections.abc import Generator

from envs.scripted import ScriptedPolicy, tool_result as _result

GOAL_ORDER = re.compile(r"Order (ORD-\d+)")
GOAL_ITEM = re.compile(r'^- (\d+) x "([a-z ]+)"$', re.MULTILINE)
MAX_TURNS = 40


class ScriptedInventoryPolicy(ScriptedPolicy):
    policy_id = "scripted-inventory"
    script_version = "2"  # 2: thoughts keep count ("Item k of n")
    max_turns = MAX_TURNS

    def _final_call(self, reason: str) -> str:
        if reason == "out of turns":
            return self._say("I am out of turns.", "submit", {"status": "reserved", "note": "out of turns"})
        return self._say("Done.", "submit", {"status": "reserved"})

    # -- the script -------------------------------------------------------------------
    def _run(self, goal: str) -> Generator[str, str, None]:
        order = GOAL_ORDER.search(goal)
        items = [(int(q), name) for q, name in GOAL_ITEM.findall(goal)]
        if order is None or not items:
            yield self._say("I cannot read the goal.", "submit", {"status": "denied", "note": "unreadable goal"})
            return
        order_id = order.group(1)

        chosen: list[tuple[int, dict, str | None]] = []  # (quantity, picked item, sku of the exact name)
        for k, (quantity, name) in enumerate(items, 1):
            obs = yield self._say(f"Item {k} of {len(items)}: find the item named {name}.", "find_items",
                                  {"query": name})
            if self._mistake():  # repeated read
                obs = yield self._say(f"Search again for {name}.", "find_items", {"query": name})
            candidates = (_result(obs) or {}).get("items", [])
            exact = next((c for c in candidates if c["name"] == name), None)
            others = [c for c in candidates if c["name"] != name]
            pick = exact or (candidates[0] if candidates else None)
            if others and self._mistake():  # a distractor
                pick = self.rng.choice(others)
            if pick is None:
                continue
            yield self._say(f"Check stock of {pick['sku']}.", "get_stock", {"sku": pick["sku"]})
            chosen.append((quantity, pick, exact["sku"] if exact else None))

        if chosen and self._mistake():  # reserve before authorising; the refusal makes it authorise
            quantity, pick, _ = chosen[0]
            yield self._say("Reserve right away.", "reserve",
                            {"sku": pick["sku"], "quantity": quantity, "auth_token": ""})

        obs = yield self._say(f"Authorise order {order_id}.", "request_authorization", {"order_id": order_id})
        auth = _result(obs) or {}
        if auth.get("status") != "approved":
            yield self._say("Authorisation was denied; reserve nothing.", "submit",
                            {"status": "denied", "note": "authorisation denied"})
            return
        token = auth.get("auth_token", "")

        for i, (quantity, pick, exact_sku) in enumerate(chosen):
            if i > 0 and self._mistake():  # gives up early
                break
            over = int(self._mistake())
            obs = yield self._say(f"Item {i + 1} of {len(chosen)}: reserve {quantity + over} of {pick['sku']}.",
                                  "reserve",
                                  {"sku": pick["sku"], "quantity": quantity + over, "auth_token": token})
            made = _result(obs)
            wrong_item = exact_sku is not None and pick["sku"] != exact_sku
            if made and (over or wrong_item) and self.rng.random() < 0.5:  # notices and recovers
                yield self._say(f"{made['reservation_id']} is wrong; release it.", "release",
                                {"reservation_id": made["reservation_id"]})
                sku = exact_sku if wrong_item else pick["sku"]
                yield self._say(f"Item {i + 1} of {len(chosen)}: reserve {quantity} of {sku}.", "reserve",
                                {"sku": sku, "quantity": quantity, "auth_token": token})
        yield self._say(f"All {len(chosen)} items are reserved.", "submit", {"status": "reserved"})
