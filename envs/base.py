"""The environment protocol and the shared machinery of tool-using environments."""

from __future__ import annotations

import copy
import json
import pickle
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import jsonschema

from gymfoundry.envs.errors import ActionError, Boundary, EnvBug, EnvFault, ErrorKind, InvalidTask, ToolError, UnknownEnv
from gymfoundry.envs.parsing import parse_action, replay_call, storable_text
from gymfoundry.envs.profile import DomainProfile
from gymfoundry.envs.records import Step, TaskSpec, ToolCall, check_task, make_step
from gymfoundry.envs.timestep import OUTCOME, VERIFIER_ERROR, TimeStep
from gymfoundry.envs.tools import ToolDecl, checked_profile, declared_tools, render_hint

__all__ = ["AgentEnv", "EnvFault", "OutcomeFn", "ToolEnv", "ToolError", "copy_state", "render_error",
           "render_result"]

# Called at the end of an episode: (task, steps, final hidden state) -> (reward, outcome info).
OutcomeFn = Callable[[TaskSpec, list[Step], dict[str, Any]], tuple[float, dict[str, Any]]]


class AgentEnv(ABC):
    """reset / step / close, as in Gymnasium, with text observations and tool-call actions."""

    env_id: str = ""
    version: str = "0"

    @abstractmethod
    def reset(self, task: TaskSpec | dict | None = None, seed: int | None = None) -> TimeStep: ...

    @abstractmethod
    def step(self, action: ToolCall | dict | str) -> TimeStep: ...

    def close(self) -> None:
        pass

    @property
    @abstractmethod
    def available_tools(self) -> list[dict[str, Any]]:
        """Function schemas of the tools the agent may call in this episode."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """The full internal state, for verifiers and recorders; never shown to the agent."""

    def runtime_info(self) -> dict[str, Any]:
        """What the runtime guarantees for this episode (sandbox backend, limits); stored
        with the rollout."""
        return {}

    @property
    def unwrapped(self) -> AgentEnv:
        return self


class ToolEnv(AgentEnv):
    """A world whose actions are calls to declared tools.

    A family subclass declares its tools with `@tool` (envs/tools.py) on `tool_<name>` handlers
    and names its data-only `profile_yaml`; the profile is built from both when the class is
    defined (a YAML naming a tool or argument the code lacks is refused there). It provides
    `initial_state` and `is_finished`; tasks come from its `Family` (envs/family.py). A subclass
    may instead set a whole `profile` and plain `tool_<name>` methods. This class parses actions, enforces the task's allowed tools and the
    profile's argument schemas, turns every bad action into an error observation, and
    keeps the episode's own step list for the outcome function. What goes wrong in a step is
    attributed by the boundary it escaped (envs/errors.py): a crash inside a tool is `env_bug`,
    only an `EnvFault` is `env_fault`; both roll the state back and keep the action."""

    profile: ClassVar[DomainProfile]
    family: ClassVar[str]
    tools: ClassVar[tuple[ToolDecl, ...]] = ()
    profile_yaml: ClassVar[Any] = None  # a data-only profile beside the declared tools
    # A world whose initial state and tools read nothing but the task, the state and the call's
    # arguments (no clock, randomness, process or outside service): a live call that crashes is
    # undone by replaying the episode's earlier calls on a fresh initial state, instead of a copy
    # of the state made before every call. Leave False unless that holds.
    replayable: ClassVar[bool] = False
    # A world whose tools return only fresh plain JSON data (dicts, lists, str, int, float, bool,
    # None), so rendering a result cannot fail: a replay, which reads no result, renders none.
    # Leave False unless that holds (elsewhere a result that fails to render is an env bug, rolled
    # back in a replay as in a step).
    plain_results: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        decls = declared_tools(cls)
        if decls:
            cls.tools = tuple(decls)
            if cls.profile_yaml is not None:
                cls.profile = checked_profile(cls.profile_yaml, decls, cls.__name__)

    def __init__(self, outcome_fn: OutcomeFn | None = None, level: int = 2):
        self.outcome_fn = outcome_fn
        self.level = level
        self.task: TaskSpec | None = None
        self._state: dict[str, Any] = {}
        self._steps: list[Step] = []
        self._observation = ""
        self._done = False
        self._validators = _validators(type(self), self.profile)
        self._applied = None  # set by `start`

    # -- what a family provides -------------------------------------------------------
    @classmethod
    def generate_task(cls, seed: int, level: int = 2) -> TaskSpec:
        """The task of (seed, level) from the `Family` that declares this class, or the nearest
        base class of the same family (its package declares it on import: `Family.__post_init__`
        sets `declared_by`)."""
        declared = next((c.__dict__["declared_by"] for c in cls.__mro__
                         if "declared_by" in c.__dict__ and c.__dict__["declared_by"].name == cls.family), None)
        if declared is None:
            raise UnknownEnv(f"no family declares {cls.__name__} (family {getattr(cls, 'family', None)!r})")
        return declared.generate(seed, level)

    @abstractmethod
    def initial_state(self, task: TaskSpec) -> dict[str, Any]: ...

    def render_goal(self, task: TaskSpec) -> str:
        """The goal, and a line naming the declared tools."""
        return f"{task.goal}\n{render_hint(list(self.tools))}" if self.tools else task.goal

    @abstractmethod
    def is_finished(self, state: dict[str, Any]) -> bool: ...

    def event_fields(self, state: dict[str, Any]) -> dict[str, Any]:
        """What every event-log entry records about the state at the time of the call."""
        return {}

    def approves(self, call: ToolCall) -> bool:
        """Whether the world itself has approved `call` (a family whose agent asks for approval
        keeps the grants in its state). The permission guard asks this when it was given no
        approver; by default nothing is approved."""
        return False

    def event_args(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        """The arguments as the event log keeps them (a family may shorten large ones): a copy,
        so the log never shares a container with the call (flat arguments need only a new dict)."""
        if _SCALARS.issuperset(map(type, args.values())):  # every value's exact type a scalar
            return dict(args)
        return copy_state(args)

    # -- the protocol -----------------------------------------------------------------
    def reset(self, task: TaskSpec | dict | None = None, seed: int | None = None) -> TimeStep:
        """Start an episode. A task that is malformed, tampered with (its id is not its content
        hash) or for another family is refused with `InvalidTask` (a ValueError)."""
        if task is None:
            task = self.generate_task(seed if seed is not None else 0, self.level)
        self.start(check_task(task))
        return TimeStep(self._observation, info={"task_id": self.task.task_id})

    def start(self, task: TaskSpec) -> None:
        """What `reset` does once the task is checked: the family's initial state and goal. A
        verifier replaying an episode whose reset checked the task starts here (the check costs
        more than a short replay)."""
        if task.family != self.family:
            raise InvalidTask(f"task {task.task_id} is for family {task.family!r}, not {self.family!r}")
        try:  # the task is the only input here: what fails is its content, for this family
            state, goal = self.initial_state(task), self.render_goal(task)
        except InvalidTask:
            raise
        except Exception as exc:
            raise InvalidTask(f"task {task.task_id} does not fit family {self.family!r}: "
                              f"{type(exc).__name__}: {exc}") from exc
        self.task, self._state, self._steps, self._done = task, state, [], False
        self._observation = goal
        # a replayable world's live calls that ran on this state object and did not crash
        self._applied: tuple[dict[str, Any], list[ToolCall]] | None = (state, [])

    def step(self, action: ToolCall | dict | str) -> TimeStep:
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode is over; call reset()")
        info: dict[str, Any] = {"tool_call": None, "error": None, "thought": None, "env_fault": False,
                                "env_bug": False}
        observation = self._act(action, info)
        self._steps.append(make_step(
            index=len(self._steps), observation=self._observation,
            action_text=storable_text(action) if isinstance(action, str) else None,
            thought=info["thought"], tool_call=info["tool_call"], result=observation,
            error=info["error"]["kind"] if info["error"] else None))
        self._observation = observation
        terminated = self.is_finished(self._state)
        ts = TimeStep(observation, 0.0, terminated, False, info)
        if terminated:
            self._done = True
            if self.outcome_fn is not None:
                if self.defer_grading:
                    info["grade_pending"] = True
                else:
                    self.grade(ts)
        return ts

    # Set by the runtime's time limit (envs.wrappers.TimeLimit), which then calls `grade` itself on
    # the grader's own clock: grading is no part of the agent's step. Alone, an env grades in `step`.
    defer_grading = False

    def grade(self, ts: TimeStep) -> TimeStep:
        """The verdict on the episode that `ts` (the step that ended it) ended: its reward and
        `outcome`, or `verifier_error` where the grader raised (a grader bug is not the agent's failure)."""
        ts.info.pop("grade_pending", None)
        try:
            ts.reward, ts.info[OUTCOME] = self.outcome_fn(self.task, list(self._steps), self._final_state())
        except Exception as exc:
            ts.info[VERIFIER_ERROR] = f"{type(exc).__name__}: {exc}"
        return ts

    def _final_state(self) -> dict[str, Any]:
        """The state handed to the outcome function: a copy (`state()`), or the live state itself
        where copying buys nothing: the episode is over, `state()` is this class's plain copy, and
        the function belongs to a verifier whose class declares `reads_final_state_only = True`
        itself (its `terminal_reward` never changes the state it is given; a copy cost more than
        a short episode's checks)."""
        owner = getattr(self.outcome_fn, "__self__", None)
        if (type(self).state is ToolEnv.state and owner is not None
                and type(owner).__dict__.get("reads_final_state_only") is True):
            return self._state
        return self.state()

    def _act(self, action: ToolCall | dict | str, info: dict[str, Any]) -> str:
        """Parse, check and run one action; the observation. Errors are attributed by the
        boundary they escaped (envs.errors): the action's own checks, or the tool."""
        try:
            try:  # the agent-input boundary (envs.errors.boundary, written out: it runs every step)
                parsed = parse_action(action, self.task.budget.max_action_chars)
                info["tool_call"], info["thought"] = parsed.call, parsed.thought
                self._check_call(parsed.call)
            except ActionError:
                raise
            except Exception as exc:
                raise EnvBug(AGENT_INPUT_BOUNDARY, exc) from exc
            return self._run_tool(parsed.call)
        except (ActionError, ToolError) as exc:
            info["error"] = {"kind": exc.kind, "message": exc.message}
        except (EnvFault, EnvBug) as exc:
            info["error"] = {"kind": exc.kind, "message": str(exc)}
            if isinstance(exc, EnvBug):
                info["error"].update(where=exc.where, location=exc.location)
            info[exc.kind] = True
        return render_error(info["tool_call"], info["error"]["kind"], info["error"]["message"])

    def _run_tool(self, call: ToolCall, rollback: bool = True) -> str | None:
        """Run a checked call on the state; the rendered result. A crash (an EnvFault, or an
        EnvBug: anything else escaping the tool) restores the state as it was before the call:
        a failed call did nothing, so replays stay exact: from a copy made before the call or, in
        a `replayable` world, by replaying the calls that made the state. `rollback=False` (a
        replay, which rolls back its own way) leaves the state as the crash left it; in a world
        with `plain_results` it renders nothing (a replay reads no result) and returns None."""
        # the calls that made this very state object, where undoing by replay applies
        applied = (self._applied[1] if rollback and self.replayable and self._applied is not None
                   and self._applied[0] is self._state else None)
        before = copy_state(self._state) if rollback and applied is None else None
        try:  # the tool's boundary (envs.errors.boundary, written out: it runs every call)
            value = getattr(self, f"tool_{call.name}")(self._state, **call.arguments)
            result = render_result(call.name, value) if rollback or not self.plain_results else None
        except ToolError:
            if applied is not None:
                applied.append(call)  # a refusal keeps what the tool did
            raise
        except EnvFault:
            if rollback:
                self._state = before if applied is None else self._undone(applied)
            raise
        except Exception as exc:
            if rollback:
                self._state = before if applied is None else self._undone(applied)
            raise EnvBug(f"{TOOL_BOUNDARY} {call.name}", exc) from exc
        if applied is not None:
            applied.append(call)
        return result

    def _undone(self, applied: list[ToolCall]) -> dict[str, Any]:
        """A `replayable` world's state before the call that crashed: its initial state with the
        episode's calls that ran replayed by the class's own tools (not a tool an instance
        attribute replaces for one call, as fault injection does)."""
        state = self.initial_state(self.task)
        for call in applied:
            try:
                getattr(type(self), f"tool_{call.name}")(self, state, **call.arguments)
            except ToolError:
                pass
        self._applied = (state, applied)
        return state

    def replay(self, task: TaskSpec, calls: list[ToolCall | None], states: list[dict[str, Any]],
               after_each: Callable[[list[dict[str, Any]]], None] | None = None,
               starts: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """Replay `calls` from each of `states` (initial states of episodes of `task`, a task
        `reset` has accepted: it is not checked again), in one pass; the states after the calls
        (the list, updated in place). Each call is applied to each state as `step` applies it:
        parsed and checked (once for all states: that reads the task, never the state), run with
        the same crash rollback, and not at all once that state's episode has ended; a None call
        changes nothing. `after_each(states)` is called after each call. Unlike stepping, no
        observation, Step record or outcome is made: a verifier's replay needs only the states.
        `starts`: copies of `states` as given, which the replay only reads (made here if None)."""
        if type(self).step is not ToolEnv.step or type(self)._act is not ToolEnv._act:
            return self._replay_by_steps(task, calls, states, after_each)  # a world whose step is its own
        self.task, self._steps, self._done, self._applied = task, [], False, None
        done = [False] * len(states)
        # A crash is rolled back by replaying the calls before it from a copy of the start (a
        # replay is deterministic: that is what makes it a verifier's evidence), instead of
        # copying the state before every call as a live step must.
        starts = [copy_state(s) for s in states] if starts is None else starts
        applied: list[list[ToolCall]] = [[] for _ in states]
        for call in calls:
            if call is not None and not all(done):
                try:  # as in `_act`: refused (or an env bug) before any tool ran, so no state changed
                    call = replay_call(call, task.budget.max_action_chars)
                    self._check_call(call)
                except Exception:
                    call = None
                for k in range(len(states)) if call is not None else ():
                    if not done[k]:
                        self._state = states[k]
                        try:
                            self._run_tool(call, rollback=False)
                            applied[k].append(call)
                        except ToolError:  # a refusal keeps what the tool did, as in a step
                            applied[k].append(call)
                        except (EnvFault, EnvBug):
                            self._state = self._rebuilt(starts[k], applied[k])
                        states[k] = self._state
                        done[k] = self.is_finished(states[k])
            if after_each is not None:
                after_each(states)
        return states

    def _rebuilt(self, start: dict[str, Any], calls: list[ToolCall]) -> dict[str, Any]:
        """The state after `calls` (none of which crashed) applied to a copy of `start`."""
        self._state = copy_state(start)
        for call in calls:
            try:
                self._run_tool(call)
            except (ToolError, EnvFault, EnvBug):
                pass
        return self._state

    def _replay_by_steps(self, task, calls, states, after_each):
        """`replay` through `step` itself (for a subclass with a step of its own): state by state,
        keeping a copy after each call for `after_each`."""
        history: list[list[dict[str, Any]]] = []
        for k, state in enumerate(states):
            self.task, self._state, self._steps, self._done = task, state, [], False
            done, after = False, []
            for call in calls:
                if call is not None and not done:
                    done = self.step(call).terminated
                after.append(copy_state(self._state) if after_each is not None else None)
            states[k] = self._state
            history.append(after)
        for i in range(len(calls)) if after_each is not None else ():
            after_each([h[i] for h in history])
        return states

    def _check_call(self, call: ToolCall) -> None:
        spec = self.profile.tool(call.name)
        if spec is None or not hasattr(self, f"tool_{call.name}"):
            raise ActionError(ErrorKind.unknown_tool, f"unknown tool {call.name!r}; available: "
                                                      f"{', '.join(self.task.allowed_tools)}")
        if call.name not in self.task.allowed_tools:
            raise ActionError(ErrorKind.tool_not_allowed, f"tool {call.name!r} is not allowed in this task")
        problem = argument_problem(self._validators[call.name], call.arguments)
        if problem:
            raise ActionError(ErrorKind.invalid_arguments, f"{call.name}: {problem}")

    @property
    def available_tools(self) -> list[dict[str, Any]]:
        allowed = self.task.allowed_tools if self.task else None
        return self.profile.function_schemas(allowed)

    def state(self) -> dict[str, Any]:
        return copy_state(self._state)

    @property
    def steps(self) -> list[Step]:
        return list(self._steps)


_SCALARS = frozenset({str, int, float, bool, type(None)})
AGENT_INPUT_BOUNDARY, TOOL_BOUNDARY = Boundary.agent_input.value, Boundary.tool.value


def copy_state(value: Any) -> Any:
    """A deep copy, as `copy.deepcopy(value)` makes it, at a third of its cost: states are JSON
    data, which a pickle round trip copies in C (shared containers stay shared). A value pickle
    refuses is copied by deepcopy. Rollback copies the state before every call."""
    try:
        return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # not picklable (a lock, a lambda): deepcopy knows other ways, or raises
        return copy.deepcopy(value)


# JSON Schema counts 3.0 as an integer; a tool handed 3.0 would store floats where it counts units.
STRICT = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=(
    jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda checker, value: isinstance(value, int) and not isinstance(value, bool))))
_VALIDATORS: dict[type, tuple[DomainProfile, dict[str, Any]]] = {}


def _validators(env_class: type, profile: DomainProfile) -> dict[str, Any]:
    """Argument validators, compiled once per env class (envs are made per episode and per replay)."""
    cached = _VALIDATORS.get(env_class)
    if cached is None or cached[0] is not profile:
        cached = _VALIDATORS[env_class] = (profile, {t.name: STRICT(t.parameters) for t in profile.tools})
    return cached[1]


# Schema checks of tool arguments already seen: (id of the validator, arguments as JSON text) ->
# (validator, the problem or None). Validating costs more than the rest of a step, and a verifier
# replays the same calls on every hidden variant. The JSON text keeps the key order, and tells
# 1 from 1.0 and true, so equal texts are arguments the validator cannot tell apart.
_CHECKED: dict[tuple[int, str], tuple[Any, str | None]] = {}
_CHECKED_MAX = 50_000


def argument_problem(validator: Any, arguments: dict[str, Any]) -> str | None:
    """What is wrong with `arguments` under `validator` ("<where>: <message>"), or None."""
    fast = _FAST.get(id(validator))
    if fast is None or fast[0] is not validator:
        fast = _FAST[id(validator)] = (validator, accepts(validator.schema))
    if fast[1] is not None and fast[1](arguments):
        return None
    try:
        key = (id(validator), json.dumps(arguments, ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError):  # not plain JSON: checked, never remembered
        key = None
    hit = _CHECKED.get(key) if key is not None else None
    if hit is not None and hit[0] is validator:
        return hit[1]
    errors = sorted(validator.iter_errors(arguments), key=str)
    problem = None
    if errors:
        problem = f"{'/'.join(str(p) for p in errors[0].absolute_path) or 'arguments'}: {errors[0].message}"
    if key is not None:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED[key] = (validator, problem)
    return problem


# Validators -> a plain-Python check of their schema that says True only for arguments the schema
# accepts (validating with jsonschema costs more than the rest of a step); anything else, and every
# error message, comes from jsonschema itself.
_FAST: dict[int, tuple[Any, Callable[[dict[str, Any]], bool] | None]] = {}
_FAST_KEYS = {"type", "minLength", "maxLength", "minimum", "maximum", "enum", "description"}


def accepts(schema: Any) -> Callable[[dict[str, Any]], bool] | None:
    """For a flat object schema (scalar properties with the keywords of `_FAST_KEYS`, required,
    no additional properties): a check that is True only where STRICT finds no error; None for
    any other schema. Exact types only (a str or int subclass, a bool for an integer, is left to
    jsonschema), so the comparisons below mean what the keywords mean."""
    if (not isinstance(schema, dict) or set(schema) - {"type", "properties", "required", "additionalProperties"}
            or schema.get("type") != "object" or schema.get("additionalProperties") is not False):
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(type(r) is str for r in required):
        return None
    required = frozenset(required)
    checks = {}
    for name, prop in properties.items():
        if not isinstance(prop, dict) or set(prop) - _FAST_KEYS:
            return None
        kind = prop.get("type")
        if kind not in ("string", "integer", "number", "boolean"):
            return None
        if "enum" in prop and not all(type(e) is str for e in prop["enum"]):
            return None
        checks[name] = _scalar_check(kind, prop)

    def check(arguments: dict[str, Any]) -> bool:
        if type(arguments) is not dict or not arguments.keys() >= required:
            return False
        for key, value in arguments.items():
            ok = checks.get(key)
            if ok is None or not ok(value):
                return False
        return True

    return check


def _scalar_check(kind: str, prop: dict[str, Any]) -> Callable[[Any], bool]:
    types = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,)}[kind]
    # as in jsonschema: bounds apply to numbers, lengths to strings (and are ignored elsewhere)
    low, high = (prop.get("minimum"), prop.get("maximum")) if kind in ("integer", "number") else (None, None)
    shortest, longest = (prop.get("minLength"), prop.get("maxLength")) if kind == "string" else (None, None)
    allowed = prop.get("enum")

    def ok(value: Any) -> bool:
        if type(value) not in types:
            return False
        if (low is not None and not value >= low) or (high is not None and not value <= high):
            return False
        if (shortest is not None and len(value) < shortest) or (longest is not None and len(value) > longest):
            return False
        return allowed is None or value in allowed

    return ok


# json.dumps(value, sort_keys=True, ensure_ascii=True), its encoder made once (dumps makes one per call)
_RENDER = json.JSONEncoder(sort_keys=True, ensure_ascii=True).encode


def render_result(tool: str, result: Any) -> str:
    return _RENDER({"tool": tool, "ok": True, "result": result})


def render_error(call: ToolCall | None, kind: str, message: str) -> str:
    payload = {"tool": call.name if call else None, "ok": False, "error": {"type": kind, "message": message}}
    return _RENDER(payload)
