from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TimeStep:
    """What `reset` and `step` return. `info` carries the parsed call, any error and,
    at the end, the outcome report; it is for the harness, not for the agent."""

    observation: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated
