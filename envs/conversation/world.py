"""The conversation world: an order-support database (customers with payment methods, orders
with statuses, dates and items, products with variants), a written policy shown in the goal, and
a simulated customer (envs/person.py) who answers the agent's `respond`.

The tools do what the database allows (an order that has shipped cannot be cancelled); the
policy asks for more (only pending orders, returns within the window, refunds to the original
payment method, identity first), and the verifier judges that from the event log, where each
account action records the facts the policy turns on (and each refund its amount and payment
method: what the agent tells the customer is checked against them). Account actions before
`find_customer` succeeded are refused (and logged: the verifier counts the attempt). The episode
ends when the agent calls `end_conversation` (the request is settled: the customer says goodbye)
or `transfer_to_human`, or when the customer runs out of patience."""

from __future__ import annotations

import copy
import datetime as dt
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from gymfoundry.envs.base import ToolEnv, ToolError
from gymfoundry.envs.conversation.facts import ConversationFacts
from gymfoundry.envs.errors import InvalidTask
from gymfoundry.envs.person import Simulator, make_simulator, new_memory
from gymfoundry.envs.records import TaskSpec, ToolCategory
from gymfoundry.envs.tools import tool

POLICY_DOC = Path(__file__).with_name("policy.md")
# The tools that touch an account: refused until the customer's identity is verified.
ACCOUNT_TOOLS = ("get_order", "cancel_order", "return_items", "exchange_items", "modify_address")


class Refusal(str, Enum):
    """The conversation tools' refusal kinds (a step's `error`; the verifier reads them in the log)."""

    identity_not_verified = "identity_not_verified"
    customer_not_found = "customer_not_found"
    incomplete_lookup = "incomplete_lookup"
    unknown_order = "unknown_order"
    unknown_product = "unknown_product"
    unknown_item = "unknown_item"
    unknown_variant = "unknown_variant"
    unknown_payment_method = "unknown_payment_method"
    invalid_status = "invalid_status"


Id = Annotated[str, Field(min_length=1, max_length=32)]
Message = Annotated[str, Field(min_length=1, max_length=2000)]


def money(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


def policy_text(today: str, return_days: int) -> str:
    return POLICY_DOC.read_text(encoding="utf-8").replace("{today}", today).replace("{return_days}",
                                                                                    str(return_days)).strip()


class ConversationEnv(ToolEnv):
    family = "conversation"
    profile_yaml = Path(__file__).with_name("profile.yaml")

    def __init__(self, outcome_fn=None, level: int = 2, simulator: Simulator | str | None = None, **options: Any):
        super().__init__(outcome_fn=outcome_fn, level=level)
        # The simulated person: scripted unless configured (GYMFOUNDRY_USER_SIMULATOR=llm, or
        # simulator="llm" with base_url/model); a verifier's replays pass simulator="scripted".
        self.simulator = simulator if isinstance(simulator, Simulator) else make_simulator(backend=simulator, **options)
        self.persona = None

    def initial_state(self, task: TaskSpec) -> dict[str, Any]:
        _check_world(task)
        try:
            self.persona = ConversationFacts.model_validate(task.hidden.checks).persona
        except ValidationError as exc:
            raise InvalidTask(f"task {task.task_id}: hidden.checks are not ConversationFacts: {exc}") from None
        state = copy.deepcopy(task.initial_state)
        state.update(verified=None, ended=None, person=new_memory(), transcript=[], events=[])
        return state

    def is_finished(self, state: dict[str, Any]) -> bool:
        return state["ended"] is not None

    def event_fields(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"verified": state["verified"]}  # account actions before verification are judged by it

    def close(self) -> None:
        release = getattr(self.simulator, "release", None)
        if callable(release):
            release()

    # -- the customer -----------------------------------------------------------------
    @tool(ToolCategory.write, hint="a message to the customer; their reply is the observation")
    def tool_respond(self, state, message: Message):
        """Send a message to the customer. Returns the customer's reply."""
        reply = self.simulator.reply(self.persona, state["person"], message)
        state["transcript"] += [{"from": "agent", "text": message}, {"from": "customer", "text": reply.text}]
        if reply.ended:
            state["ended"] = reply.reason or "customer_left"
        return {"customer": reply.text, **({"customer_left": True} if reply.ended else {})}

    @tool(ToolCategory.irreversible)
    def tool_end_conversation(self, state, message: Message):
        """Send a last message to the customer (the outcome of their requests) and end the conversation. Ends the episode."""
        farewell = Simulator.close(self.persona, state["person"], "resolved")
        state["transcript"] += [{"from": "agent", "text": message}, {"from": "customer", "text": farewell.text}]
        state["ended"] = "resolved"
        return {"customer": farewell.text, "ended": True}

    @tool(ToolCategory.irreversible)
    def tool_transfer_to_human(self, state, summary: Annotated[str, Field(min_length=1, max_length=2000)]):
        """Transfer the customer to a human agent with a summary of the case (for requests out of scope). Ends the episode."""
        Simulator.close(self.persona, state["person"], "transferred")
        state["ended"] = "transferred"
        return {"transferred": True}

    # -- the database -----------------------------------------------------------------
    @tool(ToolCategory.read)
    def tool_find_customer(self, state, email: Annotated[str, Field(max_length=100)] | None = None,
                           name: Annotated[str, Field(max_length=100, description="full name")] | None = None,
                           zip: Annotated[str, Field(max_length=10)] | None = None):
        """Find the customer by email, or by full name and zip code; this verifies their identity."""
        if email:
            found = [c for c in state["customers"].values() if c["email"].lower() == email.strip().lower()]
        elif name and zip:
            found = [c for c in state["customers"].values()
                     if c["name"].lower() == " ".join(name.split()).lower() and c["zip"] == zip.strip()]
        else:
            raise ToolError(Refusal.incomplete_lookup, "give an email, or a full name and a zip code")
        if not found:
            raise ToolError(Refusal.customer_not_found, "no customer matches")
        customer = found[0]
        state["verified"] = customer["customer_id"]
        return {k: copy.deepcopy(customer[k]) for k in ("customer_id", "name", "email", "zip", "payment_methods",
                                                        "order_ids")}

    @tool(ToolCategory.read)
    def tool_get_order(self, state, order_id: Id):
        """Details of one of the verified customer's orders: status, dates, items, total, payment method, address."""
        return _render_order(state, _order(state, order_id))

    @tool(ToolCategory.read)
    def tool_get_product(self, state, product_id: Id):
        """A product and its variants (options such as colour or size, price, availability)."""
        product = state["products"].get(product_id)
        if product is None:
            raise ToolError(Refusal.unknown_product, f"no product {product_id!r}")
        variants = [{"variant_id": vid, "options": v["options"], "price": money(v["price_cents"]),
                     "available": v["available"]} for vid, v in sorted(product["variants"].items())]
        return {"product_id": product_id, "name": product["name"], "type": product["type"], "variants": variants}

    @tool(ToolCategory.write)
    def tool_cancel_order(self, state, event, order_id: Id, reason: Literal["no longer needed", "ordered by mistake"]):
        """Cancel an order that has not shipped; its total is refunded to its original payment method."""
        order = _order(state, order_id)
        event["status_before"] = order["status"]
        if order["status"] not in ("pending", "processing"):
            raise ToolError(Refusal.invalid_status, f"order {order_id} is {order['status']}; it cannot be cancelled")
        order["status"] = "cancelled"
        refund = {"amount_cents": order["total_cents"], "payment_method_id": order["payment_method_id"],
                  "reason": reason}
        order["refunds"].append(refund)
        event.update(refund_cents=refund["amount_cents"], refund_to=refund["payment_method_id"])
        return {"order_id": order_id, "status": "cancelled", "refund": money(refund["amount_cents"]),
                "payment_method_id": refund["payment_method_id"]}

    @tool(ToolCategory.write)
    def tool_return_items(self, state, event, order_id: Id,
                          item_ids: Annotated[list[Id], Field(min_length=1, max_length=10)], payment_method_id: Id):
        """Return items of a delivered order; their price is refunded to the given payment method."""
        order = _order(state, order_id)
        customer = state["customers"][order["customer_id"]]
        event.update(status_before=order["status"], days_since_delivery=_days_since(state, order),
                     original_payment=payment_method_id == order["payment_method_id"])
        if order["status"] != "delivered":
            raise ToolError(Refusal.invalid_status, f"order {order_id} is {order['status']}, not delivered")
        items = [_item(order, item_id) for item_id in dict.fromkeys(item_ids)]
        if any(item["status"] != "delivered" for item in items):
            raise ToolError(Refusal.invalid_status, "an item was already returned or exchanged")
        if payment_method_id not in {p["payment_method_id"] for p in customer["payment_methods"]}:
            raise ToolError(Refusal.unknown_payment_method, f"no payment method {payment_method_id!r} for this customer")
        for item in items:
            item["status"] = "returned"
        amount = sum(item["price_cents"] for item in items)
        order["refunds"].append({"amount_cents": amount, "payment_method_id": payment_method_id, "reason": "return"})
        event.update(refund_cents=amount, refund_to=payment_method_id)
        return {"order_id": order_id, "returned": [i["item_id"] for i in items], "refund": money(amount),
                "payment_method_id": payment_method_id}

    @tool(ToolCategory.write)
    def tool_exchange_items(self, state, event, order_id: Id, item_id: Id, new_variant_id: Id):
        """Exchange a delivered item for another product variant (shipped at no cost)."""
        order = _order(state, order_id)
        item = _item(order, item_id)
        product_id = next((pid for pid, p in sorted(state["products"].items()) if new_variant_id in p["variants"]),
                          None)
        event.update(status_before=order["status"], same_product=product_id == item["product_id"])
        if product_id is None:
            raise ToolError(Refusal.unknown_variant, f"no variant {new_variant_id!r}")
        if order["status"] != "delivered" or item["status"] != "delivered":
            raise ToolError(Refusal.invalid_status, f"item {item_id} of order {order_id} cannot be exchanged now")
        if new_variant_id == item["variant_id"] or not state["products"][product_id]["variants"][new_variant_id][
                "available"]:
            raise ToolError(Refusal.unknown_variant, f"variant {new_variant_id} is the same one or not available")
        item.update(status="exchanged", exchanged_to={"product_id": product_id, "variant_id": new_variant_id})
        return {"order_id": order_id, "item_id": item_id, "new_variant_id": new_variant_id, "status": "exchanged"}

    @tool(ToolCategory.write)
    def tool_modify_address(self, state, event, order_id: Id,
                            address: Annotated[str, Field(min_length=5, max_length=200)]):
        """Change the shipping address of an order that has not shipped."""
        order = _order(state, order_id)
        event["status_before"] = order["status"]
        if order["status"] not in ("pending", "processing"):
            raise ToolError(Refusal.invalid_status, f"order {order_id} is {order['status']}; its address is final")
        order["address"] = " ".join(address.split())
        return {"order_id": order_id, "address": order["address"]}


def _order(state: dict[str, Any], order_id: str) -> dict[str, Any]:
    if state["verified"] is None:
        raise ToolError(Refusal.identity_not_verified, "verify the customer's identity first (find_customer)")
    order = state["orders"].get(order_id)
    if order is None or order["customer_id"] != state["verified"]:
        raise ToolError(Refusal.unknown_order, f"no order {order_id!r} for this customer")
    return order


def _item(order: dict[str, Any], item_id: str) -> dict[str, Any]:
    for item in order["items"]:
        if item["item_id"] == item_id:
            return item
    raise ToolError(Refusal.unknown_item, f"no item {item_id!r} in order {order['order_id']}")


def _days_since(state: dict[str, Any], order: dict[str, Any]) -> int | None:
    if not order.get("delivered_on"):
        return None
    return (dt.date.fromisoformat(state["today"]) - dt.date.fromisoformat(order["delivered_on"])).days


def _render_order(state: dict[str, Any], order: dict[str, Any]) -> dict[str, Any]:
    items = []
    for item in order["items"]:
        product = state["products"][item["product_id"]]
        items.append({"item_id": item["item_id"], "product_id": item["product_id"], "name": product["name"],
                      "variant_id": item["variant_id"], "options": product["variants"][item["variant_id"]]["options"],
                      "price": money(item["price_cents"]), "status": item["status"]})
    refunds = [{"amount": money(r["amount_cents"]), "payment_method_id": r["payment_method_id"]}
               for r in order["refunds"]]
    return {"order_id": order["order_id"], "status": order["status"], "placed_on": order["placed_on"],
            "delivered_on": order["delivered_on"], "items": items, "total": money(order["total_cents"]),
            "payment_method_id": order["payment_method_id"], "address": order["address"], "refunds": refunds}


def _check_world(task: TaskSpec) -> None:
    """The world's shape, checked at reset: a task for another family or edited by hand is refused
    there, not by a tool crashing at the agent's first call."""
    world = task.initial_state
    try:
        dt.date.fromisoformat(world["today"])
        assert isinstance(world["return_days"], int)
        for cid, c in world["customers"].items():
            assert c["customer_id"] == cid and isinstance(c["email"], str) and isinstance(c["order_ids"], list)
        for oid, o in world["orders"].items():
            assert o["order_id"] == oid and o["customer_id"] in world["customers"]
            assert all(i["product_id"] in world["products"] and
                       i["variant_id"] in world["products"][i["product_id"]]["variants"] for i in o["items"])
        assert all(isinstance(p["variants"], dict) for p in world["products"].values())
    except (KeyError, TypeError, ValueError, AssertionError, AttributeError) as exc:
        raise InvalidTask(f"task {task.task_id}: initial_state is not a conversation world (today, return_days, "
                          f"customers, orders, products): {type(exc).__name__} {exc}") from None
