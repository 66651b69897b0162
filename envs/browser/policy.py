"""Scripted, observation-only policy of the browser family.

It reads the goal (the product described, the option, the budget, the address; or the question,
or the account change) and the pages it is shown, nothing else, and finds elements by their role
and label, never by a remembered id. To buy, it searches by the product's noun and the attributes
the filters cannot set, applies the colour and brand filters, opens each listed product whose
price fits, checks its attributes and options on its page, and buys the first that fits; with
nothing that fits it reports the task infeasible. With probability `mistake_rate` per opportunity
it makes a realistic mistake: it overlooks one attribute (and may buy a distractor), ignores the
budget (and may pay too much), ignores the option (buys the first one offered), leaves the default
shipping address, browses unfiltered results page by page (a choice that hangs on the listing
order, which the hidden variant catches), answers with a distractor's value or the wrong order's,
mistypes a phone number or address, sets the wrong default address, or forgets to save."""

from __future__ import annotations

import json
import re
from collections.abc import Generator

from gymfoundry.envs.scripted import ScriptedPolicy, tool_result

from .rules import CATEGORIES, VALUES

ELEMENT = re.compile(r'\[(\d+)\] (link|button|textbox|combobox) "([^"]*)"(.*)$')
BUY = re.compile(r'Buy (?:(\d+) )?(.*?), in (\w+) (.+?), spending at most \$([\d,]+\.\d\d) in total, and ship the '
                 r'order to your "([^"]+)" address')
PRODUCT_Q = re.compile(r"What is the (price|customer rating \(out of 5\)) of the (.*?) on the shop\?")
ORDER_Q = re.compile(r"What was the total of your order placed on (\d{4}-\d\d-\d\d)\?")
PHONE = re.compile(r"Change the phone number on your account to ([\d-]+)\.")
DEFAULT = re.compile(r'Make your "([^"]+)" address the default')
NEW = re.compile(r'label "([^"]+)", street "([^"]+)", city "([^"]+)", zip "(\d+)"')
NOUNS = {noun: category for category, (noun, _, _) in CATEGORIES.items()}


def wanted_in(text: str) -> tuple[str | None, dict[str, str]]:
    """The category and attributes a goal's product description names."""
    words = re.findall(r"[A-Za-z]+", text)
    category = next((NOUNS[w.lower().removesuffix("s") if w.lower() != "boots" else "boots"] for w in words
                     if (w.lower().removesuffix("s") if w.lower() != "boots" else "boots") in NOUNS), None)
    attributes = {}
    for attribute, values in VALUES.items():
        found = [v for v in values if re.search(rf"\b{re.escape(v)}\b", text)]
        if found:
            attributes[attribute] = found[0]
    return category, attributes


def elements(observation: str) -> tuple[dict, list[tuple[int, str, str, str]]]:
    """The tool result and the elements of the page it shows: (id, role, label, rest of the line)."""
    result = tool_result(observation)
    if result is None:  # the first observation: the goal, then the start page's lines
        result = {"page": observation}
    found = []
    for line in str(result.get("page", "")).splitlines():
        match = ELEMENT.search(line)
        if match:
            found.append((int(match[1]), match[2], match[3], match[4]))
    return result, found


def find(observation: str, role: str, label: str | None = None, starts: str | None = None) -> int | None:
    for eid, r, text, _ in elements(observation)[1]:
        if r == role and (label is None or text == label) and (starts is None or text.startswith(starts)):
            return eid
    return None


def page_text(observation: str) -> str:
    return str(elements(observation)[0].get("page", ""))


class ScriptedBrowserPolicy(ScriptedPolicy):
    policy_id = "scripted-browser"
    max_turns = 40

    def _final_call(self, reason: str) -> str:
        return self._say(f"Stopping ({reason}).", "report_infeasible", {"reason": f"I could not finish: {reason}"})

    def _click(self, thought: str, eid: int | None):
        return self._say(thought, "click", {"id": eid if eid is not None else 0})

    def _run(self, goal: str) -> Generator[str, str, None]:
        for pattern, plan in ((BUY, self._buy), (PRODUCT_Q, self._product_question), (ORDER_Q, self._order_question),
                              (PHONE, self._phone), (DEFAULT, self._default), (NEW, self._new_address)):
            match = pattern.search(goal)
            if match:
                yield from plan(goal, match)
                return
        yield self._final_call("I cannot read the goal")

    # -- finding a product ----------------------------------------------------------------
    def _search(self, obs: str, category: str, attributes: dict, filtered: bool) -> Generator[str, str, str]:
        noun = CATEGORIES[category][0]
        words = [noun] + ([v for k, v in attributes.items() if k not in ("color", "brand")] if filtered else [])
        obs = yield self._say(f"Search for {' '.join(words)}.", "type",
                              {"id": find(obs, "textbox", "Search products") or 0, "text": " ".join(words)})
        obs = yield self._click("Run the search.", find(obs, "button", "Search"))
        for attribute in ("color", "brand") if filtered else ():
            if attribute in attributes:
                box = find(obs, "combobox", f"Filter by {attribute}")
                obs = yield self._say(f"Filter by {attribute} {attributes[attribute]}.", "select",
                                      {"id": box or 0, "option": attributes[attribute]})
        return obs

    def _candidates(self, obs: str, max_each: float | None) -> list[tuple[int, str]]:
        out = []
        for eid, role, label, rest in elements(obs)[1]:
            price = re.search(r"\$([\d,]+\.\d\d)", rest)
            if role == "link" and eid >= 100 and price:
                if max_each is None or float(price[1].replace(",", "")) <= max_each:
                    out.append((eid, label))
        return out

    def _look(self, obs: str, category: str, attributes: dict, max_each: float | None, filtered: bool,
              option: tuple[str, str] | None) -> Generator[str, str, tuple[str | None, str]]:
        """Open the listed products in turn (paging on when browsing unfiltered) until one fits;
        (its page, or None, and why nothing fit)."""
        lacking = False
        for _ in range(6):  # pages
            obs = yield from self._read_all(obs)
            for eid, name in self._candidates(obs, max_each):
                page = yield self._click(f"Open {name}.", eid)
                if self._fits(page, category, attributes, max_each):
                    if option is None or option[1] in self._options(page):
                        return page, ""
                    lacking = True
                obs = yield self._say("Not this one; back to the results.", "back", {})
            nxt = find(obs, "link", "Next page")
            if filtered or nxt is None:
                break
            obs = yield self._click("Next page of results.", nxt)
        return None, ("the matching product does not offer that option" if lacking else
                      "no product matches every attribute within the budget")

    def _read_all(self, obs: str) -> Generator[str, str, str]:
        """The whole page, scrolling down while it runs below the fold (as one text)."""
        screens = [page_text(obs)]
        while "more lines below (scroll down)" in screens[-1] and len(screens) < 5:
            screens.append(page_text((yield self._say("Scroll down to see the rest.", "scroll", {"direction": "down"}))))
        return "\n".join(screens)

    @staticmethod
    def _fits(page: str, category: str, attributes: dict, max_each: float | None) -> bool:
        text = page_text(page)
        noun = CATEGORIES[category][0]
        heading = re.search(r'heading "([^"]*)"', text)
        if heading is None or noun.removesuffix("s") not in heading[1].lower():
            return False
        price = re.search(r"Price: \$([\d,]+\.\d\d)", text)
        if price is None or (max_each is not None and float(price[1].replace(",", "")) > max_each):
            return False
        return all(f"{k.capitalize()}: {v}\"" in text for k, v in attributes.items())

    @staticmethod
    def _options(page: str) -> list[str]:
        for eid, role, label, rest in elements(page)[1]:
            if role == "combobox" and label.startswith("Choose "):
                match = re.search(r"options=(\[.*?\])", rest)
                return json.loads(match[1].replace("'", '"')) if match else []
        return []

    def _overlook(self, attributes: dict) -> dict:
        if len(attributes) > 0 and self._mistake():  # overlooks one attribute
            dropped = self.rng.choice(sorted(attributes))
            return {k: v for k, v in attributes.items() if k != dropped}
        return attributes

    # -- buying ---------------------------------------------------------------------------
    def _buy(self, goal: str, match: re.Match) -> Generator[str, str, None]:
        qty = int(match[1] or 1)
        category, attributes = wanted_in(match[2])
        option = (match[3], match[4])
        budget = float(match[5].replace(",", ""))
        label = match[6]
        if category is None:
            yield self._final_call("I cannot tell what to buy")
            return
        attributes = self._overlook(attributes)
        max_each = None if self._mistake() else budget / qty  # ignores the budget
        filtered = not self._mistake()  # browses unfiltered results page by page
        obs = yield from self._search(goal, category, attributes, filtered)
        page, why = yield from self._look(obs, category, attributes, max_each, filtered, option)
        if page is None:
            yield self._say("Nothing fits.", "report_infeasible", {"reason": f"The shop cannot do this: {why}."})
            return
        offered = self._options(page)
        chosen = offered[1] if self._mistake() and len(offered) > 1 else option[1]  # ignores the option
        obs = yield self._say(f"Choose {option[0]} {chosen}.", "select",
                              {"id": find(page, "combobox", starts="Choose ") or 0, "option": chosen})
        if qty > 1:
            obs = yield self._say(f"Quantity {qty}.", "type", {"id": find(obs, "textbox", "Quantity") or 0,
                                                               "text": str(qty)})
        obs = yield self._click("Add it to the cart.", find(obs, "button", "Add to cart"))
        obs = yield self._click("Open the cart.", find(obs, "link", "Cart"))
        obs = yield self._click("Check out.", find(obs, "link", "Proceed to checkout"))
        if not self._mistake():  # leaves the default address
            obs = yield self._say(f"Ship to {label}.", "select", {"id": find(obs, "combobox", "Ship to") or 0,
                                                                  "option": label})
        obs = yield self._click("Place the order.", find(obs, "button", "Place order"))
        placed = re.search(r"order (W\d+) has been placed", str(elements(obs)[0].get("alert", "")))
        yield self._say("The order is placed.", "answer", {"text": placed[1] if placed else "done"})

    # -- questions ------------------------------------------------------------------------
    def _product_question(self, goal: str, match: re.Match) -> Generator[str, str, None]:
        asked = "price" if match[1] == "price" else "rating"
        category, attributes = wanted_in(match[2])
        if category is None:
            yield self._final_call("I cannot tell which product")
            return
        attributes = self._overlook(attributes)
        obs = yield from self._search(goal, category, attributes, True)
        page, _ = yield from self._look(obs, category, attributes, None, True, None)
        if page is None:
            yield self._say("No such product.", "report_infeasible",
                            {"reason": "There is no such product: the shop has no product with all of these attributes."})
            return
        text = page_text(page)
        value = (re.search(r"Price: \$([\d,]+\.\d\d)", text) if asked == "price" else
                 re.search(r"Rating: ([\d.]+) out of 5", text))
        yield self._say(f"The {asked} is on the page.", "answer", {"text": value[1] if value else "unknown"})

    def _order_question(self, goal: str, match: re.Match) -> Generator[str, str, None]:
        obs = yield self._click("Open the account.", find(goal, "link", "Your account"))
        obs = yield self._click("Open the orders.", find(obs, "link", "Your orders"))
        rows = [(eid, rest) for eid, role, label, rest in elements(obs)[1] if role == "link" and label.startswith("Order ")]
        i = next((k for k, (_, rest) in enumerate(rows) if f"placed {match[1]}" in rest), None)
        if i is None:
            yield self._say("No order that day.", "report_infeasible", {"reason": "There is no order placed that day."})
            return
        if self._mistake() and len(rows) > 1:  # reads the row next to it
            i = (i + 1) % len(rows)
        obs = yield self._click("Open that order.", rows[i][0])
        total = re.search(r"Order total: \$([\d,]+\.\d\d)", page_text(obs))
        yield self._say("The total is on the page.", "answer", {"text": total[1] if total else "unknown"})

    # -- the account ----------------------------------------------------------------------
    def _phone(self, goal: str, match: re.Match) -> Generator[str, str, None]:
        phone = match[1]
        if self._mistake():  # a typo: two digits swapped
            digits = list(phone)
            digits[-1], digits[-2] = digits[-2], digits[-1]
            phone = "".join(digits) if digits[-1] != digits[-2] else phone[:-1] + str((int(phone[-1]) + 1) % 10)
        obs = yield self._click("Open the account.", find(goal, "link", "Your account"))
        obs = yield self._click("Contact details.", find(obs, "link", "Login & contact details"))
        obs = yield self._say("Type the new number.", "type", {"id": find(obs, "textbox", "Phone") or 0, "text": phone})
        if not self._mistake():  # forgets to save
            obs = yield self._click("Save.", find(obs, "button", "Save changes"))
        yield self._say("Done.", "answer", {"text": "done"})

    def _default(self, goal: str, match: re.Match) -> Generator[str, str, None]:
        label = match[1]
        obs = yield self._click("Open the account.", find(goal, "link", "Your account"))
        obs = yield self._click("Addresses.", find(obs, "link", "Your addresses"))
        buttons = [(eid, text) for eid, role, text, _ in elements(obs)[1] if role == "button" and text.startswith("Set ")]
        pick = next((eid for eid, text in buttons if text == f"Set {label} as default"), None)
        if pick is None:
            yield self._say("No such address.", "report_infeasible",
                            {"reason": f"There is nothing to set: you have no address labelled \"{label}\"."})
            return
        if self._mistake() and len(buttons) > 1:  # clicks the neighbouring button
            pick = next(eid for eid, _ in buttons if eid != pick)
        yield self._click(f"Set {label} as default.", pick)
        yield self._say("Done.", "answer", {"text": "done"})

    def _new_address(self, goal: str, match: re.Match) -> Generator[str, str, None]:
        fields = dict(zip(("label", "street", "city", "zip"), match.groups()))
        if self._mistake():  # a typo in the street number
            number, _, rest = fields["street"].partition(" ")
            fields["street"] = f"{number}{self.rng.randint(0, 9)} {rest}"
        obs = yield self._click("Open the account.", find(goal, "link", "Your account"))
        obs = yield self._click("Addresses.", find(obs, "link", "Your addresses"))
        obs = yield self._click("Add one.", find(obs, "link", "Add a new address"))
        for name, value in fields.items():
            obs = yield self._say(f"Fill in the {name}.", "type",
                                  {"id": find(obs, "textbox", name.capitalize()) or 0, "text": value})
        obs = yield self._click("Save.", find(obs, "button", "Save address"))
        yield self._say("Done.", "answer", {"text": "done"})
