"""Scripted, observation-only policy for the inventory family.

It reads the goal text and the tool results it is shown, nothing else. With probability
`mistake_rate` per opportunity it makes a realistic mistake (a distractor sku, a reserve
before authorising, one unit too many, giving up early, a repeated read) and sometimes
notices and recovers."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Generator

GOAL_ORDER = re.compile(r"Order (ORD-\d+)")
GOAL_ITEM = re.compile(r'^- (\d+) x "([a-z ]+)"$', re.MULTILINE)
MAX_TURNS = 40


class ScriptedInventoryPolicy:
    policy_id = "scripted-inventory"

    def __init__(self, mistake_rate: float = 0.2, seed: int = 0):
        self.mistake_rate = mistake_rate
        # The mistake rate is part of what the policy is: rollouts at other rates are other rollouts.
        self.version = f"1+mistakes{mistake_rate:g}"
        self.seed = seed
        self.reset(seed)

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.rng = random.Random(seed)
        self._script: Generator[str, str, None] | None = None
        self._turns = 0

    def act(self, observation: str) -> str:
        self._turns += 1
        if self._turns > MAX_TURNS:
            return self._say("I am out of turns.", "submit", {"status": "reserved", "note": "out of turns"})
        try:
            if self._script is None:
                self._script = self._run(observation)
                return next(self._script)
            return self._script.send(observation)
        except StopIteration:
            return self._say("Done.", "submit", {"status": "reserved"})

    # -- the script -------------------------------------------------------------------
    def _mistake(self) -> bool:
        return self.rng.random() < self.mistake_rate

    def _say(self, thought: str, name: str, arguments: dict) -> str:
        call = json.dumps({"name": name, "arguments": arguments})
        if self.rng.random() < 0.5:
            return f"{thought}\n<tool_call>{call}</tool_call>"
        return f"Thought: {thought}\n{call}"

    def _run(self, goal: str) -> Generator[str, str, None]:
        order = GOAL_ORDER.search(goal)
        items = [(int(q), name) for q, name in GOAL_ITEM.findall(goal)]
        if order is None or not items:
            yield self._say("I cannot read the goal.", "submit", {"status": "denied", "note": "unreadable goal"})
            return
        order_id = order.group(1)

        chosen: list[tuple[int, dict, str | None]] = []  # (quantity, picked item, sku of the exact name)
        for quantity, name in items:
            obs = yield self._say(f"Find the item named {name}.", "find_items", {"query": name})
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
            obs = yield self._say(f"Reserve {quantity + over} of {pick['sku']}.", "reserve",
                                  {"sku": pick["sku"], "quantity": quantity + over, "auth_token": token})
            made = _result(obs)
            wrong_item = exact_sku is not None and pick["sku"] != exact_sku
            if made and (over or wrong_item) and self.rng.random() < 0.5:  # notices and recovers
                yield self._say(f"{made['reservation_id']} is wrong; release it.", "release",
                                {"reservation_id": made["reservation_id"]})
                sku = exact_sku if wrong_item else pick["sku"]
                yield self._say(f"Reserve {quantity} of {sku}.", "reserve",
                                {"sku": sku, "quantity": quantity, "auth_token": token})
        yield self._say("All items are reserved.", "submit", {"status": "reserved"})


def _result(observation: str) -> dict | None:
    try:
        obs = json.loads(observation)
    except (json.JSONDecodeError, TypeError):
        return None
    if isinstance(obs, dict) and obs.get("ok") is True and isinstance(obs.get("result"), dict):
        return obs["result"]
    return None
