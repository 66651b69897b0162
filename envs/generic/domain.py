"""A domain file, read and checked: the pydantic models of the YAML (`Domain`), the checks of its
expressions against the grammar of envs/generic/expr.py (`read_domain(path)`), and the domains
loaded so far (`DOMAINS`). envs/generic/loader.py turns a file into a `Family`.

Every problem is a `FamilyError` naming the file and the place in it (`tools.book.effects[1]:
unknown op 'mul'`), never a traceback. The file format is documented in envs/generic/rooms.yaml
(the shipped `generic` domain) and in the family's documentation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import jsonschema
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gymfoundry.envs.errors import RESERVED
from gymfoundry.envs.family import FamilyError
from gymfoundry.envs.generic import expr
from gymfoundry.envs.profile import DomainProfile, ToolSpec
from gymfoundry.envs.records import FAMILY_NAME, LEVELS, ToolCategory

NAME = FAMILY_NAME
IDENT = r"^[A-Za-z_][A-Za-z0-9_]*$"
RUNTIME_ARGS = ("self", "state", "event")
# Names the language binds itself (envs/generic/expr.py): no argument or parameter may take one.
BOUND = ("state", "initial", "result", "item", "key", "index", "level")
MISTAKES = ("skip", "distractor", "stop")
INTERPRETER_DIR = str(Path(__file__).resolve().parent)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Precondition(_Strict):
    check: Any
    error: str = Field(pattern=IDENT)
    message: str


class ToolDef(_Strict):
    description: str = Field(min_length=1)
    category: ToolCategory
    hint: str | None = None
    args: dict[str, dict[str, Any]] = Field(default_factory=dict)  # name -> JSON schema
    optional: list[str] = Field(default_factory=list)
    preconditions: list[Precondition] = Field(default_factory=list)
    effects: list[Any] = Field(default_factory=list)
    result: Any = None

    def schema(self) -> dict[str, Any]:
        required = [a for a in self.args if a not in self.optional]
        return {"type": "object", "properties": dict(self.args), **({"required": required} if required else {}),
                "additionalProperties": False}


class Step(_Strict):
    """One call of a reference: arguments from goal-visible parameters and earlier bindings."""

    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    when: Any = None
    bind: dict[str, Any] = Field(default_factory=dict)  # name -> value read from $result
    distractors: dict[str, Any] = Field(default_factory=dict)  # argument -> list of wrong values
    thought: str | None = None


class GoalLine(_Strict):
    line: str
    when: str | None = None  # a $param flag: the line is shown when it is true


class Rule(_Strict):
    name: str = Field(pattern=IDENT)
    check: Any
    message: str
    when: Any = None


class VariantDef(_Strict):
    name: str = Field(pattern=IDENT)
    effects: list[Any]


class TaskTemplate(_Strict):
    weight: float = Field(1.0, gt=0)
    levels: dict[int, dict[str, Any]]
    params: dict[str, Any] = Field(default_factory=dict)
    state: dict[str, Any]
    then: dict[str, Any] = Field(default_factory=dict)
    goal: list[GoalLine] = Field(min_length=1)
    reference: list[Step] = Field(min_length=1)
    outcome: list[Rule] = Field(min_length=1)
    variants: list[VariantDef] = Field(default_factory=list)
    crafted: list[Step] = Field(default_factory=list)  # calls inserted before the reference's last one
    secrets: list[Any] = Field(default_factory=list)
    max_steps: Any = None

    @field_validator("goal", mode="before")
    @classmethod
    def _lines(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.splitlines()
        return [{"line": v} if isinstance(v, str) else v for v in value] if isinstance(value, list) else value

    def visible(self) -> set[str]:
        """The parameters the goal shows (its placeholders and its lines' flags)."""
        names = {expr.plain_param(p) or p for g in self.goal for p in expr.PLACEHOLDER.findall(g.line)}
        return {n.lstrip("$") for n in names} | {g.when.lstrip("$") for g in self.goal if g.when}


class PolicyDef(_Strict):
    mistake_rate: float = Field(0.2, ge=0, le=1)
    mistakes: list[Literal["skip", "distractor", "stop"]] = Field(default_factory=lambda: list(MISTAKES))
    final: Step  # the call that ends an episode early (giving up, out of turns)
    max_turns: int = Field(40, ge=1, le=500)


class Domain(_Strict):
    name: str = Field(pattern=NAME)
    version: int = Field(0, ge=0)
    generator_version: str = "1"
    description: str = Field(min_length=1)
    finish_when: Any
    compare: list[str] | None = None  # state keys a success must leave as the reference does
    state_schema: dict[str, Any] | None = None  # a JSON schema every task's initial state must meet
    tools: dict[str, ToolDef] = Field(min_length=1)
    tasks: dict[str, TaskTemplate] = Field(min_length=1)
    policy: PolicyDef
    profile: dict[str, Any] = Field(default_factory=dict)

    @property
    def levels(self) -> tuple[int, ...]:
        return tuple(sorted(next(iter(self.tasks.values())).levels))


def read_domain(path: Path) -> Domain:
    try:
        return _read_domain(path)
    except RecursionError:  # the YAML parser, or a check, recursing through the nesting
        raise FamilyError(f"{path}: nested too deeply to be read (lists or mappings inside each other)") from None


MAX_FILE_BYTES = 8 * 2 ** 20  # far more than any domain file; a larger one is refused unread


def domain_text(path: Path) -> str:
    """The file's text: a regular file (links followed) of at most MAX_FILE_BYTES, never a FIFO or
    a device, which could block or never end."""
    import stat

    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        raise FamilyError(f"{path}: not a regular file (a domain file is a plain YAML file)")
    with open(path, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise FamilyError(f"{path}: larger than {MAX_FILE_BYTES // 2 ** 20} MiB; no domain file is this large")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FamilyError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def _read_domain(path: Path) -> Domain:
    try:
        data = yaml.safe_load(domain_text(path))
    except OSError as exc:
        raise FamilyError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise FamilyError(f"{path}: not YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    if _too_large(data):
        raise FamilyError(f"{path}: too large: its values (aliases expanded) number more than {MAX_VALUES}")
    if not isinstance(data, dict):
        raise FamilyError(f"{path}: a domain file is a mapping (name, description, tools, tasks, ...), "
                          f"not {type(data).__name__}")
    try:
        domain = Domain.model_validate(data)
    except ValidationError as exc:
        raise FamilyError(f"{path}: " + "; ".join(f"{where(e['loc']) or 'top level'}: {_message(e)}"
                                                  for e in exc.errors()[:4])) from None
    problems = domain_problems(domain)
    if problems:
        more = f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""
        raise FamilyError(f"{path}: " + "; ".join(problems[:4]) + more)
    return domain


MAX_VALUES = 100_000


def _too_large(data: Any) -> bool:
    """Whether the file's values, with YAML aliases expanded, number more than MAX_VALUES (a
    file of nested aliases would otherwise take the checks exponential time)."""
    budget, stack = MAX_VALUES, [data]
    while stack:
        value = stack.pop()
        budget -= 1
        if budget < 0:
            return True
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def where(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(error: dict) -> str:
    if error["type"] == "missing":
        return "missing field"
    if error["type"] == "extra_forbidden":
        return "unknown field"
    return error["msg"]


def domain_problems(domain: Domain) -> list[str]:
    problems: list[str] = []
    for name, tool in domain.tools.items():
        problems += _tool_problems(name, tool)
    problems += expr.check(domain.finish_when, "finish_when", {"state"}, predicate=True)
    if domain.state_schema is not None:
        try:
            jsonschema.Draft202012Validator.check_schema(domain.state_schema)
        except jsonschema.SchemaError as exc:
            problems.append(f"state_schema: not a JSON schema: {exc.message}")
    levels = None
    for tname, template in domain.tasks.items():
        if levels is None:
            levels = set(template.levels)
        problems += _template_problems(domain, tname, template, levels)
    final = domain.policy.final
    problems += _call_problems(domain, final, "policy.final", set())
    if final.tool in domain.tools and domain.tools[final.tool].category != ToolCategory.irreversible:
        problems.append(f"policy.final: {final.tool!r} must be an irreversible tool (the one that ends an episode)")
    problems += _profile_problems(domain)
    return problems


def _tool_problems(name: str, tool: ToolDef) -> list[str]:
    at = f"tools.{name}"
    problems = [] if expr.NAME.fullmatch(name) else [f"{at}: a tool name must be an identifier"]
    for arg, schema in tool.args.items():
        if not expr.NAME.fullmatch(arg) or arg in RUNTIME_ARGS + BOUND:
            problems.append(f"{at}.args.{arg}: an argument name must be an identifier other than "
                            f"{', '.join(sorted(set(RUNTIME_ARGS + BOUND)))}")
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            problems.append(f"{at}.args.{arg}: not a JSON schema: {exc.message}")
    problems += [f"{at}.optional: {a!r} is not an argument" for a in tool.optional if a not in tool.args]
    names = set(tool.args) | {"state"}
    for i, pre in enumerate(tool.preconditions):
        problems += expr.check(pre.check, f"{at}.preconditions[{i}].check", names, predicate=True)
        problems += expr.check(pre.message, f"{at}.preconditions[{i}].message", names)
        if pre.error in RESERVED:
            problems.append(f"{at}.preconditions[{i}].error: {pre.error!r} is a runtime error kind, not a refusal")
    for i, effect in enumerate(tool.effects):
        problems += expr.check_effect(effect, f"{at}.effects[{i}]", names)
    return problems + expr.check(tool.result, f"{at}.result", names)


def _template_problems(domain: Domain, tname: str, t: TaskTemplate, levels: set[int]) -> list[str]:
    at = f"tasks.{tname}"
    problems = []
    if set(t.levels) != levels or not levels <= set(LEVELS):
        problems.append(f"{at}.levels: every template covers the same levels, a subset of 1-5 "
                        f"(here {sorted(t.levels)}, first template {sorted(levels)})")
    knobs = {k for values in t.levels.values() for k in values}
    problems += [f"{at}.levels: knob {k!r} must be an identifier other than {', '.join(BOUND)}"
                 for k in sorted(knobs) if k in BOUND or not expr.NAME.fullmatch(str(k))]
    for level, values in t.levels.items():
        missing = sorted(knobs - set(values))
        if missing:
            problems.append(f"{at}.levels.{level}: missing knob {missing[0]!r} (every level sets every knob)")
        problems += [p for k, v in values.items() for p in expr.check(v, f"{at}.levels.{level}.{k}", set())]
    names = knobs | {"level"}
    for section in ("params", "state", "then"):
        if section == "state":
            problems += expr.check(t.state, f"{at}.state", names, draws=True)
            names = names | {"state"}
            continue
        for pname, value in getattr(t, section).items():
            if pname in names or pname in BOUND or not expr.NAME.fullmatch(pname):
                problems.append(f"{at}.{section}.{pname}: a parameter name must be a new identifier")
            problems += expr.check(value, f"{at}.{section}.{pname}", names, draws=True)
            names = names | {pname}
    params = names - {"state"}
    for i, g in enumerate(t.goal):
        for p in expr.PLACEHOLDER.findall(g.line):
            if expr.plain_param(p) not in params:
                problems.append(f"{at}.goal[{i}]: placeholder {{{p}}} must name a parameter ($name, no path), "
                                "so what the goal shows can be read back")
        if g.when is not None and expr.plain_param(g.when) not in params:
            problems.append(f"{at}.goal[{i}].when: must be a $param flag, not {g.when!r}")
    visible = t.visible()
    bound: set[str] = set()
    for i, step in enumerate(t.reference):
        problems += _call_problems(domain, step, f"{at}.reference[{i}]", visible | bound)
        bound |= set(step.bind)
    for i, step in enumerate(t.crafted):
        problems += _call_problems(domain, step, f"{at}.crafted[{i}]", params)
    if t.reference and t.reference[-1].tool in domain.tools and t.reference[-1].when is not None:
        problems.append(f"{at}.reference[{len(t.reference) - 1}]: the last call ends the episode; it takes no `when`")
    rule_names = [r.name for r in t.outcome]
    if len(set(rule_names)) != len(rule_names):
        problems.append(f"{at}.outcome: rule names must be distinct, not {rule_names}")
    judged = names | {"initial"}
    for i, rule in enumerate(t.outcome):
        problems += expr.check(rule.check, f"{at}.outcome[{i}].check", judged, predicate=True)
        problems += expr.check(rule.message, f"{at}.outcome[{i}].message", judged)
        if rule.when is not None:
            problems += expr.check(rule.when, f"{at}.outcome[{i}].when", params, predicate=True)
    for i, variant in enumerate(t.variants):
        for j, effect in enumerate(variant.effects):
            problems += expr.check_effect(effect, f"{at}.variants[{i}].effects[{j}]", names)
    for i, secret in enumerate(t.secrets):
        problems += expr.check(secret, f"{at}.secrets[{i}]", names)
    if t.max_steps is not None:
        problems += expr.check(t.max_steps, f"{at}.max_steps", params)
    return problems


def _call_problems(domain: Domain, step: Step, at: str, names: set[str]) -> list[str]:
    tool = domain.tools.get(step.tool)
    if tool is None:
        return [f"{at}.tool: unknown tool {step.tool!r} (tools: {', '.join(domain.tools)})"]
    problems = [f"{at}.args.{a}: {step.tool} takes no argument {a!r}" for a in step.args if a not in tool.args]
    problems += [f"{at}.args: missing argument {a!r} of {step.tool}" for a in tool.args
                 if a not in tool.optional and a not in step.args]
    problems += [p for a, v in step.args.items() for p in expr.check(v, f"{at}.args.{a}", names)]
    if step.when is not None:
        problems += expr.check(step.when, f"{at}.when", names, predicate=True)
    problems += [p for a, v in step.bind.items() for p in expr.check(v, f"{at}.bind.{a}", names | {"result"})]
    problems += [f"{at}.distractors.{a}: {step.tool} takes no argument {a!r}" for a in step.distractors
                 if a not in tool.args]
    problems += [p for a, v in step.distractors.items() for p in expr.check(v, f"{at}.distractors.{a}", names)]
    return problems


def _profile_problems(domain: Domain) -> list[str]:
    try:
        profile_of(domain)
    except ValidationError as exc:
        return [f"profile.{where(e['loc']) or ''}: {_message(e)}".replace("profile.tools", "tools")
                for e in exc.errors()[:3]]
    except ValueError as exc:
        return [f"profile: {exc}"]
    problems = []
    for tool, arguments in (domain.profile.get("grounded_arguments") or {}).items():
        problems += [f"profile.grounded_arguments.{tool}: {a!r} is not an argument of {tool}"
                     for a in arguments or [] if a not in domain.tools[tool].args]
    for tool, rule in (domain.profile.get("undoes") or {}).items():
        if isinstance(rule, dict) and rule.get("argument") not in domain.tools[tool].args:
            problems.append(f"profile.undoes.{tool}.argument: {rule.get('argument')!r} is not an argument of {tool}")
    return problems


def profile_of(domain: Domain) -> DomainProfile:
    tools = [ToolSpec(name=n, description=" ".join(t.description.split()), category=t.category,
                      parameters=t.schema()) for n, t in domain.tools.items()]
    data = {"outcome_rules": ["completed", "no_side_effects"], **domain.profile}
    return DomainProfile.model_validate({"name": domain.name, "description": domain.description.strip(),
                                         **data, "tools": [t.model_dump() for t in tools]})


DOMAINS: dict[str, tuple[Domain, Path]] = {}  # family name -> (its domain, its file)


def json_ready(value: Any) -> Any:
    """A value as JSON keeps it (what the hidden facts store)."""
    return json.loads(json.dumps(value))
