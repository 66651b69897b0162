"""The browser world: an in-process shop (search with filters, sorting and pagination, product
pages with options, cart and checkout, an account with orders, addresses and contact details)
shown to the agent as a text accessibility tree with element ids.

The site data (catalog, listing order, account, past orders) lives once in the task's
`initial_state["site"]` and is never copied into the state; the state holds only what the
agent changes: the url, history, scroll position, what was typed or selected on the current page,
the cart, the orders placed, the account's contact details and addresses, the pages visited, the
searches and product lines a results page showed, and how the episode ended (`answer` or
`report_infeasible`). Pages are rendered from both on demand
(envs/browser/site.py).

Bad input never raises out of a tool: an element id that is not on the current page, typing into
something that is not a text box, an option a select does not offer, and `back` with no history
are refusals (ToolError); an unknown url is the site's 404 page and another host a "can't be
reached" page, as a real browser shows them. The browser scrolls an element into view before it
acts on it (as Playwright does), so an element of the current page below the fold can be used."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import Field

from gymfoundry.envs.base import ToolEnv, ToolError
from gymfoundry.envs.errors import ErrorKind, InvalidTask
from gymfoundry.envs.records import TaskSpec, ToolCategory
from gymfoundry.envs.tools import tool

from .site import FILTERS, HOST, MAX_QUANTITY, PRODUCT_LINK, RESULTS_TITLE, SORTS, VIEW_LINES, Page, Site

MAX_HISTORY = 50
LINK_LINE = re.compile(r"\s*\[(\d+)\] link ")


class Refusal(str, Enum):
    no_history = "no_history"  # `back` on the first page


# An element id that is not on the current page (stale or made up), typing into something that is
# not a text box, selecting on something that is not a select, an option the select does not
# offer: the call's arguments do not fit the page, so the PRM's valid_call counts them as invalid.
NOT_ON_PAGE = ErrorKind.invalid_arguments


ElementId = Annotated[int, Field(ge=0, le=1_000_000, description="an element id shown in brackets, e.g. 12 for [12]")]
Text = Annotated[str, Field(max_length=200)]
Reason = Annotated[str, Field(min_length=1, max_length=1000)]


class BrowserEnv(ToolEnv):
    family = "browser"
    profile_yaml = Path(__file__).with_name("profile.yaml")

    def __init__(self, outcome_fn=None, level: int = 2):
        super().__init__(outcome_fn=outcome_fn, level=level)
        self.site: Site | None = None

    def initial_state(self, task: TaskSpec) -> dict[str, Any]:
        _check_world(task)
        self.site = Site(task.initial_state["site"])
        account = task.initial_state["site"]["account"]  # what the agent can change of it (name and card it cannot)
        account = {"email": account["email"], "phone": account["phone"], "default_address": account["default_address"],
                   "addresses": [dict(a) for a in account["addresses"]]}
        return {"url": "/", "history": [], "scroll": 0, "inputs": {}, "cart": [], "orders": [], "account": account,
                "visited": ["/"], "searched": [], "listed": [], "ending": None, "events": []}

    def render_goal(self, task: TaskSpec) -> str:
        """The goal, the tool hint, and the page the browser opens on."""
        state = {"url": "/", "scroll": 0, "inputs": {}}  # the start page shows nothing of the account
        start = self._shown(state, None)
        return f"{super().render_goal(task)}\nThe browser is open at {start['url']} ({start['title']}):\n{start['page']}"

    def is_finished(self, state: dict[str, Any]) -> bool:
        return state["ending"] is not None

    def event_fields(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"url": state["url"]}

    # -- acting on the page -------------------------------------------------------------
    @tool(ToolCategory.write)
    def tool_click(self, state, id: ElementId):
        """Click an element of the current page (a link or a button) by its id."""
        page = self.site.render(state)
        element = self._element(state, page, id)
        kind, *args = element.action
        if kind == "goto":
            return self._go(state, args[0])
        if kind == "button":
            return self._press(state, args[0], *args[1:])
        return self._shown(state, page, f"[{id}] {element.role} is focused; use type or select on it")

    @tool(ToolCategory.write)
    def tool_type(self, state, id: ElementId, text: Text):
        """Type text into a text box of the current page (replacing what it held)."""
        page = self.site.render(state)
        element = self._element(state, page, id)
        if element.role != "textbox":
            raise ToolError(NOT_ON_PAGE, f"[{id}] is a {element.role} ({element.label!r}), not a text box")
        state["inputs"][element.action[1]] = text
        return self._shown(state)

    @tool(ToolCategory.write)
    def tool_select(self, state, id: ElementId, option: Annotated[str, Field(min_length=1, max_length=100)]):
        """Choose an option of a select box (combobox) of the current page, by the option's text."""
        page = self.site.render(state)
        element = self._element(state, page, id)
        if element.role != "combobox":
            raise ToolError(NOT_ON_PAGE, f"[{id}] is a {element.role} ({element.label!r}), not a select box")
        if option not in element.options:
            raise ToolError(NOT_ON_PAGE, f"[{id}] {element.label!r} has no option {option[:100]!r}; its "
                                                    f"options: {', '.join(element.options)}")
        name = element.action[1]
        if name in FILTERS or name == "sort":  # the results page reloads with the filter applied
            query = dict(parse_qsl(urlsplit(state["url"]).query))
            value = SORTS[option] if name == "sort" else option
            return self._go(state, self.site.search_url(query, **{name: value}))
        if option.startswith("Choose "):
            state["inputs"].pop(name, None)
        else:
            state["inputs"][name] = option
        return self._shown(state)

    # -- moving around ------------------------------------------------------------------
    @tool(ToolCategory.read)
    def tool_goto(self, state, url: Annotated[str, Field(min_length=1, max_length=500)]):
        """Open a url of the shop (a path such as /cart, or https://shop.example/...)."""
        return self._go(state, _normalised(url))

    @tool(ToolCategory.read)
    def tool_back(self, state):
        """Go back to the previous page."""
        if not state["history"]:
            raise ToolError(Refusal.no_history, "there is no previous page to go back to")
        state["url"] = state["history"].pop()
        state["scroll"], state["inputs"] = 0, {}
        return self._shown(state)

    @tool(ToolCategory.read)
    def tool_scroll(self, state, direction: Literal["down", "up"] = "down"):
        """Scroll the current page down (or up) by one screen."""
        page = self.site.render(state)
        if direction == "down":
            if state["scroll"] + VIEW_LINES >= len(page.lines):
                return self._shown(state, page, "already at the bottom of the page")
            state["scroll"] += VIEW_LINES
        elif state["scroll"] == 0:
            return self._shown(state, page, "already at the top of the page")
        else:
            state["scroll"] = max(0, state["scroll"] - VIEW_LINES)
        return self._shown(state, page)

    # -- ending -------------------------------------------------------------------------
    @tool(ToolCategory.irreversible, hint="ends the task")
    def tool_answer(self, state, text: Annotated[str, Field(min_length=1, max_length=500)]):
        """Give your final answer (the value asked for, or a short note that the task is done). Ends the task."""
        state["ending"] = {"tool": "answer", "text": text}
        return {"answered": text}

    @tool(ToolCategory.irreversible, hint="when the task cannot be done on this site")
    def tool_report_infeasible(self, state, reason: Reason):
        """Say that the task cannot be done on this site, and why. Ends the task."""
        state["ending"] = {"tool": "report_infeasible", "text": reason}
        return {"reported": reason}

    # -- the browser's machinery --------------------------------------------------------
    def _element(self, state: dict[str, Any], page: Page, eid: int):
        element = page.elements.get(eid)
        if element is None:
            raise ToolError(NOT_ON_PAGE, f"element [{eid}] is not on the current page ({page.title}, "
                                                 f"{_full(state['url'])}); use an id shown on this page")
        return element

    def _go(self, state: dict[str, Any], url: str, alert: str | None = None) -> dict[str, Any]:
        state["history"] = (state["history"] + [state["url"]])[-MAX_HISTORY:]
        state["url"], state["scroll"], state["inputs"] = url, 0, {}
        path = _path(url)
        if path not in state["visited"]:
            state["visited"].append(path)
        return self._shown(state, None, alert)

    def _shown(self, state: dict[str, Any], page: Page | None = None, alert: str | None = None) -> dict[str, Any]:
        page = page or self.site.render(state)
        top = min(state["scroll"], max(0, len(page.lines) - 1))
        lines = page.lines[top:top + VIEW_LINES]
        if top + VIEW_LINES < len(page.lines):
            lines.append(f"... {len(page.lines) - top - VIEW_LINES} more lines below (scroll down)")
        if page.title == RESULTS_TITLE:
            self._note_results(state, lines)
        out = {"url": _full(state["url"]), "title": page.title, "page": "\n".join(lines)}
        if alert:
            out["alert"] = alert
        return out

    def _note_results(self, state: dict[str, Any], lines: list[str]) -> None:
        """Keep what a results page showed: its search, and the products whose lines were in view
        (each line shows the product's price and listed attributes). What the agent was shown is
        the evidence that no product fits (envs/browser/verifier.py)."""
        search = self.site.search_of(state["url"])
        if search not in state["searched"]:
            state["searched"].append(search)
        for line in lines:
            match = LINK_LINE.match(line)
            k = int(match[1]) - PRODUCT_LINK if match else -1
            if 0 <= k < len(self.site.ids) and self.site.ids[k] not in state["listed"]:
                state["listed"].append(self.site.ids[k])

    def _press(self, state: dict[str, Any], action: str, *args: Any) -> dict[str, Any]:
        inputs, site = state["inputs"], self.site
        if action == "search":
            return self._go(state, site.search_url({}, q=inputs.get("q", "").strip()))
        if action == "add_to_cart":
            return self._add_to_cart(state, args[0])
        if action == "remove":
            line = state["cart"].pop(args[0])
            return self._shown(state, None, f"removed {site.products[line['pid']]['name']} from the cart")
        if action == "place_order":
            return self._place_order(state)
        account = state["account"]
        if action == "set_default":
            account["default_address"] = args[0]
            return self._shown(state, None, f"{site.address(state, args[0])['label']} is now your default address")
        if action == "save_address":
            return self._save_address(state)
        return self._save_profile(state)

    def _add_to_cart(self, state: dict[str, Any], pid: str) -> dict[str, Any]:
        product, inputs = self.site.products[pid], state["inputs"]
        options = {}
        for name, values in product["options"].items():
            if inputs.get("option") not in values:
                return self._shown(state, None, f"please choose a {name} first")
            options[name] = inputs["option"]
        qty = inputs.get("qty", "1").strip()
        if not (qty.isascii() and qty.isdigit() and 1 <= int(qty) <= MAX_QUANTITY):
            return self._shown(state, None, f"enter a quantity from 1 to {MAX_QUANTITY}")
        line = next((x for x in state["cart"] if x["pid"] == pid and x["options"] == options), None)
        if line is None:
            state["cart"].append({"pid": pid, "options": options, "qty": int(qty)})
        else:
            line["qty"] = min(MAX_QUANTITY, line["qty"] + int(qty))
        chosen = "".join(f", {k} {v}" for k, v in options.items())
        return self._shown(state, None, f"added {qty} x {product['name']}{chosen} to the cart")

    def _place_order(self, state: dict[str, Any]) -> dict[str, Any]:
        site = self.site
        address = site.address(state, state["inputs"].get("address")) or site.address(
            state, state["account"]["default_address"])
        order_id = f"W{site.data['next_order'] + len(state['orders'])}"
        lines = [{"pid": x["pid"], "name": site.products[x["pid"]]["name"], "options": dict(x["options"]),
                  "qty": x["qty"], "price": site.products[x["pid"]]["price"]} for x in state["cart"]]
        state["orders"].append({"order_id": order_id, "date": site.data["today"], "status": "Processing",
                                "lines": lines, "total": site.cart_total(state), "address_id": address["id"],
                                "ship_to": f"{address['label']}: {address['street']}, {address['city']} {address['zip']}"})
        state["cart"] = []
        return self._go(state, f"/account/orders/{order_id}", f"thank you! your order {order_id} has been placed")

    def _save_address(self, state: dict[str, Any]) -> dict[str, Any]:
        fields = {k: " ".join(state["inputs"].get(k, "").split()) for k in ("label", "street", "city", "zip")}
        account = state["account"]
        if not all(fields.values()):
            return self._shown(state, None, "please fill in label, street, city and zip")
        if not re.fullmatch(r"\d{5}", fields["zip"]):
            return self._shown(state, None, "a zip code is five digits")
        if any(a["label"].lower() == fields["label"].lower() for a in account["addresses"]):
            return self._shown(state, None, f"you already have an address labelled {fields['label']!r}")
        account["addresses"].append({"id": f"A{len(account['addresses']) + 1}", **fields})
        return self._go(state, "/account/addresses", f"address {fields['label']!r} saved")

    def _save_profile(self, state: dict[str, Any]) -> dict[str, Any]:
        account, inputs = state["account"], state["inputs"]
        email = inputs.get("email", account["email"]).strip()
        phone = inputs.get("phone", account["phone"]).strip()
        if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[a-z]{2,}", email):
            return self._shown(state, None, "please enter a valid email address")
        if not re.fullmatch(r"[0-9][0-9 ()+-]{5,18}[0-9]", phone):
            return self._shown(state, None, "please enter a valid phone number")
        account["email"], account["phone"] = email, phone
        state["inputs"] = {}
        return self._shown(state, None, "your contact details were saved")


def _normalised(url: str) -> str:
    """A url as the state keeps it: a path and query on this shop, or the foreign url as given."""
    url = url.strip()
    if url.startswith(HOST):
        url = "https://" + url
    for prefix in (f"https://{HOST}", f"http://{HOST}"):
        if url.startswith(prefix) and url[len(prefix):len(prefix) + 1] in ("", "/", "?"):
            url = url[len(prefix):] or "/"
    if not url.startswith("/") and "://" not in url:
        url = "/" + url
    return url


def _path(url: str) -> str:
    """The page a url of this shop opens, as the site routes it (query and fragment dropped); a
    foreign url as it is, without its query."""
    try:
        parts = urlsplit(url)
    except ValueError:  # the site shows its 404 page
        parts = None
    if parts is None or parts.scheme or parts.netloc:
        return url.split("?", 1)[0].rstrip("/") or "/"
    return parts.path.rstrip("/") or "/"


def _full(url: str) -> str:
    return f"https://{HOST}{url}" if url.startswith("/") else url


def _check_world(task: TaskSpec) -> None:
    """The world's shape, checked at reset (a task of another shape is refused there)."""
    site = task.initial_state.get("site")
    keys = {"products", "order", "page_size", "listing_attrs", "account", "past_orders", "today", "next_order"}
    if not (isinstance(site, dict) and keys <= set(site) and isinstance(site["products"], dict)
            and sorted(site["order"]) == sorted(site["products"])):
        raise InvalidTask(f"task {task.task_id}: initial_state is not a browser world (a site with "
                          f"{', '.join(sorted(keys))}, its order listing every product)")


__all__ = ["BrowserEnv"]
