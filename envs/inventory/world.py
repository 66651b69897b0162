"""The inventory world: a catalog, other orders' holds, an authorisation service and the
reservations of one order. The agent must get the order authorised, then reserve the
goal's items with the auth token, then submit."""

from __future__ import annotations

import pickle
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from gymfoundry.envs.base import ToolEnv, ToolError, copy_state
from gymfoundry.envs.errors import InvalidTask
from gymfoundry.envs.records import TaskSpec, ToolCategory
from gymfoundry.envs.tools import tool


class Refusal(str, Enum):
    """The inventory tools' refusal kinds (a step's `error`; the verifier reads them in the log)."""

    unknown_order = "unknown_order"
    unknown_sku = "unknown_sku"
    unknown_reservation = "unknown_reservation"
    not_authorized = "not_authorized"
    insufficient_stock = "insufficient_stock"
    already_released = "already_released"
    # a release of another order's hold: the tool's own refusal, not the runtime's permission_denied
    held_by_another_order = "held_by_another_order"


Id = Annotated[str, Field(min_length=1, max_length=32)]


class InventoryEnv(ToolEnv):
    family = "inventory"
    profile_yaml = Path(__file__).with_name("profile.yaml")
    replayable = True  # the tools read the state and their arguments only
    plain_results = True  # the tools return fresh dicts of str, int, bool and lists of them

    def initial_state(self, task: TaskSpec) -> dict[str, Any]:
        """The world's checked snapshot with the order's session fields, a fresh copy each call.
        Both depend on the snapshot's content only: made once per content (its exact pickle, which
        tells every type and key order apart) and copied from there (an episode, its verifier's
        check and each sample of the task start from the same snapshot)."""
        made, state = _initial(task)
        return pickle.loads(made) if state is None else state

    @staticmethod
    def initial_pickle(task: TaskSpec) -> bytes | None:
        """The pickle `initial_state(task)` is loaded from (each load a fresh copy of the initial
        state: a verifier that needs several copies loads them from it instead of pickling one),
        or None where the snapshot is not plain data (nothing is remembered)."""
        return _initial(task)[0]

    def is_finished(self, state: dict[str, Any]) -> bool:
        return bool(state["submitted"])

    def event_fields(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"auth": state["auth"]["status"]}  # refused reserves are judged by it

    # -- tools ------------------------------------------------------------------------
    @tool(ToolCategory.read)
    def tool_find_items(self, state, query: Annotated[str, Field(min_length=1, max_length=100,
                                                                  description="part of an item name")]):
        """Search the catalog by a case-insensitive substring of the item name. Returns sku and name of each match."""
        q = query.strip().lower()
        items = [{"sku": sku, "name": item["name"]} for sku, item in sorted(state["catalog"].items())
                 if q and q in item["name"]]
        return {"query": query, "items": items}

    @tool(ToolCategory.read)
    def tool_get_stock(self, state, sku: Annotated[Id, Field(description="item sku, e.g. SKU-123")]):
        """Units of an item currently available for reservation."""
        item = _item(state, sku)
        return {"sku": sku, "name": item["name"], "available": item["stock"]}

    @tool(ToolCategory.write)
    def tool_request_authorization(self, state, order_id: Id):
        """Ask the authorisation service to approve an order. Approval returns an auth token needed by reserve."""
        order, auth = state["order"], state["auth"]
        if order_id != order["order_id"]:
            raise ToolError(Refusal.unknown_order, f"no order {order_id!r} in this session")
        if order["amount_cents"] <= auth["credit_limit_cents"]:
            auth["status"] = "approved"
            return {"order_id": order_id, "status": "approved", "auth_token": auth["token"]}
        auth["status"] = "denied"
        return {"order_id": order_id, "status": "denied", "message": "denied: insufficient credit"}

    @tool(ToolCategory.write)
    def tool_reserve(self, state, sku: Id, quantity: Annotated[int, Field(ge=1, le=1000)],
                     auth_token: Annotated[str, Field(max_length=64)]):
        """Reserve units of an item for the authorised order. Returns a reservation id."""
        auth = state["auth"]
        if auth["status"] == "denied":
            raise ToolError(Refusal.not_authorized, "authorisation for this order was denied; nothing may be reserved")
        if auth["status"] != "approved":
            raise ToolError(Refusal.not_authorized, "the order is not authorised; call request_authorization first")
        if auth_token != auth["token"]:
            raise ToolError(Refusal.not_authorized, "auth_token is not valid for this order")
        item = _item(state, sku)
        if quantity > item["stock"]:
            raise ToolError(Refusal.insufficient_stock, f"only {item['stock']} units of {sku} available")
        item["stock"] -= quantity
        reservation = {"reservation_id": f"R-{len(state['reservations']) + 1}", "sku": sku,
                       "quantity": quantity, "active": True}
        state["reservations"].append(reservation)
        return {"reservation_id": reservation["reservation_id"], "sku": sku, "quantity": quantity,
                "remaining": item["stock"]}

    @tool(ToolCategory.write)
    def tool_release(self, state, reservation_id: Id):
        """Release one of this order's reservations, returning its units to stock."""
        for reservation in state["reservations"]:
            if reservation["reservation_id"] == reservation_id:
                if not reservation["active"]:
                    raise ToolError(Refusal.already_released, f"{reservation_id} was already released")
                reservation["active"] = False
                state["catalog"][reservation["sku"]]["stock"] += reservation["quantity"]
                return {"reservation_id": reservation_id, "released": True, "sku": reservation["sku"],
                        "quantity": reservation["quantity"]}
        if any(hold["hold_id"] == reservation_id for hold in state["holds"]):
            raise ToolError(Refusal.held_by_another_order, f"{reservation_id} belongs to another order")
        raise ToolError(Refusal.unknown_reservation, f"no reservation {reservation_id!r} for this order")

    @tool(ToolCategory.irreversible)
    def tool_submit(self, state, status: Literal["reserved", "denied"],
                    note: Annotated[str, Field(max_length=500)] | None = None):
        """Finish the task with the final status. Irreversible; ends the episode."""
        state.update(submitted=True, status=status, note=note)
        active = [r["reservation_id"] for r in state["reservations"] if r["active"]]
        return {"submitted": True, "status": status, "reservations": active}


# The pickle of a checked snapshot (`task.initial_state`) -> the pickle of the initial state made of it.
_INITIALS: dict[bytes, bytes] = {}
_INITIALS_MAX = 4096


def _key(task: TaskSpec) -> bytes | None:
    try:
        return pickle.dumps(task.initial_state, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # not plain data: checked (and refused) by `_initial`, never remembered
        return None


def _initial(task: TaskSpec) -> tuple[bytes | None, dict[str, Any] | None]:
    """(the remembered pickle of the task's initial state, None), or on a first sight (its pickle
    or None if it is not remembered, the state just made)."""
    key = _key(task)
    made = _INITIALS.get(key) if key is not None else None
    if made is not None:
        return made, None
    _check_world(task)
    state = copy_state(task.initial_state)  # JSON data: a pickle round trip copies it in C
    state["auth"] = {**state["auth"], "status": None}
    state.update(reservations=[], events=[], submitted=False, status=None, note=None)
    if key is None:
        return None, state
    if len(_INITIALS) >= _INITIALS_MAX:
        _INITIALS.clear()
    made = _INITIALS[key] = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    return made, state


def _item(state: dict[str, Any], sku: str) -> dict[str, Any]:
    item = state["catalog"].get(sku)
    if item is None:
        raise ToolError(Refusal.unknown_sku, f"no item {sku!r} in the catalog")
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
