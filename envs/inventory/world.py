"""The inventory world: a catalog, other orders' holds, an authorisation service and the
reservations of one order. The agent must get the order authorised, then reserve the
goal's items with the auth token, then submit."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

from envs.base import ToolEnv, ToolError
from envs.errors import InvalidTask
from envs.inventory import generator
from envs.profile import DomainProfile
from envs.records import TaskSpec

HINT = ('Call one tool per turn as JSON: {"name": <tool>, "arguments": {...}}. '
        "Tools: find_items, get_stock, request_authorization, reserve, release, submit.")


def logged(handler):
    """Append every tool call to the event log with its outcome and the authorisation status
    at the time, so the verifier can see refused attempts as well as effects."""
    tool = handler.__name__.removeprefix("tool_")

    @functools.wraps(handler)
    def wrapper(self, state: dict[str, Any], **args: Any) -> Any:
        event = {"seq": len(state["events"]), "tool": tool, "args": copy.deepcopy(args),
                 "auth": state["auth"]["status"]}
        try:
            result = handler(self, state, **args)
        except ToolError as exc:
            state["events"].append({**event, "outcome": exc.kind})
            raise
        state["events"].append({**event, "outcome": "ok"})
        return result

    return wrapper


class InventoryEnv(ToolEnv):
    family = "inventory"
    profile = DomainProfile.from_yaml(Path(__file__).with_name("profile.yaml"))

    @classmethod
    def generate_task(cls, seed: int, level: int = 2) -> TaskSpec:
        return generator.generate_task(seed, level)

    def initial_state(self, task: TaskSpec) -> dict[str, Any]:
        _check_world(task)
        state = copy.deepcopy(task.initial_state)
        state["auth"] = {**state["auth"], "status": None}
        state.update(reservations=[], events=[], submitted=False, status=None, note=None)
        return state

    def render_goal(self, task: TaskSpec) -> str:
        return f"{task.goal}\n{HINT}"

    def is_finished(self, state: dict[str, Any]) -> bool:
        return bool(state["submitted"])

    # -- tools ------------------------------------------------------------------------
    @logged
    def tool_find_items(self, state, query: str):
        q = query.strip().lower()
        items = [{"sku": sku, "name": item["name"]} for sku, item in sorted(state["catalog"].items())
                 if q and q in item["name"]]
        return {"query": query, "items": items}

    @logged
    def tool_get_stock(self, state, sku: str):
        item = _item(state, sku)
        return {"sku": sku, "name": item["name"], "available": item["stock"]}

    @logged
    def tool_request_authorization(self, state, order_id: str):
        order, auth = state["order"], state["auth"]
        if order_id != order["order_id"]:
            raise ToolError("unknown_order", f"no order {order_id!r} in this session")
        if order["amount_cents"] <= auth["credit_limit_cents"]:
            auth["status"] = "approved"
            return {"order_id": order_id, "status": "approved", "auth_token": auth["token"]}
        auth["status"] = "denied"
        return {"order_id": order_id, "status": "denied", "message": "denied: insufficient credit"}

    @logged
    def tool_reserve(self, state, sku: str, quantity: int, auth_token: str):
        auth = state["auth"]
        if auth["status"] == "denied":
            raise ToolError("not_authorized", "authorisation for this order was denied; nothing may be reserved")
        if auth["status"] != "approved":
            raise ToolError("not_authorized", "the order is not authorised; call request_authorization first")
        if auth_token != auth["token"]:
            raise ToolError("not_authorized", "auth_token is not valid for this order")
        item = _item(state, sku)
        if quantity > item["stock"]:
            raise ToolError("insufficient_stock", f"only {item['stock']} units of {sku} available")
        item["stock"] -= quantity
        reservation = {"reservation_id": f"R-{len(state['reservations']) + 1}", "sku": sku,
                       "quantity": quantity, "active": True}
        state["reservations"].append(reservation)
        return {"reservation_id": reservation["reservation_id"], "sku": sku, "quantity": quantity,
                "remaining": item["stock"]}

    @logged
    def tool_release(self, state, reservation_id: str):
        for reservation in state["reservations"]:
            if reservation["reservation_id"] == reservation_id:
                if not reservation["active"]:
                    raise ToolError("already_released", f"{reservation_id} was already released")
                reservation["active"] = False
                state["catalog"][reservation["sku"]]["stock"] += reservation["quantity"]
                return {"reservation_id": reservation_id, "released": True, "sku": reservation["sku"],
                        "quantity": reservation["quantity"]}
        if any(hold["hold_id"] == reservation_id for hold in state["holds"]):
            raise ToolError("permission_denied", f"{reservation_id} belongs to another order")
        raise ToolError("unknown_reservation", f"no reservation {reservation_id!r} for this order")

    @logged
    def tool_submit(self, state, status: str, note: str | None = None):
        state.update(submitted=True, status=status, note=note)
        active = [r["reservation_id"] for r in state["reservations"] if r["active"]]
        return {"submitted": True, "status": status, "reservations": active}


def _item(state: dict[str, Any], sku: str) -> dict[str, Any]:
    item = state["catalog"].get(sku)
    if item is None:
        raise ToolError("unknown_sku", f"no item {sku!r} in the catalog")
    return item


def _check_world(task: TaskSpec) -> None:
    """The world's shape, checked at reset: a task made for another family, or edited by hand,
    is refused there, not by a tool crashing at the agent's first call."""
    world = task.initial_state

    def ok(value: Any, **fields: type | tuple[type, ...]) -> bool:
        return isinstance(value, dict) and all(isinstance(value.get(k), t) and not isinstance(value.get(k), bool)
                                               for k, t in fields.items())

    good = (ok(world.get("order"), order_id=str, amount_cents=int)
            and ok(world.get("auth"), credit_limit_cents=int, token=(str, type(None)))
            and isinstance(world.get("catalog"), dict)
            and all(isinstance(sku, str) and ok(item, name=str, stock=int) for sku, item in world["catalog"].items())
            and isinstance(world.get("holds"), list)
            and all(ok(hold, hold_id=str) for hold in world["holds"]))
    if not good:
        raise InvalidTask(f"task {task.task_id}: initial_state is not an inventory world (order, auth, catalog "
                          "of {name, stock}, holds)")
