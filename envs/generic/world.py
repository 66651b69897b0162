"""The world of a YAML domain: a key-value state changed only by the domain's declared tools.

One `ToolEnv` subclass per domain, made when the domain loads. A tool call runs the tool's
preconditions in order (the first that fails refuses the call with the domain's error kind and
message: a `ToolError`, the state as it was, the attempt in the event log), then its effects
(set / add / append / remove on `$state` paths), then renders its result from the state.
Arguments arrive already checked against the tool's JSON schema by the runtime (envs/base.py).
An expression that cannot be evaluated inside a tool (a missing key no precondition guards) is
the domain's bug: it escapes as an `EvalError`, which the runtime reports as `env_bug` and rolls
back. So does a `finish_when` that cannot be judged on the state a call leaves (it is evaluated
inside the call too), and a task whose initial state it cannot judge is refused at reset."""

from __future__ import annotations

import copy
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

import jsonschema

from gymfoundry.envs.base import ToolEnv, ToolError
from gymfoundry.envs.errors import InvalidTask
from gymfoundry.envs.generic.expr import EvalError, apply_effect, budget, charge_size, evaluate, render, truth
from gymfoundry.envs.records import TaskSpec
from gymfoundry.envs.tools import ToolDecl

if TYPE_CHECKING:
    from gymfoundry.envs.generic.domain import Domain

_CLASSES: dict[str, type] = {}  # class name -> the env class of a loaded domain (for pickle and lookups)


class DomainEnv(ToolEnv):
    """The base of every YAML domain's env class (see `env_class`)."""

    domain: ClassVar[Domain]

    def initial_state(self, task: TaskSpec) -> dict[str, Any]:
        if not isinstance(task.initial_state, dict):
            raise InvalidTask(f"task {task.task_id}: initial_state is not a mapping")
        schema = self.domain.state_schema
        if schema is not None:  # a task made by hand or for another world is refused here, not by a tool
            error = jsonschema.exceptions.best_match(_state_validator(type(self)).iter_errors(task.initial_state))
            if error is not None:
                where = "/".join(str(p) for p in error.absolute_path) or "initial_state"
                raise InvalidTask(f"task {task.task_id}: initial_state is not a {self.family} world: "
                                  f"{where}: {error.message}")
        state = copy.deepcopy(task.initial_state)
        state["events"] = []
        try:  # `is_finished` runs outside every tool's boundary: it must be able to judge this state
            truth(self.domain.finish_when, {"state": state})
        except EvalError as exc:
            raise InvalidTask(f"task {task.task_id}: finish_when cannot be evaluated on its initial state: "
                              f"{exc}") from None
        return state

    def is_finished(self, state: dict[str, Any]) -> bool:
        return truth(self.domain.finish_when, {"state": state})


@lru_cache(maxsize=None)
def _state_validator(env_class: type) -> Any:
    """The compiled schema of a domain's initial states, once per env class."""
    return jsonschema.Draft202012Validator(env_class.domain.state_schema)


def run_tool(domain: Domain, name: str, state: dict[str, Any], args: dict[str, Any]) -> Any:
    """Run one call of the domain's tool `name` on `state` (changed in place); its result. The
    whole call has one budget of steps (envs.generic.expr.MAX_STEPS): a tool that loops is an
    EvalError, the domain's bug, rolled back by the runtime."""
    with budget():
        return _run_tool(domain, name, state, args)


def _run_tool(domain: Domain, name: str, state: dict[str, Any], args: dict[str, Any]) -> Any:
    tool = domain.tools[name]
    scope = {**{a: None for a in tool.args}, **args, "state": state}
    for pre in tool.preconditions:
        if not truth(pre.check, scope):
            raise ToolError(pre.error, render(pre.message, scope))
    for effect in tool.effects:
        apply_effect(effect, scope)
    if tool.result is None:
        return {}
    result = evaluate(tool.result, scope)
    charge_size(result)  # rendered to the agent as JSON: its size is charged before the copy
    return copy.deepcopy(result)


def _handler(name: str, decl: ToolDecl):
    def handler(self: DomainEnv, state: dict[str, Any], **args: Any) -> Any:
        events = state.setdefault("events", [])
        event = {"seq": len(events), "tool": name, "args": copy.deepcopy(args)}
        try:
            result = run_tool(self.domain, name, state, args)
            # `is_finished` judges the state after the call outside the tool's boundary: a finish_when
            # that fails on it is this call's env bug (rolled back), never an exception out of step()
            with budget():
                truth(self.domain.finish_when, {"state": state})
        except ToolError as exc:
            events.append({**event, "outcome": exc.kind})
            raise
        events.append({**event, "outcome": "ok"})
        return result

    handler.__name__ = handler.__qualname__ = f"tool_{name}"
    handler.__doc__ = decl.spec.description
    handler.__tool__ = decl
    return handler


def class_name(domain_name: str, suffix: str) -> str:
    return "".join(p.capitalize() for p in domain_name.split("_")) + suffix


def env_class(domain: Domain, profile: Any) -> type[DomainEnv]:
    """The env class of `domain`: its profile, and one `tool_<name>` handler per declared tool."""
    namespace: dict[str, Any] = {"family": domain.name, "domain": domain, "profile": profile,
                                 "__module__": __name__, "__doc__": f"The YAML domain {domain.name!r}: "
                                                                     f"{domain.description.strip()}"}
    for spec in profile.tools:
        decl = ToolDecl(spec, f"tool_{spec.name}", takes_event=False, hint=domain.tools[spec.name].hint)
        namespace[decl.handler] = _handler(spec.name, decl)
    name = class_name(domain.name, "Env")
    cls = type(name, (DomainEnv,), namespace)
    cls.__qualname__ = name
    return cls


def remember(cls: type) -> None:
    _CLASSES[cls.__name__] = cls


def __getattr__(name: str) -> type:  # envs.generic.world.<Name>Env, as pickle looks it up
    try:
        return _CLASSES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
