"""The shop's pages, rendered on demand from the site data (the task's `initial_state["site"]`,
read-only) and the episode's small mutable state (url, history, inputs, cart, orders, account).

A page is a title, lines of an accessibility tree (`[12] button "Add to cart"`) and the elements
those lines name. Element ids are fixed by what an element does, not where it sits: the search box
is always [2], a product's link is [100 + its index in the catalog sorted by id] wherever that
product is listed, an address's "Set as default" is [400 + its index]. So a page state always
renders the same ids, an id from another page is simply not on this one, and a replay of the same
ids on a site whose results are ordered differently acts on the same products."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from .rules import ATTRIBUTES, CATEGORIES

HOST = "shop.example"
HOME, SEARCH_BOX, SEARCH_BUTTON, CART, ACCOUNT = 1, 2, 3, 4, 5
CATEGORY_LINK = 6  # + index of the category
FILTERS = {"color": 11, "brand": 12}  # the facets the results page filters by
SORT, PREVIOUS, NEXT = 13, 14, 15
OPTION, QUANTITY, ADD_TO_CART = 31, 32, 33
CHECKOUT = 41
ADDRESS, PLACE_ORDER = 51, 52
ORDERS_LINK, ADDRESSES_LINK, PROFILE_LINK, NEW_ADDRESS_LINK = 61, 62, 63, 64
FORM = {"label": 71, "street": 72, "city": 73, "zip": 74, "email": 75, "phone": 76}
SAVE = 79
PRODUCT_LINK, REMOVE_LINE, SET_DEFAULT, ORDER_LINK = 100, 300, 400, 500
SORTS = {"Relevance": "relevance", "Price: low to high": "price_asc", "Price: high to low": "price_desc",
         "Customer rating": "rating"}
ANY = "Any"
RESULTS_TITLE = "Search results - Shop"
SEARCHED = ("q", "category", *FILTERS)  # what decides which products a results page lists (not page or sort)
VIEW_LINES = 18  # lines of the tree shown at once (a long results page runs below the fold); `scroll` moves by this much
MAX_QUANTITY = 10


def money(cents: int) -> str:
    return f"${cents // 100:,}.{cents % 100:02d}"


@dataclass
class Element:
    role: str  # link, button, textbox, combobox
    label: str
    action: tuple = ()  # ("goto", url) | ("button", name, *args) | ("input", field) | ("select", field, options)
    options: tuple[str, ...] = ()


@dataclass
class Page:
    title: str
    lines: list[str] = field(default_factory=list)
    elements: dict[int, Element] = field(default_factory=dict)

    def text(self, line: str) -> None:
        self.lines.append(line)

    def add(self, eid: int, element: Element, extra: str = "", indent: int = 1) -> None:
        self.elements[eid] = element
        shown = f'{"  " * indent}[{eid}] {element.role} "{element.label}"'
        if element.role == "textbox":
            shown += f" value={element.action[2]!r}" if len(element.action) > 2 else ""
        if element.role == "combobox":
            shown += f" options={list(element.options)}"
        self.lines.append(shown + extra)

    def link(self, eid: int, label: str, url: str, extra: str = "", indent: int = 1) -> None:
        self.add(eid, Element("link", label, ("goto", url)), extra, indent)

    def button(self, eid: int, label: str, *action: Any, extra: str = "") -> None:
        self.add(eid, Element("button", label, ("button", *action)), extra)

    def textbox(self, eid: int, label: str, name: str, value: str) -> None:
        self.add(eid, Element("textbox", label, ("input", name, value)))

    def combobox(self, eid: int, label: str, name: str, options: list[str], value: str, extra: str = "") -> None:
        self.add(eid, Element("combobox", label, ("select", name), tuple(options)), f" selected={value!r}{extra}")


class Site:
    """The read-only site data of one task, indexed once per episode."""

    def __init__(self, site: dict[str, Any]):
        self.data = site
        self.products: dict[str, dict] = site["products"]
        self.ids = sorted(self.products)
        self.index = {pid: i for i, pid in enumerate(self.ids)}
        self.order = site["order"]
        self.rank = {pid: i for i, pid in enumerate(self.order)}
        self.page_size: int = site["page_size"]
        self.listing_attrs: list[str] = site["listing_attrs"]
        self.categories = sorted({p["category"] for p in self.products.values()})
        self.past_orders: list[dict] = site["past_orders"]
        self._words: dict[str, set[str]] | None = None

    @property
    def words(self) -> dict[str, set[str]]:
        """Each product's searchable words, built on the first search."""
        if self._words is None:
            self._words = {pid: search_words(" ".join([p["name"], p["category"]] + [p[a] for a in ATTRIBUTES]))
                           for pid, p in self.products.items()}
        return self._words

    # -- routing ------------------------------------------------------------------------
    def render(self, state: dict[str, Any]) -> Page:
        try:
            parts = urlsplit(state["url"])
            path = parts.path.rstrip("/") or "/"
            query = dict(parse_qsl(parts.query, keep_blank_values=True))
        except ValueError:
            return self._not_found(state["url"])
        if parts.scheme not in ("", "http", "https") or parts.netloc not in ("", HOST):
            return self._unreachable(parts.netloc or parts.scheme)
        if path == "/":
            return self._home()
        if path == "/search":
            return self._search(state, query)
        if path.startswith("/product/") and path[9:] in self.products:
            return self._product(state, path[9:])
        if path == "/cart":
            return self._cart(state)
        if path == "/checkout":
            return self._checkout(state)
        if path == "/account":
            return self._account(state)
        if path == "/account/orders":
            return self._orders(state)
        if path.startswith("/account/orders/") and self.find_order(state, path[16:]) is not None:
            return self._order(state, path[16:])
        if path == "/account/addresses":
            return self._addresses(state)
        if path == "/account/addresses/new":
            return self._new_address(state)
        if path == "/account/profile":
            return self._profile(state)
        return self._not_found(path)

    def find_order(self, state: dict[str, Any], order_id: str) -> dict | None:
        return next((o for o in self.past_orders + state["orders"] if o["order_id"] == order_id), None)

    # -- shared chrome ------------------------------------------------------------------
    def _page(self, title: str, q: str = "") -> Page:
        page = Page(title)
        page.text("banner")
        page.link(HOME, "Shop home", "/")
        page.textbox(SEARCH_BOX, "Search products", "q", q)
        page.button(SEARCH_BUTTON, "Search", "search")
        page.link(CART, "Cart", "/cart")
        page.link(ACCOUNT, "Your account", "/account")
        page.text("main")
        return page

    def _product_link(self, page: Page, pid: str, extra: str = "", indent: int = 1) -> None:
        page.link(PRODUCT_LINK + self.index[pid], self.products[pid]["name"], f"/product/{pid}", extra, indent)

    def _home(self) -> Page:
        page = self._page("Shop - Home")
        page.text('  heading "Shop by category"')
        for i, category in enumerate(self.categories):
            page.link(CATEGORY_LINK + i, category.capitalize(), "/search?" + urlencode({"category": category}))
        return page

    def _not_found(self, path: str) -> Page:
        page = self._page("404 - Page not found")
        page.text('  heading "Page not found"')
        page.text(f"  text \"We couldn't find {path[:80]!r}. Try the search box or the home page.\"")
        return page

    def _unreachable(self, host: str) -> Page:
        page = Page("This site can't be reached")
        page.text(f"text \"{host[:60]!r} can't be reached from this browser; only {HOST} is available.\"")
        return page

    # -- search -------------------------------------------------------------------------
    def results(self, query: dict[str, str]) -> tuple[list[str], dict[str, list[str]]]:
        """The products a results URL lists, in order, and each facet's values before that facet's filter."""
        words = search_words(query.get("q", ""))
        category = query.get("category", "")
        base = [pid for pid in self.order if words <= self.words[pid]
                and (not category or self.products[pid]["category"] == category)]
        facets = {}
        for facet in FILTERS:
            others = [pid for pid in base if all(query.get(f) in (None, "", ANY) or self.products[pid][f] == query[f]
                                                 for f in FILTERS if f != facet)]
            facets[facet] = sorted({self.products[pid][facet] for pid in others})
        chosen = [pid for pid in base if all(query.get(f) in (None, "", ANY) or self.products[pid][f] == query[f]
                                             for f in FILTERS)]
        sort = query.get("sort", "relevance")
        if sort == "price_asc":
            chosen.sort(key=lambda pid: (self.products[pid]["price"], self.rank[pid]))
        elif sort == "price_desc":
            chosen.sort(key=lambda pid: (-self.products[pid]["price"], self.rank[pid]))
        elif sort == "rating":
            chosen.sort(key=lambda pid: (-self.products[pid]["rating"], self.rank[pid]))
        return chosen, facets

    def _search(self, state: dict[str, Any], query: dict[str, str]) -> Page:
        found, facets = self.results(query)
        pages = max(1, -(-len(found) // self.page_size))
        number = _int(query.get("page"), 1)
        number = min(max(number, 1), pages)
        page = self._page(RESULTS_TITLE, query.get("q", ""))
        what = query.get("q") or query.get("category") or "all products"
        page.text(f'  heading "{len(found)} result{"s" * (len(found) != 1)} for {what[:60]!r}"')
        for facet, eid in FILTERS.items():
            page.combobox(eid, f"Filter by {facet}", facet, [ANY] + facets[facet], query.get(facet) or ANY)
        sort = next((label for label, key in SORTS.items() if key == query.get("sort")), "Relevance")
        page.combobox(SORT, "Sort by", "sort", list(SORTS), sort)
        for pid in found[(number - 1) * self.page_size:number * self.page_size]:
            p = self.products[pid]
            shown = ", ".join(p[a] for a in self.listing_attrs)
            self._product_link(page, pid, f" - {money(p['price'])} - rating {p['rating']} - {shown}")
        if not found:
            page.text('  text "No products match. Try fewer words or other filters."')
        page.text(f'  text "Page {number} of {pages}"')
        if number > 1:
            page.link(PREVIOUS, "Previous page", self.search_url(query, page=str(number - 1)))
        if number < pages:
            page.link(NEXT, "Next page", self.search_url(query, page=str(number + 1)))
        return page

    @staticmethod
    def query_of(url: str) -> dict[str, str]:
        return dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))

    @staticmethod
    def search_of(url: str) -> str:
        """The search a results url runs, as a url without its page and sort (the same products)."""
        return Site.search_url({k: v for k, v in Site.query_of(url).items() if k in SEARCHED})

    @staticmethod
    def lists_any(search: str, wanted: Any) -> bool:
        """Whether the results of `search` (a url) list every product that is the one `wanted`
        describes, whatever its other attributes: its words are all words of the product's noun,
        category or named attributes, and its category and filters are the goal's or none."""
        query, named = Site.query_of(search), wanted.attributes
        words = search_words(" ".join([CATEGORIES[wanted.category][0], wanted.category, *named.values()]))
        return (search_words(query.get("q", "")) <= words and query.get("category", "") in ("", wanted.category)
                and all(query.get(f) in (None, "", ANY, named.get(f)) for f in FILTERS))

    @staticmethod
    def search_url(query: dict[str, str], **changes: str) -> str:
        merged = {**query, **changes}
        if "page" not in changes:
            merged.pop("page", None)
        return "/search?" + urlencode({k: v for k, v in sorted(merged.items()) if v not in ("", ANY)})

    # -- product, cart, checkout --------------------------------------------------------
    def _product(self, state: dict[str, Any], pid: str) -> Page:
        p = self.products[pid]
        page = self._page(f"{p['name']} - Shop")
        page.text(f'  heading "{p["name"]}"')
        page.text(f'  text "Price: {money(p["price"])}"')
        page.text(f'  text "Rating: {p["rating"]} out of 5 ({p["reviews"]} reviews)"')
        for attribute in ATTRIBUTES:
            page.text(f'  text "{attribute.capitalize()}: {p[attribute]}"')
        page.text(f'  text "{p["description"]}"')
        for name, values in p["options"].items():
            page.combobox(OPTION, f"Choose {name}", "option", [f"Choose {name}"] + values,
                          state["inputs"].get("option", f"Choose {name}"))
        page.textbox(QUANTITY, "Quantity", "qty", state["inputs"].get("qty", "1"))
        page.button(ADD_TO_CART, "Add to cart", "add_to_cart", pid)
        return page

    def _cart(self, state: dict[str, Any]) -> Page:
        page = self._page("Your cart - Shop")
        page.text('  heading "Your cart"')
        if not state["cart"]:
            page.text('  text "Your cart is empty."')
            return page
        for i, line in enumerate(state["cart"]):
            p = self.products[line["pid"]]
            options = ", ".join(f"{k}: {v}" for k, v in line["options"].items())
            self._product_link(page, line["pid"], f" - {options} - qty {line['qty']} - "
                                                  f"{money(p['price'] * line['qty'])}")
            page.button(REMOVE_LINE + i, "Remove", "remove", i)
        page.text(f'  text "Subtotal: {money(self.cart_total(state))}"')
        page.link(CHECKOUT, "Proceed to checkout", "/checkout")
        return page

    def cart_total(self, state: dict[str, Any]) -> int:
        return sum(self.products[line["pid"]]["price"] * line["qty"] for line in state["cart"])

    def _checkout(self, state: dict[str, Any]) -> Page:
        page = self._page("Checkout - Shop")
        page.text('  heading "Checkout"')
        if not state["cart"]:
            page.text('  text "Your cart is empty."')
            return page
        account = state["account"]
        chosen = self.address(state, state["inputs"].get("address")) or self.address(state, account["default_address"])
        labels = [a["label"] for a in account["addresses"]]
        page.combobox(ADDRESS, "Ship to", "address", labels, chosen["label"])
        page.text(f'  text "Shipping to: {_address_line(chosen)}"')
        card = self.data["account"]["card"]
        page.text(f'  text "Paying with {card["brand"]} ending in {card["number"][-4:]}"')
        page.text(f'  text "Order total: {money(self.cart_total(state))} (free shipping)"')
        page.button(PLACE_ORDER, "Place order", "place_order")
        return page

    @staticmethod
    def address(state: dict[str, Any], key: str | None) -> dict | None:
        """An address of the account by id or by label."""
        return next((a for a in state["account"]["addresses"] if key in (a["id"], a["label"])), None)

    # -- account ------------------------------------------------------------------------
    def _account(self, state: dict[str, Any]) -> Page:
        page = self._page("Your account - Shop")
        page.text(f'  heading "Hello, {self.data["account"]["name"]}"')
        page.link(ORDERS_LINK, "Your orders", "/account/orders")
        page.link(ADDRESSES_LINK, "Your addresses", "/account/addresses")
        page.link(PROFILE_LINK, "Login & contact details", "/account/profile")
        return page

    def _orders(self, state: dict[str, Any]) -> Page:
        page = self._page("Your orders - Shop")
        page.text('  heading "Your orders"')
        orders = self.past_orders + state["orders"]
        for i in reversed(range(len(orders))):
            o = orders[i]
            items = sum(line["qty"] for line in o["lines"])
            page.link(ORDER_LINK + i, f"Order {o['order_id']}", f"/account/orders/{o['order_id']}",
                      f" - placed {o['date']} - {items} item{'s' * (items != 1)} - {o['status']}")
        if not orders:
            page.text('  text "You have no orders yet."')
        return page

    def _order(self, state: dict[str, Any], order_id: str) -> Page:
        o = self.find_order(state, order_id)
        page = self._page(f"Order {order_id} - Shop")
        page.text(f'  heading "Order {order_id}"')
        page.text(f'  text "Placed {o["date"]} - {o["status"]}"')
        for line in o["lines"]:
            options = ", ".join(f"{k}: {v}" for k, v in line["options"].items())
            page.text(f'  text "{line["name"]} - {options} - qty {line["qty"]} - {money(line["price"] * line["qty"])}"')
        page.text(f'  text "Order total: {money(o["total"])}"')
        page.text(f'  text "Shipped to: {o["ship_to"]}"')
        return page

    def _addresses(self, state: dict[str, Any]) -> Page:
        page = self._page("Your addresses - Shop")
        page.text('  heading "Your addresses"')
        account = state["account"]
        for i, a in enumerate(account["addresses"]):
            if a["id"] == account["default_address"]:
                page.text(f'  text "{_address_line(a)} (default)"')
            else:
                page.text(f'  text "{_address_line(a)}"')
                page.button(SET_DEFAULT + i, f"Set {a['label']} as default", "set_default", a["id"])
        page.link(NEW_ADDRESS_LINK, "Add a new address", "/account/addresses/new")
        return page

    def _new_address(self, state: dict[str, Any]) -> Page:
        page = self._page("New address - Shop")
        page.text('  heading "Add a new address"')
        for name in ("label", "street", "city", "zip"):
            page.textbox(FORM[name], name.capitalize(), name, state["inputs"].get(name, ""))
        page.button(SAVE, "Save address", "save_address")
        return page

    def _profile(self, state: dict[str, Any]) -> Page:
        page = self._page("Login & contact details - Shop")
        page.text('  heading "Login & contact details"')
        account = state["account"]
        page.text(f'  text "Name: {self.data["account"]["name"]}"')
        for name in ("email", "phone"):
            page.textbox(FORM[name], name.capitalize(), name, state["inputs"].get(name, account[name]))
        page.button(SAVE, "Save changes", "save_profile")
        return page


def _address_line(a: dict) -> str:
    return f"{a['label']}: {a['street']}, {a['city']} {a['zip']}"


def search_words(text: str) -> set[str]:
    """Lower-case words with a plural 's' dropped, so 'Jackets' finds 'jacket'."""
    return {w[:-1] if len(w) > 3 and w.endswith("s") else w for w in re.findall(r"[a-z0-9]+", text.lower())}


def _int(text: str | None, default: int) -> int:
    return int(text) if text is not None and text.isascii() and text.isdigit() and len(text) < 6 else default
