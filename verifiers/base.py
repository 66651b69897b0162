"""What every outcome verifier provides. The exam is kept apart from the world it grades:
verifiers read the task's hidden fields and the env's internal state; envs never import them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from envs.errors import rolled_back
from envs.records import OutcomeReport, Step, TaskSpec, ToolCall


class OutcomeVerifier(ABC):
    verifier_id: str
    version: str

    @abstractmethod
    def verify(self, task: TaskSpec, steps: list[Step], final_state: dict[str, Any] | None = None) -> OutcomeReport:
        """Judge the outcome. Without `final_state`, replay the steps' tool calls from the
        task's initial state to obtain it."""

    def precondition(self, task: TaskSpec) -> str | None:
        """Why the task is no exercise before any action (e.g. it is already solved), or None.
        The validate stage calls it beside the reference replay."""
        return None

    def terminal_reward(self, task: TaskSpec, steps: list[Step], final_state: dict[str, Any]) -> tuple[float, dict]:
        report = self.verify(task, steps, final_state)
        return (1.0 if report.success else 0.0), report.model_dump(mode="json")


def calls_of(steps: list[Step]) -> list[ToolCall | None]:
    """The calls to replay, aligned with the steps: None where nothing reached a tool or the
    step was rolled back (an env fault or bug leaves the state as it was, so the replay skips it)."""
    return [None if rolled_back(s.error) else s.tool_call for s in steps]
