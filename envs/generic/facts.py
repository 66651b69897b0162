"""What a YAML domain's generator tells its verifier (`task.hidden.checks`): the task's
parameters and its outcome rules as state predicates, copied from the template when the task is
made, so a stored task is judged by what it was made with, not by today's domain file."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from gymfoundry.envs.family import HiddenFacts


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class RuleFacts(_Part):
    """An outcome rule: `check`, a predicate over `$state` (the final state), `$initial` and the
    parameters, must hold; `message` says why the rollout failed when it does not."""

    name: str
    check: Any
    message: str


class VariantFacts(_Part):
    """A hidden variant: these effects applied to the initial state, the same calls replayed."""

    name: str
    effects: list[Any]


class GenericFacts(HiddenFacts):
    template: str  # the task template's name
    params: dict[str, Any]  # every parameter and knob, as drawn
    outcome: list[RuleFacts]
    variants: list[VariantFacts]
