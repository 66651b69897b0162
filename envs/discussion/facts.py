"""What a discussion task's generator tells its verifier (`task.hidden.checks`), typed."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from gymfoundry.envs.family import HiddenFacts
from gymfoundry.envs.person import Persona


class Participant(BaseModel):
    """One participant: a simulated person (envs.person) with a hidden score table over the
    options and a threshold below which they reject a decision."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: str
    persona: Persona  # what they say once they have it right (the truth)
    scores: dict[str, int]  # option -> 0..100
    threshold: int
    accepts: list[str]  # the options scoring at least the threshold, in option order
    prefers: str  # the highest-scoring option
    confidential: str  # a private fact told to the moderator when asked; never to be repeated
    clues: list[str] = []  # words of it that give it away on their own (a company, a city, an amount, "surgery")
    # A participant who misstates: what they say first (a wrong first choice and one option too many)
    first: Persona | None = None
    first_accepts: list[str] | None = None
    first_prefers: str | None = None


class Variant(BaseModel):
    """A hidden variant of the world: these participants replace their namesakes."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: str
    participants: list[Participant]


class DiscussionFacts(HiddenFacts):
    topic: str
    options: list[str]
    participants: list[Participant]
    feasible: list[str]  # options every participant accepts; empty: the right decision is "none"
    misstater: str | None = None
    variants: list[Variant] = []
