from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The info keys that say how an episode ended (written by the runtime, read only through `TimeStep.end`):
# whose clock ran out (envs.wrappers.TimeLimit, ToolCallBudget) and why; the verdict or the grader's error.
TERMINATION, TERMINATION_REASON, OUTCOME, VERIFIER_ERROR = "termination", "termination_reason", "outcome", "verifier_error"


@dataclass(frozen=True)
class EpisodeEnd:
    """How an episode ended, as its last time step says: what tasks.rollout.classify reads.
    `clock`: whose time or budget ran out (envs.wrappers: "env_fault", "grader_fault", "truncated";
    "timeout" in rollouts recorded before time was attributed), `reason` its reason; `outcome`: the
    verifier's report (a dict, as `info` carries it), or `verifier_error` where the grader raised."""

    terminated: bool = False
    truncated: bool = False
    clock: str | None = None
    reason: str | None = None
    outcome: dict[str, Any] | None = None
    verifier_error: str | None = None


@dataclass
class TimeStep:
    """What `reset` and `step` return. `info` carries the parsed call, any error and,
    at the end, the outcome report; it is for the harness, not for the agent (and is what a
    Gymnasium user gets). The pipeline reads the episode's end as a typed record: `end`."""

    observation: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def end(self) -> EpisodeEnd:
        """How the episode ended (so far): the one reader of the end's info keys."""
        info = self.info
        return EpisodeEnd(terminated=self.terminated, truncated=self.truncated, clock=info.get(TERMINATION),
                          reason=info.get(TERMINATION_REASON), outcome=info.get(OUTCOME),
                          verifier_error=info.get(VERIFIER_ERROR))

    @property
    def error(self) -> dict[str, Any] | None:
        """This step's error ({"kind", "message", ...}), or None."""
        return self.info.get("error")

    @property
    def tool_call(self) -> Any:
        """This step's parsed call (envs.records.ToolCall), or None where the action did not parse."""
        return self.info.get("tool_call")

    @property
    def thought(self) -> str | None:
        """The text before this step's call, or None."""
        return self.info.get("thought")

    def end_by(self, clock: str, reason: str) -> None:
        """Truncate the episode here: `clock`'s time or budget ran out, for `reason`."""
        self.truncated = True
        self.info.update({TERMINATION: clock, TERMINATION_REASON: reason})
