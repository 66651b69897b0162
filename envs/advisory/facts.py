"""What an advisory task's generator tells its verifier (`task.hidden.checks`), typed."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from gymfoundry.envs.family import HiddenFacts
from gymfoundry.envs.person import Persona


class Profile(BaseModel):
    """The client's suitability facts as they really are (what the persona says when asked)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    risk_tolerance: int  # 1..5
    horizon_years: int
    budget: int
    exclusions: list[str]  # exposures from rules.EXPOSURES the client will not hold


class Variant(BaseModel):
    """A hidden variant of the world: these products replace their namesakes in the catalog."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: str
    products: dict[str, dict]


class AdvisoryFacts(HiddenFacts):
    persona: Persona  # the client, played by the simulated person (envs.person)
    profile: Profile
    kind: Literal["savings", "insurance"]  # what the client asks for (in the opening, so visible)
    suitable: list[str]  # every product that suits; empty: the right answer is "none"
    volunteered: str | None = None  # a topic the client volunteers wrongly in the opening, then corrects
    variants: list[Variant] = []
