"""Tools declared once: `@tool(category)` on an env's `tool_<name>` handler is the whole
declaration. The name comes from the method, the description from its docstring, the JSON-schema
arguments from its typed signature (`Annotated[str, Field(max_length=32)]` constraints and
descriptions survive), and the call is written to the state's event log with its outcome.

A handler takes the state, optionally `event` (the log entry of this call, to add what the
verifier should see), then the agent's arguments:

    @tool(ToolCategory.read)
    def tool_get_stock(self, state, sku: Annotated[str, Field(min_length=1, max_length=32)]):
        \"\"\"Units of an item currently available for reservation.\"\"\"

The event log (`state["events"]`): one entry per call that reached a handler, `{"seq", "tool",
"args", "outcome"}` plus the env's `event_fields(state)` at call time and what the handler added;
`outcome` is "ok", the refusal's kind, or env_fault. Verifiers read refused attempts there."""

from __future__ import annotations

import functools
import inspect
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable

import yaml
from pydantic import TypeAdapter

from gymfoundry.envs.errors import EnvFault, ErrorKind, ToolError
from gymfoundry.envs.profile import DomainProfile, ToolSpec
from gymfoundry.envs.records import ToolCategory

PREFIX = "tool_"
# Parameters of a handler that are not the agent's arguments.
RUNTIME_PARAMS = ("self", "state", "event")
HINT_HEAD = 'Call one tool per turn as JSON: {"name": <tool>, "arguments": {...}}.'


@dataclass(frozen=True)
class ToolDecl:
    """What `@tool` declares about one handler."""

    spec: ToolSpec
    handler: str  # the method's name
    takes_event: bool
    hint: str | None = None  # a few words after the tool's name in the goal's tool hint

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def arguments(self) -> list[str]:
        return list(self.spec.parameters.get("properties", {}))


def tool(category: ToolCategory | str, *, hint: str | None = None) -> Callable[[Callable], Callable]:
    """Declare the decorated `tool_<name>` method as the tool `<name>`."""
    category = ToolCategory(category)

    def declare(handler: Callable) -> Callable:
        if not handler.__name__.startswith(PREFIX) or handler.__name__ == PREFIX:
            raise TypeError(f"@tool handler {handler.__qualname__} must be named {PREFIX}<tool name>")
        name = handler.__name__.removeprefix(PREFIX)
        doc = inspect.getdoc(handler)
        if not doc:
            raise TypeError(f"@tool {handler.__qualname__} needs a docstring: it is the tool's description")
        params = list(inspect.signature(handler).parameters)
        if params[:2] != ["self", "state"]:
            raise TypeError(f"@tool {handler.__qualname__} must take (self, state, ...), not ({', '.join(params)})")
        spec = ToolSpec(name=name, description=" ".join(doc.split()), category=category,
                        parameters=arguments_schema(handler))
        decl = ToolDecl(spec, handler.__name__, takes_event="event" in params, hint=hint)
        wrapper = _logged(handler, decl)
        wrapper.__tool__ = decl
        return wrapper

    return declare


def declared_tools(env_class: type) -> list[ToolDecl]:
    """The class's tools in declaration order (a subclass's redefinition keeps the base's place)."""
    found: dict[str, ToolDecl] = {}
    for klass in reversed(env_class.__mro__):
        for attr, value in vars(klass).items():
            decl = getattr(value, "__tool__", None)
            if isinstance(decl, ToolDecl) and attr == decl.handler:
                found[decl.name] = decl
    return list(found.values())


def render_hint(decls: list[ToolDecl]) -> str:
    """The goal's last line: how to call, and the tools (with their hints)."""
    names = [f"{d.name} ({d.hint})" if d.hint else d.name for d in decls]
    return f"{HINT_HEAD} Tools: {', '.join(names)}."


# -- schemas from signatures ------------------------------------------------------------------
def arguments_schema(handler: Callable) -> dict[str, Any]:
    """The JSON schema of a handler's arguments: one property per typed parameter, in order;
    required unless it has a default; `X | None = None` is an optional X (JSON null is refused)."""
    hints = typing.get_type_hints(handler, include_extras=True)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(handler).parameters.items():
        if name in RUNTIME_PARAMS:
            continue
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise TypeError(f"@tool {handler.__qualname__}: *{name} cannot be a tool argument")
        if name not in hints:
            raise TypeError(f"@tool {handler.__qualname__}: argument {name!r} needs a type annotation")
        annotation = hints[name]
        if param.default is param.empty:
            required.append(name)
        elif param.default is None:
            annotation = _without_none(annotation)
        properties[name] = _tidy(TypeAdapter(annotation).json_schema())
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    schema["additionalProperties"] = False
    return schema


def _without_none(annotation: Any) -> Any:
    """`Annotated[X | None, ...]` or `X | None` -> X (with the Annotated metadata kept)."""
    if typing.get_origin(annotation) is Annotated:
        inner, *meta = typing.get_args(annotation)
        return Annotated[(_without_none(inner), *meta)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]
    return annotation


def _tidy(schema: Any) -> Any:
    """Pydantic's schema without titles, `type` first, each lower bound before its upper bound and
    `description` last (as a person writes it; the rendered tools are prompt text, so the order is
    kept stable)."""
    if isinstance(schema, list):
        return [_tidy(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    keys = [k for k in schema if k not in ("title", "type", "description")]
    for upper in [k for k in keys if k.startswith("max") and "min" + k[3:] in keys]:
        keys.remove(upper)
        keys.insert(keys.index("min" + upper[3:]) + 1, upper)
    body = {k: _tidy(schema[k]) for k in keys}
    head = {"type": schema["type"]} if "type" in schema else {}
    tail = {"description": schema["description"]} if "description" in schema else {}
    return {**head, **body, **tail}


# -- the event log ----------------------------------------------------------------------------
def _logged(handler: Callable, decl: ToolDecl) -> Callable:
    @functools.wraps(handler)
    def wrapper(self, state: dict[str, Any], **args: Any) -> Any:
        events = state.setdefault("events", [])
        event = {"seq": len(events), "tool": decl.name, "args": self.event_args(decl.name, args),
                 **self.event_fields(state)}
        try:
            result = handler(self, state, event, **args) if decl.takes_event else handler(self, state, **args)
        except ToolError as exc:
            events.append({**event, "outcome": exc.kind})
            raise
        except EnvFault:  # the runtime rolls the state back; kept for a caller of the handler itself
            events.append({**event, "outcome": ErrorKind.env_fault.value})
            raise
        events.append({**event, "outcome": "ok"})
        return result

    return wrapper


# -- the profile, checked against the code ----------------------------------------------------
class ProfileMismatch(ValueError):
    """A profile YAML that says something about tools the code does not declare."""


def checked_profile(path: str | Path, decls: list[ToolDecl], owner: str) -> DomainProfile:
    """The profile of `owner` (an env class): the YAML's data with the declared tools. A YAML may
    list `tools:` only as the code declares them; every tool and argument it names must exist."""
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    where = f"{path}"
    declared = {d.name: d for d in decls}
    problems = _listed_tools(data.get("tools"), declared, owner) if "tools" in data else []
    problems += _named_arguments(data, declared, owner)
    if problems:
        raise ProfileMismatch(f"{where} does not match {owner}: " + "; ".join(problems))
    try:
        return DomainProfile.model_validate({**data, "tools": [d.spec.model_dump() for d in decls]})
    except ValueError as exc:
        raise ProfileMismatch(f"{where}: {exc}") from None


def _listed_tools(listed: Any, declared: dict[str, ToolDecl], owner: str) -> list[str]:
    if not isinstance(listed, list):
        return ["`tools:` must be a list of tool entries (or left out: the code declares the tools)"]
    entries = {t.get("name"): t for t in listed if isinstance(t, dict)}
    problems = [f"tool {n!r} is listed but {owner} declares no @tool {PREFIX}{n}" for n in entries
                if n not in declared]
    problems += [f"@tool {n!r} of {owner} is missing from `tools:`" for n in declared if n not in entries]
    for name in entries.keys() & declared.keys():
        code = declared[name].spec.model_dump(mode="json")
        for key, value in entries[name].items():
            if key != "name" and code.get(key, value) != value:
                problems.append(f"tool {name!r}: {key} is {value!r} in the profile, {code[key]!r} in the code")
    return problems


def _named_arguments(data: dict[str, Any], declared: dict[str, ToolDecl], owner: str) -> list[str]:
    """`grounded_arguments` and `undoes` name tools and their arguments: each must exist."""
    problems = []

    def check(section: str, tool: Any, argument: Any = None) -> None:
        if tool not in declared:
            problems.append(f"{section} names tool {tool!r}, which {owner} does not declare "
                            f"(declared: {', '.join(declared)})")
        elif argument is not None and argument not in declared[tool].arguments:
            problems.append(f"{section} names argument {argument!r}, not an argument of {tool} "
                            f"(its arguments: {', '.join(declared[tool].arguments) or 'none'})")

    for tool_name, arguments in (data.get("grounded_arguments") or {}).items():
        check(f"grounded_arguments.{tool_name}", tool_name)
        for argument in arguments or []:
            check(f"grounded_arguments.{tool_name}", tool_name, argument)
    for tool_name, rule in (data.get("undoes") or {}).items():
        rule = rule if isinstance(rule, dict) else {}
        check(f"undoes.{tool_name}", tool_name, rule.get("argument"))
        check(f"undoes.{tool_name}.reverts", rule.get("reverts"))
        source, _, field = str(rule.get("matches", "")).partition(".")
        if source == "arguments":
            check(f"undoes.{tool_name}.matches", rule.get("reverts"), field)
    return problems
