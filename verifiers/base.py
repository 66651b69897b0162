"""What every outcome verifier provides. The exam is kept apart from the world it grades:
verifiers read the task's hidden fields and the env's internal state; envs never import them.

Every verifier has a progress potential (`potentials`, the rule layer's progress input): it is
abstract, so a verifier without one cannot be instantiated, rather than scoring every step's
progress 0. `ReplayVerifier` is the base of a verifier that replays the agent's calls on a
fresh env of its family: it supplies the replay and `potentials`, and asks for `potential`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from envs.base import copy_state
from envs.errors import reached_world
from envs.family import HiddenFacts, family
from envs.records import OutcomeReport, Step, TaskSpec, ToolCall


class OutcomeVerifier(ABC):
    verifier_id: str
    version: str

    @abstractmethod
    def verify(self, task: TaskSpec, steps: list[Step], final_state: dict[str, Any] | None = None) -> OutcomeReport:
        """Judge the outcome. Without `final_state`, replay the steps' tool calls from the
        task's initial state to obtain it."""

    @abstractmethod
    def potentials(self, task: TaskSpec, steps: list[Step]) -> list[float]:
        """Φ before the first step and after each step, from the hidden state (len(steps) + 1)."""

    def precondition(self, task: TaskSpec) -> str | None:
        """Why the task is no exercise before any action (e.g. it is already solved), or None.
        The validate stage calls it beside the reference replay."""
        return None

    def terminal_reward(self, task: TaskSpec, steps: list[Step], final_state: dict[str, Any]) -> tuple[float, dict]:
        report = self.verify(task, steps, final_state)
        return (1.0 if report.success else 0.0), report.model_dump(mode="json")


class ReplayVerifier(OutcomeVerifier):
    """A verifier of the family `family` (its name) that judges states obtained by replaying
    calls on a fresh env (no outcome function) from the task's initial state."""

    family: ClassVar[str]

    @abstractmethod
    def potential(self, task: TaskSpec, state: dict[str, Any]) -> float:
        """Φ of one hidden state, in [0, 1]."""

    # (task, facts) of the task a `potentials` call is replaying, for the duration of that call:
    # its facts are validated once, not once per step. Set and cleared by the call, and keyed by
    # the task object, so another call (another thread) gets its own task's facts.
    _replaying: tuple[TaskSpec, HiddenFacts | None] | None = None

    def facts(self, task: TaskSpec) -> HiddenFacts:
        """The task's hidden facts, validated (an `InvalidTask` naming the bad fields if not)."""
        replaying = self._replaying
        if replaying is not None and replaying[0] is task:
            if replaying[1] is None:
                replaying = self._replaying = (task, family(self.family).facts_of(task))
            return replaying[1]
        return family(self.family).facts_of(task)

    def new_env(self):
        return family(self.family).env(outcome_fn=None)

    def initial_state(self, task: TaskSpec) -> dict[str, Any]:
        return self.new_env().initial_state(task)

    def replay(self, task: TaskSpec, calls: list[ToolCall | None]) -> list[dict[str, Any]]:
        """States after each call. None entries, and calls after the episode ended, leave the
        state unchanged."""
        states: list[dict[str, Any]] = []
        self._replay(task, calls, lambda now: states.append(copy_state(now[0])))
        return states

    def final_state(self, task: TaskSpec, calls: list[ToolCall | None]) -> dict[str, Any]:
        """The state after all the calls (one copy, not one per step)."""
        return copy_state(self._replay(task, calls))

    def replay_from(self, task: TaskSpec, calls: list[ToolCall | None],
                    starts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The states after all the calls, replayed in one pass from each of `starts` (initial
        states of `task`'s hidden variants, consumed: pass copies). The task is not checked
        again: the live episode's reset did (envs.base.ToolEnv.replay)."""
        env = self.new_env()
        try:
            return env.replay(task, calls, list(starts))
        finally:
            env.close()

    def _replay(self, task: TaskSpec, calls: list[ToolCall | None], after_each=None) -> dict[str, Any]:
        """The state after the calls, from the state `reset(task)` makes (the task checked, as an
        episode's reset checks it); `after_each([state])` after each call (the live state: read it,
        do not keep it)."""
        env = self.new_env()
        try:
            env.reset(task)
            return env.replay(env.task, calls, [env._state], after_each)[0]
        finally:
            env.close()

    def potentials(self, task: TaskSpec, steps: list[Step]) -> list[float]:
        """Φ of the initial state and after each step, each read as the replay reaches it (no
        state is copied). The steps are an episode's, whose reset checked the task: the replay
        starts from the task's initial state without checking it again (envs.base.ToolEnv.start)."""
        env = self.new_env()
        try:
            env.start(task)
            self._replaying = (env.task, None)
            phi = [self.potential(env.task, env._state)]
            env.replay(env.task, calls_of(steps), [env._state], lambda now: phi.append(self.potential(env.task, now[0])))
            return phi
        finally:
            self._replaying = None
            env.close()


def calls_of(steps: list[Step]) -> list[ToolCall | None]:
    """The calls to replay, aligned with the steps: None where nothing reached a tool, the step was
    rolled back (an env fault or bug leaves the state as it was) or the runtime refused it before
    the world saw it (an unapproved call): a replay must never run what the live episode did not."""
    return [s.tool_call if reached_world(s.error) else None for s in steps]
