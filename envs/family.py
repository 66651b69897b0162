"""A family declared once: `FAMILY = Family(...)` in the family's package.

The spec names the env class (whose `@tool` handlers and data-only profile YAML make the
profile), the generator, the typed hidden facts the generator hands its verifier, the verifier
and the scripted policy ("module:attr" references are imported when first needed: an env's
world never imports a verifier; only the family's own `verifier.py` may import `verifiers`, see
tests/test_layering.py), and the folders the sandbox hides. Found without a central list
(envs/discovery.py) and registered as `gymfoundry/<name>-v<version>`.

It also assembles the family's tasks, so every generator gets the same seeded RNG, content-hashed
ids, source, template id, budget and difficulty, and its facts are validated as it builds them:

    def generate(family: Family, seed: int, level: int) -> TaskSpec:
        rng = family.rng(seed, level)
        ...
        return family.task(seed=seed, level=level, template_id=family.template_id(...), goal=...,
                           initial_state=..., reference=[...], facts=MyFacts(...), max_steps=12)
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from gymfoundry.envs.errors import InvalidTask
from gymfoundry.envs.records import Budget, Difficulty, Hidden, Source, TaskSpec, ToolCall, _fields, content_hash

if TYPE_CHECKING:
    from gymfoundry.envs.base import ToolEnv

LEVELS = (1, 2, 3, 4, 5)


class HiddenFacts(BaseModel):
    """What a generator tells its verifier about a task (`task.hidden.checks`), one model per
    family. Strict: a fact of the wrong type or an unknown key is an error, not a coercion."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class FamilyError(ValueError):
    """A family that cannot be declared, discovered or loaded as written."""


@dataclass(frozen=True)
class Family:
    name: str
    env: type[ToolEnv]
    generator: Callable[[Family, int, int], TaskSpec]
    generator_version: str
    facts: type[HiddenFacts]
    verifier: str | type
    scripted_policy: str | type | None = None
    version: int = 0
    levels: tuple[int, ...] = LEVELS
    # Folders whose files no sandbox may show (templates, hidden tests, graders); by default the
    # family's own package and its verifier's.
    masked: tuple[str, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # registry kwargs for the env constructor

    def __post_init__(self) -> None:
        from gymfoundry.envs.base import ToolEnv

        if not (isinstance(self.env, type) and issubclass(self.env, ToolEnv)):
            raise FamilyError(f"family {self.name!r}: env must be a ToolEnv subclass, not {self.env!r}")
        if self.env.family != self.name:
            raise FamilyError(f"family {self.name!r}: {self.env.__name__}.family is {self.env.family!r}")
        if not self.env.tools:
            raise FamilyError(f"family {self.name!r}: {self.env.__name__} declares no @tool handlers")
        if not (isinstance(self.facts, type) and issubclass(self.facts, HiddenFacts)):
            raise FamilyError(f"family {self.name!r}: facts must be a HiddenFacts subclass, not {self.facts!r}")
        if not self.levels or any(level not in LEVELS for level in self.levels):
            raise FamilyError(f"family {self.name!r}: levels must be a non-empty subset of {LEVELS}")

    # -- what the family is -------------------------------------------------------------
    @property
    def env_id(self) -> str:
        return f"gymfoundry/{self.name}-v{self.version}"

    @property
    def profile(self):
        return self.env.profile

    @property
    def tool_names(self) -> list[str]:
        return [d.name for d in self.env.tools]

    def masked_dirs(self) -> list[str]:
        if self.masked is not None:
            return [str(Path(d).resolve()) for d in self.masked]
        out = [_module_dir(self.env.__module__)]
        if isinstance(self.verifier, str):
            out.append(_module_dir(self.verifier.partition(":")[0]))
        elif isinstance(self.verifier, type):
            out.append(_module_dir(self.verifier.__module__))
        return [d for d in out if d]

    # -- tasks --------------------------------------------------------------------------
    def generate(self, seed: int, level: int = 2) -> TaskSpec:
        """The task of (seed, level): a pure function of them and the generator's version."""
        if level not in self.levels:
            raise ValueError(f"level must be {min(self.levels)}..{max(self.levels)}, not {level!r}")
        return self.generator(self, seed, level)

    def rng(self, seed: int, level: int) -> random.Random:
        return random.Random(int(content_hash([self.name, self.generator_version, seed, level]), 16))

    def template_id(self, *parts: Any) -> str:
        """A template group id hashed from what makes tasks variations of one another."""
        return f"{self.name}-" + content_hash([self.name, *parts], 12)

    def task(self, *, seed: int, level: int, template_id: str, goal: str, initial_state: dict[str, Any],
             reference: Sequence[ToolCall], facts: HiddenFacts | dict[str, Any], max_steps: int,
             secrets: Sequence[str] = (), features: dict[str, float] | None = None,
             budget: dict[str, Any] | None = None) -> TaskSpec:
        """A generated task; the reference calls get ids `ref-<i>`, every declared tool is allowed."""
        checked = self.read_facts(facts, f"a {self.name} task being built (seed {seed}, level {level})")
        return TaskSpec(
            family=self.name, env_id=self.env_id,
            source=Source(generator=self.name, version=self.generator_version, seed=seed),
            template_id=template_id, goal=goal, initial_state=initial_state, allowed_tools=self.tool_names,
            budget=Budget(max_steps=max_steps, max_tool_calls=max_steps, **(budget or {})),
            difficulty=Difficulty(level=level, features=features or {}),
            hidden=Hidden(reference=[c.model_copy(update={"id": f"ref-{i}"}) for i, c in enumerate(reference)],
                          checks=checked.model_dump(mode="json"), secrets=list(secrets)))

    def facts_of(self, task: TaskSpec) -> HiddenFacts:
        """The task's hidden facts, validated: what a verifier reads instead of the raw dict."""
        return self.read_facts(task.hidden.checks, f"task {task.task_id}")

    def read_facts(self, facts: HiddenFacts | dict[str, Any], what: str) -> HiddenFacts:
        if isinstance(facts, self.facts):
            return facts
        if isinstance(facts, BaseModel):
            facts = facts.model_dump(mode="json")
        try:
            return self.facts.model_validate(facts)
        except ValidationError as exc:
            raise InvalidTask(f"{what}: hidden.checks are not {self.facts.__name__}: {_fields(exc)}") from None


def _module_dir(module: str) -> str | None:
    """The folder of a module's package, found without importing the module itself."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    return str(Path(spec.origin).resolve().parent)


# -- the families known to this process -------------------------------------------------------
_FAMILIES: dict[str, Family] = {}


def add(fam: Family) -> None:
    """Register a family (and its env id). A second family of the same name is refused."""
    from gymfoundry.envs.registry import register

    if not isinstance(fam, Family):
        raise FamilyError(f"expected a Family, got {type(fam).__name__}")
    known = _FAMILIES.get(fam.name)
    if known is not None and known is not fam:
        raise FamilyError(f"family {fam.name!r} is declared twice: by {known.env.__module__} and "
                          f"{fam.env.__module__}")
    _FAMILIES[fam.name] = fam
    register(fam.env_id, fam.env, verifier=fam.verifier, scripted_policy=fam.scripted_policy, **fam.extra)


def family(name: str) -> Family:
    from gymfoundry.envs.registry import UnknownEnv, unknown_message

    fam = _FAMILIES.get(name) if isinstance(name, str) else None
    if fam is None:
        raise UnknownEnv(unknown_message(f"no family {name!r}", name))
    return fam


def families() -> list[Family]:
    return [_FAMILIES[n] for n in sorted(_FAMILIES)]


def masked_dirs() -> list[str]:
    """Every folder some family asks the sandbox to hide."""
    return sorted({d for fam in families() for d in fam.masked_dirs()})
