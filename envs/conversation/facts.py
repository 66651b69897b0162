"""What the conversation generator tells its world and its verifier (`task.hidden.checks`): the
customer's persona (read by the world's simulated person, never rendered), who they are, each
sub-request with what the policy makes of it, what the agent must tell them, how the
conversation must end, and the hidden variants of the database."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from gymfoundry.envs.family import HiddenFacts
from gymfoundry.envs.person import Persona

Kind = Literal["cancel", "return", "exchange", "address", "out_of_scope"]


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Request(_Part):
    """One sub-request of the conversation and what the policy makes of it. `allowed` False: the
    right answer is a refusal (a trap) and the order must stay as it was; `trap` says which."""

    kind: Kind
    order_id: str | None = None  # None for an out-of-scope request
    product: str | None = None  # the product the customer names (quoted in the opening)
    allowed: bool = True
    trap: str | None = None  # cancel_not_pending, return_late, exchange_other_product, refund_elsewhere
    item_ids: list[str] = []
    new_variant_id: str | None = None
    address: str | None = None
    refund_cents: int = 0
    payment_method_id: str | None = None  # where the refund must go (the original payment method)


class Mention(_Part):
    """What the agent must say to the customer: `text` in a respond or end_conversation message,
    after the action on `order_id` (an amount) or at any time (a refusal, with a refusal word)."""

    kind: Literal["amount", "refusal"]
    text: str
    order_id: str | None = None


class DbVariant(_Part):
    """The same task against a database where the distractor order `order_id` differs."""

    name: str
    order_id: str
    status: str
    price_delta_cents: int


class ConversationFacts(HiddenFacts):
    persona: Persona
    customer_id: str
    verify_by: Literal["email", "name_zip"]
    requests: list[Request]
    mentions: list[Mention]
    expected_end: Literal["resolved", "transferred"]
    distractor_orders: list[str]
    variants: list[DbVariant]
