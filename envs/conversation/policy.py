"""Scripted, observation-only agent of the conversation family.

It reads the goal (the policy document and the customer's first message) and what the tools and
the customer say, nothing else. It verifies the customer's identity (asking for what the opening
leaves out), reads their orders, settles each request as the policy allows, tells the customer
the outcome in one message and ends the conversation (or transfers an out-of-scope request).
With probability `mistake_rate` per opportunity it makes a realistic mistake: it acts before
verifying identity (asks for the order number and reads the order), accepts a forbidden request
(cancels an order that is not pending, returns late, refunds to the payment method the customer
asked for), repeats a question, leaves the refund amounts out of its message, or ends the
conversation instead of transferring it."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Generator
from typing import Any

from gymfoundry.envs.scripted import ScriptedPolicy, tool_result

OPENING = re.compile(r'Their first message:\n"(.*)"\s*$', re.MULTILINE)
TODAY = re.compile(r"today is (\d{4}-\d{2}-\d{2})")
WINDOW = re.compile(r"within (\d+) days")
EMAIL = re.compile(r"([a-z0-9._-]+@[a-z0-9.-]+\.[a-z]{2,})")
NAME = re.compile(r"This is ([A-Z][a-z]+ [A-Z][a-z]+)\.")
ZIP = re.compile(r"\b(\d{5})\b")
ORDER_ID = re.compile(r"(#W\d+)")
NEW_ADDRESS = re.compile(r"new address is ([^.]+)\.")
REQUESTS = [
    ("cancel", re.compile(r'cancel the order with the "([^"]+)"')),
    ("return", re.compile(r'return the "([^"]+)" I received(?:, with the refund on my (credit card|gift card|PayPal '
                          r'account))?')),
    ("exchange", re.compile(r'exchange the "([^"]+)" for (?:a "([^"]+)"|the (\w+) "([^"]+)" one)')),
    ("address", re.compile(r'change the shipping address of the order with the "([^"]+)"')),
    ("out_of_scope", re.compile(r"(dispute a charge[^,.]*|change the email address on my account|close my account)")),
]
KINDS = {"credit card": "credit_card", "gift card": "gift_card", "PayPal account": "paypal"}


class ScriptedConversationPolicy(ScriptedPolicy):
    policy_id = "scripted-conversation"
    script_version = "1"
    max_turns = 60

    def __init__(self, mistake_rate: float = 0.15, seed: int = 0):
        super().__init__(mistake_rate=mistake_rate, seed=seed)

    def _final_call(self, reason: str) -> str:
        return self._say(f"Ending ({reason}).", "end_conversation", {"message": "Thank you for contacting us. Goodbye!"})

    def _run(self, goal: str) -> Generator[str, str, None]:
        opening = OPENING.search(goal)
        today, window = TODAY.search(goal), WINDOW.search(goal)
        if not (opening and today and window):
            yield self._say("I cannot read the goal.", "transfer_to_human", {"summary": "unreadable case"})
            return
        text = opening.group(1)
        requests = _requests(text)
        self.today, self.window = dt.date.fromisoformat(today.group(1)), int(window.group(1))

        if any(r["kind"] != "out_of_scope" for r in requests) and self._mistake():
            # acts before verifying: asks for the order number and reads the order straight away
            obs = yield self._say("Ask for the order number first.", "respond",
                                  {"message": "What is your order number?"})
            number = ORDER_ID.search(_customer_says(obs))
            if number:
                yield self._say(f"Look up {number.group(1)}.", "get_order", {"order_id": number.group(1)})

        customer = yield from self._identify(text)
        if customer is None:
            yield self._say("I could not find the account.", "end_conversation",
                            {"message": "I'm sorry, I could not find your account, so I cannot help with this."})
            return
        orders = {}
        for oid in customer.get("order_ids", []):
            order = tool_result((yield self._say(f"Read order {oid}.", "get_order", {"order_id": oid})))
            if order:
                orders[oid] = order
        by_product = {item["name"]: order for order in orders.values() for item in order["items"]}
        lines, transfer = [], None
        for r in requests:
            if r["kind"] == "out_of_scope":
                transfer = r["what"]
                lines.append("Your other request is out of my scope, so I cannot handle it; I will transfer you "
                             "to a human agent.")
                continue
            order = by_product.get(r["product"])
            if order is None:
                lines.append(f"I cannot find an order with the \"{r['product']}\".")
                continue
            line = yield from self._settle(r, order, customer)
            lines.append(line)
        obs = yield self._say("Tell the customer the outcome.", "respond",
                              {"message": " ".join(lines) + " Is there anything else I can do?"})
        if (tool_result(obs) or {}).get("customer_left"):
            return
        if transfer and not self._mistake():
            yield self._say("Transfer the out-of-scope request.", "transfer_to_human", {
                "summary": f"Customer {customer['customer_id']} wants to {transfer}; everything else is settled."})
        else:
            yield self._say("Everything is settled.", "end_conversation",
                            {"message": "Thank you for contacting us. Goodbye!"})

    # -- identity ----------------------------------------------------------------------
    def _identify(self, text: str) -> Generator[str, str, dict | None]:
        email, name = EMAIL.search(text), NAME.search(text)
        if email:
            args = {"email": email.group(1)}
        elif name:
            zip_code = yield from self._ask("zip code", "Could you tell me your zip code, please?", ZIP)
            if zip_code is None:
                return None
            args = {"name": name.group(1), "zip": zip_code}
        else:
            found = yield from self._ask("email", "Could you tell me the email on your account, please?", EMAIL)
            if found is None:
                return None
            args = {"email": found}
        return tool_result((yield self._say("Verify the customer.", "find_customer", args)))

    def _ask(self, what: str, question: str, pattern: re.Pattern) -> Generator[str, str, str | None]:
        for _ in range(3):
            obs = yield self._say(f"I need their {what}.", "respond", {"message": question})
            if self._mistake():  # asks the same again
                obs = yield self._say(f"Ask the {what} again.", "respond", {"message": question})
            found = pattern.search(_customer_says(obs))
            if found:
                return found.group(1)
            if (tool_result(obs) or {}).get("customer_left") or tool_result(obs) is None:
                return None
        return None

    # -- one request -------------------------------------------------------------------
    def _settle(self, r: dict[str, Any], order: dict, customer: dict) -> Generator[str, str, str]:
        oid, p = order["order_id"], f"\"{r['product']}\""
        item = next(i for i in order["items"] if i["name"] == r["product"])
        if r["kind"] == "cancel":
            if order["status"] != "pending" and not self._mistake():
                return f"I cannot cancel the order with the {p} ({oid}): it is {order['status']}."
            done = tool_result((yield self._say(f"Cancel {oid}.", "cancel_order",
                                                {"order_id": oid, "reason": "no longer needed"})))
            if not done:
                return f"I cannot cancel the order with the {p} ({oid}): it is {order['status']}."
            return self._refund_line(f"I cancelled order {oid} with the {p}", done["refund"])
        if r["kind"] == "return":
            days = (self.today - dt.date.fromisoformat(order["delivered_on"])).days if order["delivered_on"] else None
            if (order["status"] != "delivered" or days is None or days > self.window) and not self._mistake():
                return f"I cannot return the {p} ({oid}): it was delivered more than {self.window} days ago."
            method = order["payment_method_id"]
            if r["refund_to"] and self._mistake():  # does what the customer asks, not what the policy says
                method = next((m["payment_method_id"] for m in customer["payment_methods"]
                               if m["kind"] == KINDS[r["refund_to"]]), method)
            done = tool_result((yield self._say(f"Return {item['item_id']}.", "return_items", {
                "order_id": oid, "item_ids": [item["item_id"]], "payment_method_id": method})))
            if not done:
                return f"I cannot return the {p} ({oid})."
            return self._refund_line(f"I returned the {p} of order {oid}", done["refund"])
        if r["kind"] == "exchange":
            if r["other"]:
                return (f"I cannot exchange the {p} ({oid}): an exchange must be for a variant of the same "
                        "product.")
            product = tool_result((yield self._say("Find the variant.", "get_product",
                                                   {"product_id": item["product_id"]}))) or {}
            variant = next((v for v in product.get("variants", []) if v["options"].get(r["option"]) == r["value"]), None)
            if variant is None:
                return f"I cannot exchange the {p} ({oid}): that variant does not exist."
            done = tool_result((yield self._say("Exchange it.", "exchange_items", {
                "order_id": oid, "item_id": item["item_id"], "new_variant_id": variant["variant_id"]})))
            return (f"I exchanged the {p} of order {oid}; the new one ships at no cost." if done
                    else f"I cannot exchange the {p} ({oid}).")
        obs = yield self._say("Ask for the new address.", "respond",
                              {"message": "What is the new shipping address for that order?"})
        found = NEW_ADDRESS.search(_customer_says(obs))
        if not found:
            return f"I cannot change the address of order {oid} without the new address."
        done = tool_result((yield self._say("Change the address.", "modify_address",
                                            {"order_id": oid, "address": found.group(1)})))
        return (f"I changed the shipping address of order {oid} to {found.group(1)}." if done
                else f"I cannot change the shipping address of order {oid}: it has shipped.")

    def _refund_line(self, head: str, amount: str) -> str:
        if self._mistake():  # leaves the amount out
            return f"{head}; the refund goes to the original payment method."
        return f"{head}: a refund of {amount} goes to the original payment method."


def _requests(text: str) -> list[dict[str, Any]]:
    found = []
    for kind, pattern in REQUESTS:
        for m in pattern.finditer(text):
            r: dict[str, Any] = {"kind": kind, "at": m.start(), "product": m.group(1)}
            if kind == "return":
                r["refund_to"] = m.group(2)
            elif kind == "exchange":
                r.update(other=m.group(2), option=m.group(3), value=m.group(4))
            elif kind == "out_of_scope":
                r.update(product=None, what=m.group(1))
            found.append(r)
    return sorted(found, key=lambda r: r["at"])


def _customer_says(observation: str) -> str:
    return (tool_result(observation) or {}).get("customer", "")
