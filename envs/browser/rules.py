"""The browser family's rules, one owner each: the shop's vocabulary, how a goal describes a
product, when a product fits what the goal asks, and how an answer is read as a number. The
generator, the verifier, the scripted policy and the tests read them here."""

from __future__ import annotations

import re
from typing import Any

from .facts import Wanted

ATTRIBUTES = ("color", "brand", "material", "feature")
VALUES = {"color": ("black", "navy", "red", "green", "grey", "tan", "blue", "white"),
          "brand": ("Alpine", "Northway", "Summit", "Trailhead", "Borealis", "Fjordline", "Kestrel", "Larch"),
          "material": ("nylon", "leather", "wool", "cotton", "polyester", "canvas"),
          "feature": ("waterproof", "insulated", "lightweight", "recycled")}
# category -> (the noun a goal uses, the option a product page offers, its values in order)
CATEGORIES = {"jackets": ("jacket", "size", ("XS", "S", "M", "L", "XL")),
              "boots": ("boots", "size", ("7", "8", "9", "10", "11", "12")),
              "backpacks": ("backpack", "capacity", ("20 L", "30 L", "40 L", "50 L"))}


def describe(wanted: Wanted, article: bool = True, plural: bool = False) -> str:
    """'a navy wool jacket by Alpine that is waterproof' (the goal's words for a product); plural:
    'navy wool jackets by Alpine that are waterproof'."""
    a = wanted.attributes
    noun = CATEGORIES[wanted.category][0]
    if plural and wanted.category != "boots":
        noun += "s"
    text = " ".join(x for x in (a.get("color"), a.get("material"), noun) if x)
    if plural and wanted.category == "boots":
        text = "pairs of " + text
    elif article and not plural:
        text = ("a pair of " if wanted.category == "boots" else "a ") + text
    if "brand" in a:
        text += f" by {a['brand']}"
    if "feature" in a:
        text += f" that {'are' if plural or wanted.category == 'boots' else 'is'} {a['feature']}"
    return text


def misses(product: dict[str, Any], wanted: Wanted) -> list[tuple[str, str, str]]:
    """(what, the product's, the goal's) for each way the product is not the one described
    (category and attributes; not option, quantity or price)."""
    out = [] if product["category"] == wanted.category else [("category", product["category"], wanted.category)]
    return out + [(k, product[k], v) for k, v in wanted.attributes.items() if product[k] != v]


def offers(product: dict[str, Any], wanted: Wanted) -> bool:
    return wanted.option is None or wanted.option[1] in product["options"].get(wanted.option[0], [])


def affordable(product: dict[str, Any], wanted: Wanted) -> bool:
    return wanted.budget is None or product["price"] * wanted.quantity <= wanted.budget


def satisfying(products: dict[str, dict], wanted: Wanted) -> list[str]:
    """Every product that is the one described, offers the option and fits the budget, by id."""
    return sorted(pid for pid, p in products.items() if not misses(p, wanted) and offers(p, wanted)
                  and affordable(p, wanted))


_NOISE = re.compile(r"\$|usd|dollars?|stars?|out of 5(\.0)?|/ ?5(\.0)?\b|,|\s+")


def as_number(text: str) -> float | None:
    """The answer read as one number ('$1,089.50', '4.3 out of 5', '4.3 stars' -> the number);
    None when it is not exactly one number (a hedge like '12.50 or 13.00', a sentence, a date)."""
    bare = _NOISE.sub("", text.strip().lower()).rstrip(".")
    if not re.fullmatch(r"-?\d+(\.\d+)?", bare) or len(bare) > 20:
        return None
    return float(bare)
