"""Policies: anything with `policy_id`, `version`, `reset(seed)` and `act(observation)`.

`act` returns the raw text the model produced, or a `PolicyOutput` that also carries the
sampled token ids and logprobs (kept as sampled, never rebuilt from text)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass
class PolicyOutput:
    text: str
    thought: str | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None


class Policy(Protocol):
    """A policy may also have `fork()`: another instance for a concurrent episode (same weights,
    client, knobs, id and version; its own episode state), safe to use from another thread. The
    rollout engine (tasks/rollout/engine.py) needs it to keep more than one episode in flight."""

    policy_id: str
    version: str

    def reset(self, seed: int | None = None) -> None: ...

    def act(self, observation: str) -> str | PolicyOutput: ...
