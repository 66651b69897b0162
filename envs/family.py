"""A family declared once: `FAMILY = Family(...)` in the family's package; the one handle every
stage speaks.

The spec names the env class (whose `@tool` handlers and data-only profile YAML make the
profile), the generator, the typed hidden facts the generator hands its verifier, the verifier
class and the scripted policy class (the family's package imports both: they live in its folder),
and the folders the sandbox hides. Found without a central list (envs/discovery.py, above this
module) and known as `gymfoundry/<name>-v<version>`.

The handle makes the env (`fam.make()`), holds the verifier (`fam.verifier`, the class;
`fam.outcome_verifier`, the instance built once) and the scripted policy (`fam.scripted_policy`),
and gives the tool schemas (`fam.tool_schemas()`). Resolve it once (`family(name)` or
`family(task.env_id)`) and pass it on.

Lookups (`family`, `families`, `masked_dirs`) discover the families on first use: the package
`gymfoundry.envs` installs discovery as the finder (`find_with`) and loads no family at import.

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
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import gymnasium
from pydantic import BaseModel, ConfigDict, ValidationError

from gymfoundry.envs.base import AgentEnv, ToolEnv
from gymfoundry.envs.errors import InvalidTask, UnknownEnv
from gymfoundry.envs.records import (ENV_ID, FAMILY_NAME, LEVELS, Budget, Difficulty, Hidden, Source, TaskSpec, ToolCall,
                                     _fields, content_hash)


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
    verifier: type | None
    scripted_policy: type | None = None
    version: int = 0
    levels: tuple[int, ...] = LEVELS
    # Folders whose files no sandbox may show (templates, hidden tests, graders); by default the
    # family's own package, which holds its verifier.
    masked: tuple[str, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keyword arguments for the env constructor

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.match(FAMILY_NAME, self.name):
            raise FamilyError(f"family name {self.name!r} must match {FAMILY_NAME}")
        if not (isinstance(self.env, type) and issubclass(self.env, ToolEnv)):
            raise FamilyError(f"family {self.name!r}: env must be a ToolEnv subclass, not {self.env!r}")
        if self.env.family != self.name:
            raise FamilyError(f"family {self.name!r}: {self.env.__name__}.family is {self.env.family!r}")
        if not self.env.tools:
            raise FamilyError(f"family {self.name!r}: {self.env.__name__} declares no @tool handlers")
        if not (isinstance(self.facts, type) and issubclass(self.facts, HiddenFacts)):
            raise FamilyError(f"family {self.name!r}: facts must be a HiddenFacts subclass, not {self.facts!r}")
        for role in ("verifier", "scripted_policy"):
            value = getattr(self, role)
            if value is not None and not isinstance(value, type):
                raise FamilyError(f"family {self.name!r}: {role} must be a class, not {value!r}")
        if not self.levels or any(level not in LEVELS for level in self.levels):
            raise FamilyError(f"family {self.name!r}: levels must be a non-empty subset of {LEVELS}")
        self.env.declared_by = self  # the env class's tasks come from here (ToolEnv.generate_task)

    # -- what the family is -------------------------------------------------------------
    @property
    def env_id(self) -> str:
        return f"gymfoundry/{self.name}-v{self.version}"

    @property
    def env_version(self) -> str:
        """The version rollouts record (`Rollout.env_version`)."""
        return str(self.version)

    @property
    def profile(self):
        return self.env.profile

    @property
    def tool_names(self) -> list[str]:
        return [d.name for d in self.env.tools]

    def tool_schemas(self, allowed: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The function schemas of the family's tools (those in `allowed`, when given)."""
        return self.profile.function_schemas(None if allowed is None else list(allowed))

    def masked_dirs(self) -> list[str]:
        if self.masked is not None:
            return [str(Path(d).resolve()) for d in self.masked]
        out = {_module_dir(c.__module__) for c in (self.env, self.verifier) if c is not None}
        return sorted(d for d in out if d)

    # -- what the family makes ----------------------------------------------------------
    def make(self, *, verified: bool = True, **kwargs: Any) -> AgentEnv:
        """A new env. With `verified`, its end-of-episode reward comes from the outcome verifier
        (1.0 on success, else 0.0)."""
        if verified and self.verifier is not None and "outcome_fn" not in kwargs:
            kwargs["outcome_fn"] = self.outcome_verifier.terminal_reward
        env = self.env(**{**self.extra, **kwargs})
        env.env_id, env.version = self.env_id, self.env_version
        return env

    @cached_property
    def outcome_verifier(self) -> Any:
        """The outcome verifier, built once (verifiers are stateless); None for a world without one."""
        return None if self.verifier is None else self.verifier()

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
_ERRORS: dict[str, str] = {}  # a family's name -> why it did not load (envs/discovery.py writes it)
_FINDER: list[Callable[[], Any]] = []  # what finds the families: discovery, installed by `gymfoundry.envs`
_FOUND: list[bool] = [False]
_FINDING = threading.Lock()
_FINDING_THREAD: list[int | None] = [None]


def find_with(finder: Callable[[], Any]) -> None:
    """Let `finder` find the families, on the first lookup (the package `gymfoundry.envs` installs
    discovery, which sits above this module)."""
    _FINDER[:] = [finder]
    _FOUND[0] = False


def _found() -> None:
    if _FOUND[0] or not _FINDER or _FINDING_THREAD[0] == threading.get_ident():
        return  # found; or this thread is finding them, and its lookups see what is found so far
    with _FINDING:  # another thread's first lookup waits for this one's to finish
        if _FOUND[0]:
            return
        _FINDING_THREAD[0] = threading.get_ident()
        try:
            _FINDER[0]()
            _FOUND[0] = True  # (if the finder raised, the next lookup tries again, and says why)
        finally:
            _FINDING_THREAD[0] = None


def add(fam: Family) -> None:
    """Register a family (and its env id with Gymnasium). A second family of the same name is refused."""
    if not isinstance(fam, Family):
        raise FamilyError(f"expected a Family, got {type(fam).__name__}")
    known = _FAMILIES.get(fam.name)
    if known is not None and known is not fam:
        raise FamilyError(f"family {fam.name!r} is declared twice: by {known.env.__module__} and "
                          f"{fam.env.__module__}")
    _FAMILIES[fam.name] = fam
    if fam.env_id in gymnasium.registry:
        del gymnasium.registry[fam.env_id]
    gymnasium.register(id=fam.env_id, entry_point="gymfoundry.envs.gym_adapter:GymnasiumEnv",
                       kwargs={"env_id": fam.env_id})


def remove(name: str) -> None:
    """Forget the family `name` and its Gymnasium id (a test's family, once the test is over)."""
    fam = _FAMILIES.pop(name, None)
    if fam is not None:
        gymnasium.registry.pop(fam.env_id, None)


def family(key: str) -> Family:
    """The family of a name (`inventory`) or of an env id (`gymfoundry/inventory-v0`: that
    version exactly, as stored tasks and rollouts name it); UnknownEnv if none."""
    _found()
    match = ENV_ID.match(key) if isinstance(key, str) else None
    name = match["name"] if match else key
    fam = _FAMILIES.get(name) if isinstance(name, str) else None
    if match and fam is not None and fam.env_id != key:
        fam = None
    if fam is None:
        what = f"no environment {key!r}" if match or (isinstance(key, str) and "/" in key) else \
            f"no environment family {key!r}"
        why = f"; that family failed to load: {_ERRORS[name]}" if isinstance(name, str) and name in _ERRORS else ""
        raise UnknownEnv(f"{what}; registered: {', '.join(env_ids()) or 'none'}{why}")
    return fam


@contextmanager
def replaced(name: str, **changes: Any) -> Iterator[Family]:
    """The family `name` with `changes` (another verifier class, say) registered meanwhile: every
    lookup (the runtime, the scorer, an audit) gets it; the family itself again afterwards."""
    saved = family(name)
    _FAMILIES[name] = changed = replace(saved, **changes)
    try:
        yield changed
    finally:
        _FAMILIES[name] = saved
        saved.env.declared_by = saved


def families() -> list[Family]:
    _found()
    return [_FAMILIES[n] for n in sorted(_FAMILIES)]


def env_ids() -> list[str]:
    """Every known family's env id, sorted."""
    return sorted(fam.env_id for fam in families())


def load_errors() -> dict[str, str]:
    """A family's name -> why it did not load."""
    return dict(_ERRORS)


# The process reward model's folder (gymfoundry.verifiers, beside envs/): its step-reward rules are
# hidden from the agent as the families' graders are. Found by path: envs never imports the scoring layers.
SCORING_DIR = Path(__file__).resolve().parents[1] / "verifiers"


def masked_dirs() -> list[str]:
    """Every folder some family asks the sandbox to hide, and the scoring layers' (what a caller of
    the sandbox passes it)."""
    scoring = [str(SCORING_DIR)] if SCORING_DIR.is_dir() else []
    return sorted({d for fam in families() for d in fam.masked_dirs()} | set(scoring))
