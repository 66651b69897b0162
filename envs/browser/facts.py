"""What a browser task's generator tells its verifier (`task.hidden.checks`), typed."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from gymfoundry.envs.family import HiddenFacts


class Variant(BaseModel):
    """A hidden variant of the site: a listing order, and products that replace their namesakes."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: str
    order: list[str] | None = None
    products: dict[str, dict] = {}


class Wanted(BaseModel):
    """The product the goal describes: its category, attributes, option, quantity and budget."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    category: str
    attributes: dict[str, str]
    option: list[str] | None = None  # [option name, value], e.g. ["size", "M"]
    quantity: int = 1
    budget: int | None = None  # cents, for the whole order


class BrowserFacts(HiddenFacts):
    kind: Literal["buy", "info", "account"]
    feasible: bool
    why_infeasible: str | None = None  # what makes an infeasible task so (for the verifier's reasons)
    wanted: Wanted | None = None  # buy tasks and product questions
    target: str | None = None  # the product that satisfies the goal (None when infeasible or not a product)
    address_id: str | None = None  # buy: where to ship
    question: Literal["price", "rating", "order_total"] | None = None
    order_id: str | None = None  # order_total: the order asked about
    answer: float | None = None  # info: the value on the site
    change: Literal["phone", "default_address", "new_address"] | None = None
    account_after: dict | None = None  # account tasks: the account as it must end (contact details, addresses)
    variants: list[Variant] = []
