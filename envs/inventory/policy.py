"""Scripted, observation-only policy for the inventory family.

It reads the goal text and the tool results it is shown, nothing else. It does what the goal
says in the order the goal says: authorise first, then find and reserve one goal item at a
time, then submit. With probability `mistake_rate` per opportunity it makes a realistic
mistake (a distractor sku, a reserve before authorising, one unit too many, giving up early,
a repeated read) and sometimes notices and recovers.

Its thoughts carry the plan forward one item at a time: `Need 2 x "red valve".` quotes the goal
line being worked on, and each reservation names the goal line that comes next (`Next: 1 x
"blue hinge".` or `Next: nothing.`). Whether to go on or submit, and what to look for next,
can then be read from the model's own last turn instead of being recounted from the goal."""

from __future__ import annotations

import re
from collections.abc import Generator

from gymfoundry.envs.scripted import ScriptedPolicy, tool_result as _result

GOAL_ORDER = re.compile(r"Order (ORD-\d+)")
GOAL_ITEM = re.compile(r'^- (\d+) x "([a-z ]+)"$', re.MULTILINE)
MAX_TURNS = 40

Pick = tuple[dict | None, str | None]  # (the picked catalog item, the sku of the exact name)


class ScriptedInventoryPolicy(ScriptedPolicy):
    policy_id = "scripted-inventory"
    script_version = "3"  # 3: authorise first, one item at a time, "Next:" in thoughts
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

        found_early: Pick | None = None
        if self._mistake():  # finds the first item and reserves before authorising; the refusal makes it authorise
            quantity, name = items[0]
            found_early = yield from self._find(quantity, name)
            if found_early[0] is not None:
                yield self._say(f"Reserve {_line(quantity, name)} as {found_early[0]['sku']} right away.", "reserve",
                                {"sku": found_early[0]["sku"], "quantity": quantity, "auth_token": ""})

        obs = yield self._say(f"Authorise order {order_id} first.", "request_authorization", {"order_id": order_id})
        auth = _result(obs) or {}
        if auth.get("status") != "approved":
            yield self._say("Authorisation was denied; reserve nothing.", "submit",
                            {"status": "denied", "note": "authorisation denied"})
            return
        token = auth.get("auth_token", "")

        for k, (quantity, name) in enumerate(items):
            if k > 0 and self._mistake():  # gives up early
                break
            pick, exact_sku = found_early if k == 0 and found_early else (yield from self._find(quantity, name))
            if pick is None:
                continue
            upcoming = _line(*items[k + 1]) if k + 1 < len(items) else "nothing"
            yield from self._reserve(quantity, name, pick, exact_sku, token, upcoming)
        yield self._say("All items are reserved.", "submit", {"status": "reserved"})

    def _find(self, quantity: int, name: str) -> Generator[str, str, Pick]:
        obs = yield self._say(f"Need {_line(quantity, name)}.", "find_items", {"query": name})
        if self._mistake():  # repeated read
            obs = yield self._say(f'Search again for "{name}".', "find_items", {"query": name})
        candidates = (_result(obs) or {}).get("items", [])
        exact = next((c for c in candidates if c["name"] == name), None)
        others = [c for c in candidates if c["name"] != name]
        pick = exact or (candidates[0] if candidates else None)
        if others and self._mistake():  # a distractor
            pick = self.rng.choice(others)
        return pick, exact["sku"] if exact else None

    def _reserve(self, quantity: int, name: str, pick: dict, exact_sku: str | None, token: str,
                 upcoming: str) -> Generator[str, str, None]:
        over = int(self._mistake())
        obs = yield self._say(f"Reserve {_line(quantity + over, name)} as {pick['sku']}. Next: {upcoming}.", "reserve",
                              {"sku": pick["sku"], "quantity": quantity + over, "auth_token": token})
        made = _result(obs)
        wrong_item = exact_sku is not None and pick["sku"] != exact_sku
        if made and (over or wrong_item) and self.rng.random() < 0.5:  # notices and recovers
            yield self._say(f"{made['reservation_id']} is wrong; release it.", "release",
                            {"reservation_id": made["reservation_id"]})
            sku = exact_sku if wrong_item else pick["sku"]
            yield self._say(f"Reserve {_line(quantity, name)} as {sku}. Next: {upcoming}.", "reserve",
                            {"sku": sku, "quantity": quantity, "auth_token": token})


def _line(quantity: int, name: str) -> str:
    """A goal item as the goal writes it (without the leading dash): `2 x "red valve"`."""
    return f'{quantity} x "{name}"'
