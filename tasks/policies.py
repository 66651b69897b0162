"""Policies: anything with `policy_id`, `version`, `reset(seed)` and `act(observation)`.

`act` returns the raw text the model produced, or a `PolicyOutput` that also carries the
sampled token ids and logprobs (kept as sampled, never rebuilt from text)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from envs.registry import family_env_id, load, spec


@dataclass
class PolicyOutput:
    text: str
    thought: str | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None


class Policy(Protocol):
    policy_id: str
    version: str

    def reset(self, seed: int | None = None) -> None: ...

    def act(self, observation: str) -> str | PolicyOutput: ...


def make_policy(name: str, family: str, **kwargs) -> Policy:
    """`scripted`: the family's observation-only scripted policy (kwargs: mistake_rate)."""
    if name == "scripted":
        target = spec(family_env_id(family)).scripted_policy
        if target is None:
            raise ValueError(f"family {family!r} has no scripted policy")
        return load(target)(**kwargs)
    if name in ("hf", "openai"):  # kwargs: model (a checkpoint dir / an endpoint's model name), ...
        from tasks.hf_policy import HFPolicy, family_tools
        from tasks.openai_policy import OpenAIPolicy

        model = kwargs.pop("model")
        return (HFPolicy if name == "hf" else OpenAIPolicy)(model, family_tools(family), **kwargs)
    raise ValueError(f"unknown policy {name!r}; available: scripted, hf, openai")
