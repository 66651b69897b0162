"""What every outcome verifier provides. The exam is kept apart from the world it grades:
verifiers read the task's hidden fields and the env's internal state; envs never import them.

Every verifier has a progress potential (`potentials`, the rule layer's progress input): it is
abstract, so a verifier without one cannot be instantiated, rather than scoring every step's
progress 0. `ReplayVerifier` is the base of a verifier that replays the agent's calls on a
fresh env of its family: it supplies the replay and `potentials`, and asks for `potential`."""

from __future__ import annotations

import functools
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from gymfoundry.envs.base import ToolEnv, copy_state
from gymfoundry.envs.errors import reached_world
from gymfoundry.envs.family import HiddenFacts, family
from gymfoundry.envs.records import OutcomeReport, Rollout, Step, TaskSpec, ToolCall


@dataclass(frozen=True)
class Ending:
    """An ending the agent may choose ("nothing to do", a refusal, "none", an answer) and the
    evidence that justifies it. A blind ending leaves the final state exactly as a justified one
    does, so the state alone cannot tell them apart: the steps before the ending must show what
    the agent looked at.

    `tool`: the ending tool. `applies(arguments)`: which of its calls this covers (all by
    default), e.g. only a recommendation of "none". `evidence(verifier, task, before)`: why the
    evidence is missing (empty when it is there), read from the steps before the ending; those
    steps' results come from the world, never from what the agent claims. `why`: the evidence in
    words, for the docs and the audit."""

    tool: str
    evidence: Callable[[Any, TaskSpec, list[Step]], list[str]]
    why: str
    applies: Callable[[dict[str, Any]], bool] = lambda arguments: True


def ending_step(steps: list[Step], tools: set[str] | frozenset[str]) -> int | None:
    """The index of the last step whose call of one of `tools` reached the world without error."""
    for i in range(len(steps) - 1, -1, -1):
        call = steps[i].tool_call
        if call is not None and call.name in tools and steps[i].error is None:
            return i
    return None


def missing_evidence(verifier: OutcomeVerifier, task: TaskSpec, steps: list[Step]) -> list[str]:
    """Why the episode's ending is not justified by what the agent looked at first (empty when
    it is, or when it did not end by a declared ending)."""
    endings = type(verifier).endings
    if not endings:
        return []
    at = ending_step(steps, {e.tool for e in endings})
    if at is None:
        return []
    call = steps[at].tool_call
    reasons: list[str] = []
    for ending in endings:
        if ending.tool == call.name and ending.applies(dict(call.arguments)):
            reasons += [f"{call.name} without evidence: {r}" for r in ending.evidence(verifier, task, steps[:at])]
    return reasons


def _enforcing(verify: Callable) -> Callable:
    """`verify` whose success also needs the evidence of the declared endings (`endings`)."""

    @functools.wraps(verify)
    def checked(self, task: TaskSpec, steps: list[Step], final_state: dict[str, Any] | None = None) -> OutcomeReport:
        report = verify(self, task, steps, final_state)
        missing = missing_evidence(self, task, steps)
        if missing:
            report = report.model_copy(update={"success": False, "completed": False,
                                               "reasons": [*report.reasons, *missing]})
        return report

    checked.__enforces_endings__ = True
    return checked


class OutcomeVerifier(ABC):
    verifier_id: str
    version: str
    # The endings that need evidence (an SDK declaration, enforced here for every verifier: a
    # success whose ending lacks its evidence is a failure, its reasons say what was missing).
    endings: ClassVar[tuple[Ending, ...]] = ()
    # Tools whose text arguments the verdict checks against the facts (disclosures, promises,
    # claims): {tool: (argument, ...)}. The gameability audit negates them (tasks/stages/audit.py).
    statements: ClassVar[dict[str, tuple[str, ...]]] = {}
    # The gameability audit's chance floors: {adversary: (floor, why a guess can be right)}; an
    # adversary not named here must never succeed (floor 0).
    audit_floors: ClassVar[dict[str, tuple[float, str]]] = {}
    # State keys that record where the agent looked, not what it changed (an event log, the page
    # open): the audit ignores them when it asks whether an extra write changed the world.
    ephemeral_state: ClassVar[tuple[str, ...]] = ("events",)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        verify = cls.__dict__.get("verify")
        if verify is not None and not getattr(verify, "__enforces_endings__", False):
            cls.verify = _enforcing(verify)

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

    def facts(self, task: TaskSpec) -> HiddenFacts:
        """The task's hidden facts, validated (an `InvalidTask` naming the bad fields if not); once
        per task while this thread reads that task's states (`potentials`, `LiveProgress`)."""
        reading = getattr(_READING, "task", None)
        if reading is not None and reading[0] is task:
            if reading[1] is None:
                reading = _READING.task = (task, family(self.family).facts_of(task))
            return reading[1]
        return family(self.family).facts_of(task)

    def live(self, world: Any) -> LiveProgress | None:
        """A recorder of Φ for the live episode of `world` (the bare env, reset), whose values are
        exactly what `potentials` would compute by replaying that episode's steps; None where that
        is not guaranteed: a world of another family, or one whose step is its own (the replay
        then goes through `step`), or a verifier with a `potentials` of its own."""
        if (type(self).potentials is not ReplayVerifier.potentials or not isinstance(world, ToolEnv)
                or world.family != self.family or world.task is None
                or type(world).step is not ToolEnv.step or type(world)._act is not ToolEnv._act):
            return None
        return LiveProgress(self, world)

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

    def replay_from(self, task: TaskSpec, calls: list[ToolCall | None], starts: list[dict[str, Any]],
                    originals: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The states after all the calls, replayed in one pass from each of `starts` (initial
        states of `task`'s hidden variants, consumed: pass copies; `originals`, if given, are
        further copies the replay only reads). The task is not checked again: the live
        episode's reset did (envs.base.ToolEnv.replay)."""
        env = self.new_env()
        try:
            return env.replay(task, calls, list(starts), starts=originals)
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
            with reading(env.task):
                phi = [self.potential(env.task, env._state)]
                env.replay(env.task, calls_of(steps), [env._state],
                           lambda now: phi.append(self.potential(env.task, now[0])))
            return phi
        finally:
            env.close()


# (task, facts or None) of the task whose states this thread is reading: its facts are validated
# once, not once per state. Per thread, so concurrent episodes and scorings each keep their own.
_READING = threading.local()


class reading:
    """`with reading(task):` this thread reads `task`'s states (its facts are cached meanwhile)."""

    def __init__(self, task: TaskSpec):
        self.task = task

    def __enter__(self) -> None:
        self.saved = getattr(_READING, "task", None)
        _READING.task = (self.task, None)

    def __exit__(self, *exc: Any) -> None:
        _READING.task = self.saved


class LiveProgress:
    """Φ of a live episode's states, read by its verifier from the env's own state as the episode
    reaches them: after `reset` and after each step the runtime recorded (`observe`). The policy
    never sees or touches that state; the values equal the replay's (`ReplayVerifier.potentials`)
    because the replay plays exactly the calls that changed it (`calls_of`). A step the time limit
    abandoned is never observed, so its episode's values do not fit its steps and are not kept."""

    def __init__(self, verifier: ReplayVerifier, world: ToolEnv):
        self.verifier, self.world, self.task = verifier, world, world.task
        self.phi: list[float] | None = []
        self._reading = reading(self.task)

    def __enter__(self) -> LiveProgress:
        self._reading.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._reading.__exit__()

    def observe(self) -> None:
        """Φ of the state now. A potential that raises (a grader bug, a task's bad hidden facts)
        stops the record and never reaches the episode: scoring replays it and meets the error
        there, as it would without a live record."""
        if self.phi is None:
            return
        try:
            self.phi.append(self.verifier.potential(self.task, self.world._state))
        except Exception:
            self.phi = None

    def keep(self, rollout: Rollout) -> None:
        """Carry the values alongside `rollout` (for `recorded_potentials`), if they fit its steps."""
        if self.phi is not None and len(self.phi) == len(rollout.steps) + 1 and self.world.task is self.task:
            _RECORDED[id(rollout)] = (weakref.ref(rollout, lambda _, key=id(rollout): _RECORDED.pop(key, None)),
                                      type(self.verifier), self.verifier.version, self.task.task_id,
                                      _played(rollout.steps), list(self.phi))


# id(rollout) -> (a weak reference to it, verifier class, version, task id, its steps as played, Φ):
# potentials recorded during the live episode, kept beside the rollout object in this process only.
# A rollout loaded, rebuilt, copied or received from elsewhere has none, and one whose steps were
# replaced or edited since no longer matches: their potentials come from the replay.
_RECORDED: dict[int, tuple[Any, type, str, str, list, list[float]]] = {}


def _played(steps: list[Step]) -> list:
    return [(id(s), s.error, s.tool_call if s.tool_call is None else (s.tool_call.name, s.tool_call.arguments))
            for s in steps]


def recorded_potentials(rollout: Rollout, task: TaskSpec, potentials: Any) -> list[float] | None:
    """The Φ recorded live for `rollout`, where `potentials` (a verifier's bound `potentials`) would
    compute them by replay: the same verifier class and version, the same task; else None."""
    entry = _RECORDED.get(id(rollout))
    verifier = getattr(potentials, "__self__", None)
    if (entry is None or entry[0]() is not rollout or verifier is None
            or getattr(potentials, "__func__", None) is not ReplayVerifier.potentials):
        return None
    _, kind, version, task_id, played, phi = entry
    if (type(verifier) is not kind or verifier.version != version or task.task_id != task_id
            or len(phi) != len(rollout.steps) + 1 or _played(rollout.steps) != played):
        return None
    return list(phi)


def calls_of(steps: list[Step]) -> list[ToolCall | None]:
    """The calls to replay, aligned with the steps: None where nothing reached a tool, the step was
    rolled back (an env fault or bug leaves the state as it was) or the runtime refused it before
    the world saw it (an unapproved call): a replay must never run what the live episode did not."""
    return [s.tool_call if reached_world(s.error) else None for s in steps]
