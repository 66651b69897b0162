"""What the inventory generator tells its verifier (`task.hidden.checks`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from gymfoundry.envs.family import HiddenFacts


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Target(_Part):
    sku: str
    name: str
    quantity: int


class Hold(_Part):
    """Another order's hold, already subtracted from the available stock."""

    hold_id: str
    order_id: str
    sku: str
    quantity: int


class Variant(_Part):
    """The initial snapshot with these target stocks, for the hidden-variation check."""

    name: str
    stock: dict[str, int]


class InventoryFacts(HiddenFacts):
    order_id: str
    approved: bool
    expected_status: Literal["reserved", "denied"]
    expected_reservations: dict[str, int]  # sku -> units; empty when authorisation is denied
    targets: list[Target]
    initial_stock: dict[str, int]
    holds: list[Hold]
    variants: list[Variant]
