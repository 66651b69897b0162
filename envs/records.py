"""The canonical records. Each concept is defined once, here; the warehouse schema,
the datasets and the trainers derive from these models, never the other way round."""

from __future__ import annotations

import hashlib
import json
import math
import re
from enum import Enum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator

from gymfoundry.envs.errors import InvalidTask
from gymfoundry.envs.secrets import check_endpoint_url


# made once: json.dumps builds an encoder per call when given options (same text either way)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def content_hash(payload: Any, length: int = 16) -> str:
    """Stable hash of a JSON-serialisable payload (keys sorted, no whitespace)."""
    return hashlib.sha256(_CANONICAL.encode(payload).encode()).hexdigest()[:length]


# The family-name rule, its env ids and the difficulty levels: owned here, at the bottom, and used
# by everything above (the Family handle, the profiles, the scaffold, the YAML domains, the lake).
FAMILY_NAME = r"^[a-z][a-z0-9_]*$"
ENV_ID = re.compile(rf"^gymfoundry/(?P<name>{FAMILY_NAME[1:-1]})-v(?P<version>\d+)$")
LEVELS = (1, 2, 3, 4, 5)


class Record(BaseModel):
    # NaN never equals itself and is not JSON: a stored record must equal its reload.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ToolCall(Record):
    """The action: a named tool with JSON arguments. `id` pairs a call with its result."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str = ""


class ToolCategory(str, Enum):
    read = "read"
    write = "write"
    execute = "execute"
    irreversible = "irreversible"


class Split(str, Enum):
    train = "train"
    val = "val"
    test = "test"
    holdout = "holdout"


class Termination(str, Enum):
    success = "success"
    failure = "failure"
    truncated = "truncated"
    timeout = "timeout"
    env_fault = "env_fault"
    env_bug = "env_bug"  # env code crashed on the agent's input (envs.errors): a bug to fix, not a skill
    # The policy's inference endpoint failed (no connection, a timeout, 429, 5xx, an unreadable
    # reply) after the policy's own bounded retries: a fault, retried like env_fault, never a model outcome.
    inference_fault = "inference_fault"
    policy_error = "policy_error"
    constraint_violation = "constraint_violation"
    verifier_error = "verifier_error"
    # Grading (the verdict at the episode's end, the live progress potential) ran past the
    # grader's own time budget: a fault, retried like env_fault, never the agent's (envs.wrappers.TimeLimit).
    grader_fault = "grader_fault"


class Source(Record):
    """Where a task came from: a generator (name, version, seed) or an external origin."""

    generator: str
    version: str
    seed: int | None = None
    origin: str | None = None


class Budget(Record):
    """Limits the runtime enforces for an episode (not merely rewards), each charged to whoever
    spent it (envs.wrappers.TimeLimit): `step_timeout_s` bounds each step's environment time and
    `episode_timeout_s` both the environment's time in all steps and, apart, the agent's own time
    (outside steps and grading); where the policy reports its tokens, `max_turn_tokens` and
    `max_episode_tokens` bound them; `grade_timeout_s` is the grader's budget per verdict or
    potential (None: `TimeLimit.GRADE_TIMEOUT_S`)."""

    max_steps: int = 20
    max_tool_calls: int = 20
    step_timeout_s: float = 10.0
    episode_timeout_s: float = 120.0
    max_action_chars: int = 8192
    max_turn_tokens: int | None = Field(default=None, ge=1)
    max_episode_tokens: int | None = Field(default=None, ge=1)
    grade_timeout_s: float | None = Field(default=None, gt=0)

    @model_serializer(mode="wrap")
    def _unset_limits_left_out(self, handler: Any) -> Any:
        # Limits added after tasks were first hashed are left out while unset, so a task's
        # content (its id) and a rollout's identity stay what they were.
        data = handler(self)
        if isinstance(data, dict):
            for name in _LATER_LIMITS:
                if data.get(name, 0) is None:
                    del data[name]
        return data


_LATER_LIMITS = ("max_turn_tokens", "max_episode_tokens", "grade_timeout_s")


class Difficulty(Record):
    level: int = Field(ge=LEVELS[0], le=LEVELS[-1])
    features: dict[str, float] = Field(default_factory=dict)


class Hidden(Record):
    """Never rendered into any observation: the reference trajectory that proves the task is
    solvable, the checks the verifier applies, and `secrets`, literal values whose appearance
    in any observation or dataset row is a leak."""

    reference: list[ToolCall]
    checks: dict[str, Any] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)


class TaskSpec(Record):
    task_id: str = ""
    family: str = Field(pattern=FAMILY_NAME)
    env_id: str
    split: Split = Split.train
    source: Source
    template_id: str
    goal: str
    initial_state: dict[str, Any]
    allowed_tools: list[str]
    budget: Budget = Field(default_factory=Budget)
    difficulty: Difficulty
    hidden: Hidden

    @model_validator(mode="after")
    def _fill_task_id(self) -> TaskSpec:
        expected = self.compute_id()
        if not self.task_id:
            self.task_id = expected
        elif self.task_id != expected:
            raise ValueError(f"task_id {self.task_id!r} does not match its content hash {expected!r}")
        return self

    def compute_id(self) -> str:
        """"t-" and the content hash of the task without its id and split (the split is assigned
        later by the isolation stage and is not part of the content). Remembered per process by the
        digest of the content's JSON (pydantic's, exactly: the same text is the same content), so a
        task made here and checked again at landing is hashed once; an edit in place is new text."""
        try:
            key = hashlib.sha256(self.model_dump_json(exclude=_NOT_CONTENT, warnings=False).encode()).digest()
        except Exception:  # not serialisable as it is: the canonical dump below says why
            key = None
        known = _TASK_IDS.get(key) if key is not None else None
        if known is not None:
            return known
        task_id = "t-" + content_hash(self.model_dump(mode="json", exclude=_NOT_CONTENT))
        if key is not None:
            if len(_TASK_IDS) >= _TASK_IDS_MAX:
                _TASK_IDS.clear()
            _TASK_IDS[key] = task_id
        return task_id


def check_task(task: TaskSpec | dict) -> TaskSpec:
    """The task, re-validated from its content: a clear `InvalidTask` (a ValueError) naming the
    bad fields, or a task whose id is its content hash. `model_copy(update=...)` and attribute
    assignment skip validation and keep the old id; this catches both (at `reset`, at landing).
    A TaskSpec whose content (its JSON, exactly) was checked before gets the task that check
    returned, after making sure that one still has exactly that content (a task is played
    several times; validating it again costs more than a short episode)."""
    key = None
    if isinstance(task, TaskSpec):
        try:
            key = task.model_dump_json(round_trip=True, warnings=False)
        except Exception:  # not serialisable as it is: the validation below says why
            key = None
        hit = _CHECKED_TASKS.get(key) if key is not None else None
        if hit is not None:
            if hit.model_dump_json(round_trip=True, warnings=False) == key:
                return hit
            _CHECKED_TASKS.pop(key, None)  # edited in place since: checked again below
        # a wrong-typed field set by model_copy dumps as it is and is reported by the validation
        task = task.model_dump(mode="python", round_trip=True, warnings=False)
    elif not isinstance(task, dict):
        raise InvalidTask(f"a task must be a TaskSpec or a dict, not {type(task).__name__}")
    try:
        checked = TaskSpec.model_validate(task)
    except ValidationError as exc:
        name = task.get("task_id") or "without an id"
        raise InvalidTask(f"malformed task {name}: {_fields(exc)}") from None
    if key is not None:
        if len(_CHECKED_TASKS) >= _CHECKED_TASKS_MAX:
            _CHECKED_TASKS.clear()
        _CHECKED_TASKS[key] = checked
    return checked


_NOT_CONTENT = {"task_id", "split"}
# The SHA-256 of a task's content JSON -> its id (`TaskSpec.compute_id`); cleared when full.
_TASK_IDS: dict[bytes, str] = {}
_TASK_IDS_MAX = 65536
# A checked task's JSON (round trip) -> the task `check_task` returned for it.
_CHECKED_TASKS: dict[str, TaskSpec] = {}
_CHECKED_TASKS_MAX = 4096


def _fields(exc: ValidationError, limit: int = 8) -> str:
    """One short line per bad field (pydantic's own text repeats every input in full)."""
    parts = []
    for error in exc.errors(include_url=False, include_input=False)[:limit]:
        where = ".".join(str(p) for p in error["loc"]) or "task"
        parts.append(f"{where}: {error['msg'].removeprefix('Value error, ')}")
    more = exc.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


class Step(Record):
    """One agent turn: what it saw, what it emitted, what came back."""

    index: int = Field(ge=0)
    observation: str
    action_text: str | None = None
    thought: str | None = None
    tool_call: ToolCall | None = None
    result: str
    error: str | None = None
    reward: float = 0.0
    latency_s: float = 0.0
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    policy_version: str | None = None


_TEXT = (str, type(None))
# Record class -> (field names in order, the defaults of fields without a factory, the factories, the
# names as a set, the fields without a default, every field with its default, the class's __new__).
_SHAPES: dict[type, tuple[Any, ...]] = {}


def construct(cls: type[BaseModel], fields: dict[str, Any]) -> Any:
    """`cls.model_construct(**fields)` (no validation: for values this code made from validated
    ones), at a third of its cost: the same `__dict__` (fields in order, defaults filled in, a
    default factory called per record), fields set and no extra or private values. For a record
    without aliases or private attributes (pydantic's own `model_construct` handles those)."""
    shape = _SHAPES.get(cls)
    if shape is None:
        if cls.__private_attributes__ or cls.__pydantic_post_init__ or any(
                f.alias is not None or f.validation_alias is not None for f in cls.model_fields.values()):
            return cls.model_construct(**fields)
        defaults = {k: f.default for k, f in cls.model_fields.items()
                    if f.default_factory is None and not f.is_required()}
        factories = {k: f.default_factory for k, f in cls.model_fields.items() if f.default_factory is not None}
        names = tuple(cls.model_fields)
        # Every field in order, defaults filled in: a record given all the fields without a
        # default (required or made by a factory) is this dict updated with its fields.
        template = {k: defaults.get(k) for k in names}
        # object.__new__ where the class has no __new__ of its own (it is what cls.__new__ finds)
        new = _NEW if cls.__new__ is object.__new__ else cls.__new__
        shape = _SHAPES[cls] = (names, defaults, factories, frozenset(names),
                                frozenset(k for k in names if k not in defaults), template, new)
    names, defaults, factories, name_set, needed, template, new = shape
    keys = fields.keys()
    # the common case: every field given (as many keys, all of them fields), or every field
    # without a default and nothing else; one dict copy, in field order
    if (len(keys) == len(names) and name_set.issuperset(keys)) or (needed <= keys and keys <= name_set):
        values = template.copy()
        values.update(fields)
        fields_set = set(keys)
    else:
        values = {}
        for name in names:
            if name in fields:
                values[name] = fields[name]
            elif name in defaults:
                values[name] = defaults[name]
            elif name in factories:
                values[name] = factories[name]()
        fields_set = set(fields) & name_set
    record = new(cls)
    object.__setattr__(record, "__dict__", values)
    _SET_FIELDS_SET(record, fields_set)  # BaseModel's slots, set through their descriptors
    _SET_EXTRA(record, None)
    _SET_PRIVATE(record, None)
    return record


_NEW = object.__new__
# What object.__setattr__(record, "<slot>", value) finds and calls for each of BaseModel's slots
_SET_FIELDS_SET = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_SET_EXTRA = BaseModel.__dict__["__pydantic_extra__"].__set__
_SET_PRIVATE = BaseModel.__dict__["__pydantic_private__"].__set__


def make_step(**fields: Any) -> Step:
    """A `Step`, built without validation when every given field already has exactly the type the
    record declares (what the runtime itself made: validation would return it unchanged, and a
    step is built twice per turn); anything else, e.g. a policy's token ids, is validated."""
    get = fields.get
    index = get("index")
    plain = (type(index) is int and index >= 0 and type(get("observation")) is str and type(get("result")) is str
             and type(get("action_text")) in _TEXT and type(get("thought")) in _TEXT and type(get("error")) in _TEXT
             and type(get("policy_version")) in _TEXT and type(get("tool_call")) in _CALL
             and _finite(get("reward", 0.0)) and _finite(get("latency_s", 0.0))
             and get("token_ids") is None and get("logprobs") is None and fields.keys() <= _STEP_FIELDS)
    return construct(Step, fields) if plain else Step(**fields)


_CALL = (ToolCall, type(None))
_STEP_FIELDS = frozenset(Step.model_fields)


def _finite(value: Any) -> bool:
    return type(value) is float and math.isfinite(value)


class CheckResult(Record):
    passed: bool
    reasons: list[str] = Field(default_factory=list)


class OutcomeReport(Record):
    """What the outcome verifier found, each aspect reported separately."""

    verifier_id: str
    verifier_version: str
    success: bool
    completed: bool
    regression: bool
    constraint_violation: bool
    side_effects: list[str] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    checks: dict[str, CheckResult] = Field(default_factory=dict)

    @property
    def disagreement(self) -> bool:
        return len({c.passed for c in self.checks.values()}) > 1


class Cost(Record):
    steps: int = 0
    tool_calls: int = 0
    tokens: int = 0
    wall_time_s: float = 0.0


class FaultConfig(Record):
    """Environment faults to inject (`envs.faults.FaultInjection`): `rate` per tool call, split
    between the kinds by weight. Seeded, so a run's faults are reproducible."""

    rate: float = Field(default=0.0, ge=0, le=1)
    kinds: dict[Literal["tool_crash", "timeout", "unavailable"], float] = Field(
        default_factory=lambda: {"tool_crash": 1.0, "timeout": 1.0, "unavailable": 1.0})
    timeout_s: float = Field(default=0.0, ge=0)  # how long an injected timeout hangs before it fails
    seed: int = 0


ENV_VAR_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class Sampling(Record):
    """How a model samples; each knob that is set is part of its rollouts' identity."""

    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, gt=0)
    seed: int | None = None  # combined with each episode's seed, never replacing it
    stop: list[str] | None = None

    def knobs(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump(mode="json").items() if v is not None}


class PolicySpec(Record):
    """Which policy a run collects with: `scripted` (the family's scripted policy), `hf` (a local
    checkpoint: `model` is its directory), `openai` (an OpenAI-compatible endpoint: `model` is the
    served model's name at `base_url`), or a kind registered with `gymfoundry.tasks.policies.registry.register_policy`.
    The key is never part of it: `api_key_env` NAMES the environment variable holding it, and a
    `base_url` holding a user name or password is refused. `timeout_s` bounds each request,
    `max_retries` the policy's own retries of a failed request (connection, timeout, 429, 5xx)
    before the episode ends as `inference_fault`; `max_concurrency` is how many episodes may be in
    flight at once. `options` are further keyword arguments of a custom policy."""

    model_config = ConfigDict(hide_input_in_errors=True)  # an error never repeats a URL's password

    kind: str = Field(default="scripted", pattern=r"^[a-z][a-z0-9_.-]*$")
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = Field(default=None, pattern=ENV_VAR_NAME)
    sampling: Sampling = Field(default_factory=Sampling)
    timeout_s: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=2, ge=0)
    max_concurrency: int = Field(default=1, ge=1)
    mistake_rate: float | None = Field(default=None, ge=0, le=1)  # the scripted policy's knob
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("base_url")
    @classmethod
    def _no_userinfo(cls, v: str | None) -> str | None:
        # a password in the URL would be stored with the run and sent in place of the key
        return check_endpoint_url(v, "the environment variable named by --api-key-env (api_key_env)")

    @model_validator(mode="after")
    def _needs_model(self) -> PolicySpec:
        if self.kind in ("hf", "openai") and not self.model:
            raise ValueError(f"a {self.kind!r} policy needs a model (a checkpoint directory / the endpoint's model name)")
        return self

    @property
    def policy_id(self) -> str:
        """`openai:<model>`, `hf:<checkpoint dir name>`, or the kind (a scripted policy's own id
        names its family); the built policy's `policy_id` is this one for hf and openai."""
        if self.model is None:
            return self.kind
        return f"{self.kind}:{self.model.rstrip('/').rsplit('/', 1)[-1] if self.kind == 'hf' else self.model}"

    @property
    def identity(self) -> str:
        """A stable id of what changes the episodes (not the key's variable, timeout, retries or
        concurrency): equal specs collect the same rollouts."""
        return "ps-" + content_hash(self.model_dump(mode="json", exclude={"api_key_env", "timeout_s", "max_retries",
                                                                          "max_concurrency"}))

    def rollout_params(self) -> dict[str, Any]:
        """The knobs that join a rollout's identity: the sampling knobs that are set."""
        return self.sampling.knobs()


def rollout_identity(task_id: str, env_id: str, env_version: str, policy_id: str, policy_version: str, seed: int,
                     attempt: int, policy_params: dict[str, Any] | None = None,
                     faults: FaultConfig | None = None, limits: Budget | None = None,
                     parent: tuple[str, int, int] | None = None) -> str:
    """A rollout's id, from everything that changes its episode: the task (its budget included),
    the runtime limits that replaced that budget, the env, the policy and its knobs, the seed,
    the attempt and the faults injected into it.
    The same inputs are the same rollout, so re-running a flow with them lands nothing new;
    other inputs (another fault config, temperature, ...) are other rollouts and land. Knobs and
    faults join the key only when set, so a clean run keeps the ids it always had."""
    key: list[Any] = [task_id, env_id, env_version, policy_id, policy_version, seed, attempt]
    if policy_params:
        key.append({"policy_params": policy_params})
    if faults is not None and faults.rate > 0:
        key.append({"faults": faults.model_dump(mode="json")})
    if limits is not None:
        key.append({"limits": limits.model_dump(mode="json")})
    if parent is not None:  # a sub-agent's episode is its parent's: (parent id, stage, place in the stage)
        key.append({"parent": list(parent)})
    return "r-" + content_hash(key)


class DelegationStage(Record):
    """One stage of a delegating episode: the main agent's steps up to and including the call
    that delegated, then its sub-agents' episodes, run in parallel, with a barrier after them.
    The last stage holds the main agent's steps after its last delegation (no sub-agents)."""

    main_steps: int = Field(ge=0)
    sub_steps: list[int] = Field(default_factory=list)  # steps of each sub-agent's episode, in order
    sub_rollout_ids: list[str] = Field(default_factory=list)


class Delegation(Record):
    """How a delegating episode's work was laid out. `critical_steps` = Σ over stages of (main
    steps + the longest sub-agent's steps), the latency proxy of Kimi K2.5's PARL; `serial_steps`
    = every step of the main agent and of every sub-agent. Both are computed, never given."""

    stages: list[DelegationStage]
    critical_steps: int = 0
    serial_steps: int = 0

    @model_validator(mode="after")
    def _totals(self) -> Delegation:
        self.critical_steps = sum(s.main_steps + max(s.sub_steps, default=0) for s in self.stages)
        self.serial_steps = sum(s.main_steps + sum(s.sub_steps) for s in self.stages)
        return self

    @property
    def sub_agents(self) -> int:
        return sum(len(s.sub_steps) for s in self.stages)


class ParallelismReward(Record):
    """An optional auxiliary reward for delegating episodes: `weight` x the share of the serial
    work the episode's parallel stages took off its critical path (`gymfoundry.envs.delegation.parallelism_gain`),
    annealed linearly to 0 over `anneal_steps` training steps, so training ends on the task's own
    outcome. Stored with a GRPO dataset (its manifest's params and every row)."""

    weight: float = Field(gt=0, le=1)
    anneal_steps: int = Field(ge=1)

    def at(self, step: int) -> float:
        """The weight at training step `step` (0-based)."""
        return self.weight * max(0.0, 1.0 - step / self.anneal_steps)


class Rollout(Record):
    rollout_id: str = ""
    task_id: str
    family: str = Field(pattern=FAMILY_NAME)
    env_id: str
    env_version: str
    policy_id: str
    policy_version: str
    seed: int
    attempt: int = 0
    steps: list[Step] = Field(default_factory=list)
    termination: Termination
    termination_reason: str = ""
    outcome: OutcomeReport | None = None
    cost: Cost = Field(default_factory=Cost)
    # What the runtime guaranteed during the episode (e.g. sandbox backend and limits in force).
    env_info: dict[str, Any] = Field(default_factory=dict)
    # The policy's knobs that change its episodes beyond its id and version (sampling settings,
    # token limits, the system prompt's hash); None when its version says everything.
    policy_params: dict[str, Any] | None = None
    # The fault injection this attempt ran under (None: none; a zero rate injects nothing).
    faults: FaultConfig | None = None
    # The runtime limits that replaced the task's budget (an evaluation's step cap), or None.
    limits: Budget | None = None
    # A sub-agent's episode: the rollout that delegated it, the stage (0-based) and its place there.
    parent_rollout_id: str | None = None
    stage: int | None = None
    stage_index: int | None = None
    # A delegating episode: its stages and critical/serial steps; its sub-agents' episodes travel in
    # `subrollouts` and land in their own table (`sub_rollouts`), never as the main agent's turns.
    delegation: Delegation | None = None
    subrollouts: list[Rollout] = Field(default_factory=list)

    @model_validator(mode="after")
    def _fill_rollout_id(self) -> Rollout:
        if self.faults is not None and self.faults.rate == 0:
            self.faults = None
        if not self.rollout_id:
            self.rollout_id = self.compute_id()
        return self

    def compute_id(self) -> str:
        parent = None if self.parent_rollout_id is None else (self.parent_rollout_id, self.stage, self.stage_index)
        return rollout_identity(self.task_id, self.env_id, self.env_version, self.policy_id, self.policy_version,
                                self.seed, self.attempt, self.policy_params, self.faults, self.limits, parent)

    @property
    def success(self) -> bool:
        return self.termination == Termination.success


class Verdict(Record):
    """One outcome verifier's verdict on a stored rollout, and the class it implies. The factory's
    own (`source="factory"`: the rollout's `outcome` and `termination` as they landed) and each
    re-verification under a later verifier version (`source="reverify"`: the stored calls replayed
    under the current verifier, never the policy; tasks/ops/reverify.py) are kept side by side, keyed
    by (rollout_id, verifier_id, verifier_version). `termination` is decided by tasks.rollout.classify
    from the episode's end and this verdict; a verifier that raised has no `outcome`, its `error`,
    and (for an episode that ended normally) `verifier_error`, never a model failure."""

    rollout_id: str
    task_id: str
    family: str = Field(pattern=FAMILY_NAME)
    verifier_id: str
    verifier_version: str
    source: Literal["factory", "reverify"]
    outcome: OutcomeReport | None = None
    termination: Termination
    termination_reason: str = ""
    error: str | None = None
    verified_at: str = ""  # UTC, ISO 8601: when the verdict was recorded (the factory's: when it landed)

    @classmethod
    def of_rollout(cls, rollout: Rollout, verified_at: str = "") -> Verdict | None:
        """The factory's verdict, as the rollout carries it; None for a rollout without an outcome
        (its verifier raised, or never ran): no version to key it by."""
        if rollout.outcome is None:
            return None
        return cls(rollout_id=rollout.rollout_id, task_id=rollout.task_id, family=rollout.family,
                   verifier_id=rollout.outcome.verifier_id, verifier_version=rollout.outcome.verifier_version,
                   source="factory", outcome=rollout.outcome, termination=rollout.termination,
                   termination_reason=rollout.termination_reason, verified_at=verified_at)


class StepScore(Record):
    """One layer's score of one step, with the scorer's identity and version."""

    rollout_id: str
    step_index: int = Field(ge=0)
    layer: Literal["rules", "judge", "calibrated", "combined"]
    scorer_id: str
    scorer_version: str
    status: Literal["ok", "not_configured", "error"] = "ok"
    score: float | None = None
    components: dict[str, float] = Field(default_factory=dict)
    rationale: str | None = None


class TaskRejection(Record):
    task_id: str
    family: str
    stage: str
    reason: str


# Classes decided by what the model did (its own time and tokens running out is `truncated`). The
# others (env_fault, env_bug, inference_fault, grader_fault, policy_error, verifier_error, and
# `timeout` of rollouts recorded before time was attributed) say nothing about its skill: never a
# model failure, never in a success rate.
MODEL_OUTCOMES = frozenset({Termination.success, Termination.failure, Termination.constraint_violation,
                            Termination.truncated})


class RetryPolicy(Record):
    """How a run retries episodes that ended for a reason that is not the model's doing.
    Fixed per run and stored with it; a model outcome is never retried. After `max_retries`
    the (task, sample) is skipped, or the run fails."""

    max_retries: int = Field(default=2, ge=0)
    backoff_s: float = Field(default=0.5, ge=0)
    backoff_factor: float = Field(default=2.0, ge=1)
    max_backoff_s: float = Field(default=30.0, ge=0)
    retry_on: list[Termination] = Field(default_factory=lambda: [Termination.env_fault, Termination.inference_fault,
                                                                 Termination.grader_fault])
    on_exhausted: Literal["skip", "fail"] = "skip"

    @model_validator(mode="after")
    def _never_model_outcomes(self) -> RetryPolicy:
        model = sorted(t.value for t in self.retry_on if t in MODEL_OUTCOMES)
        if model:
            raise ValueError(f"model outcomes are never retried: {model}")
        return self

    def delay_s(self, retry: int) -> float:
        """Wait before retry number `retry` (1 for the first)."""
        try:
            return min(self.max_backoff_s, self.backoff_s * self.backoff_factor ** (retry - 1))
        except OverflowError:  # the thousandth retry of a long run waits the cap, it does not crash the run
            return self.max_backoff_s


class Run(Record):
    """One factory run: its configuration (which fixes `run_id`), retry policy and injected
    faults, and what happened: rollouts attempted by class and family, retries, skips, and
    whether it completed or `failed` (with the `error`; what it collected before still landed)."""

    run_id: str = ""
    params: dict[str, Any]
    retry_policy: RetryPolicy
    faults: FaultConfig | None = None
    started_at: str = ""
    finished_at: str = ""
    attempted: int = Field(default=0, ge=0)
    retries: int = Field(default=0, ge=0)
    skips: int = Field(default=0, ge=0)
    by_class: dict[str, int] = Field(default_factory=dict)
    by_family: dict[str, dict[str, int]] = Field(default_factory=dict)
    landed: dict[str, int] = Field(default_factory=dict)
    quarantined: list[str] = Field(default_factory=list)
    status: Literal["completed", "failed"] = "completed"
    error: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _status_of_older_rows(cls, data: Any) -> Any:
        if isinstance(data, dict) and "status" in data and data["status"] is None:  # landed before runs had one
            data = {**data, "status": "completed"}
        return data

    @model_validator(mode="after")
    def _fill_run_id(self) -> Run:
        if self.status == "failed" and not self.error:
            raise ValueError("a failed run says why: error is required")
        if not self.run_id:
            config = [self.params, self.retry_policy.model_dump(mode="json"),
                      self.faults.model_dump(mode="json") if self.faults else None]
            # A failed run is not the completed run of the same configuration a re-run records.
            self.run_id = "run-" + content_hash(config + ["failed"] if self.status == "failed" else config)
        return self


class HoldoutLock(Record):
    """A family's holdout fraction, locked in a warehouse when a factory run starts, before any of
    its tasks lands: a run that dies before it is recorded in `runs` still locks it, so training
    (which holds out templates not landed yet by this fraction) and later runs agree on it."""

    family: str = Field(pattern=FAMILY_NAME)
    holdout_fraction: float = Field(ge=0, le=1)


class FamilyAudit(Record):
    """One row of a family's gameability audit (tasks/stages/audit.py): how one adversary did at one
    level against the oracle (the task's reference), under the versions that made the verdicts.
    `passed`: its success rate is at most its chance floor, its mean return stays below the
    oracle's, none of its episodes left the statistics, and the oracle succeeded every time."""

    audit_id: str  # one audit run of a family: its rows share it
    family: str = Field(pattern=FAMILY_NAME)
    env_version: str
    generator_version: str
    verifier_id: str
    verifier_version: str
    rules_version: str
    adversary: str
    level: int = Field(ge=LEVELS[0], le=LEVELS[-1])
    episodes: int = Field(ge=0)
    successes: int = Field(ge=0)
    excluded: int = Field(ge=0)  # episodes out of the statistics (faults, timeouts)
    success_rate: float | None = Field(default=None, ge=0, le=1)
    mean_return: float | None = None
    oracle_success_rate: float | None = Field(default=None, ge=0, le=1)
    oracle_return: float | None = None
    floor: float = Field(default=0.0, ge=0, le=1)
    passed: bool
    reasons: list[str] = Field(default_factory=list)
    audited_at: str = ""


class DatasetManifest(Record):
    """A dataset assembled from the warehouse: its file, the curriculum behind its sampling
    weights (per-rollout success rates per "family/level" for one policy, the learnability
    function, the resulting mixture) and what was left out. Its rows are `SFTRow`s, `DPORow`s or
    `GRPORow`s (`DATASET_ROWS[kind]`), their lineage `DatasetRow`s."""

    dataset_id: str
    kind: Literal["sft", "dpo", "grpo"]
    path: str | None = None  # relative to the data dir
    rows: int = Field(ge=0)
    families: list[str]
    policy_id: str | None = None
    policy_version: str | None = None
    learnability: str
    success_rates: dict[str, float] = Field(default_factory=dict)
    mixture: dict[str, float] = Field(default_factory=dict)
    reward_layer: str | None = None
    reward_scorer_version: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    dropped: dict[str, int] = Field(default_factory=dict)
    created_at: str = ""


class DatasetRow(Record):
    """Lineage of one dataset row: the rollouts it came from and its sampling weight."""

    dataset_id: str
    row_id: str  # content hash of the row
    row_index: int = Field(ge=0)
    family: str = Field(pattern=FAMILY_NAME)
    task_id: str
    difficulty: int = Field(ge=LEVELS[0], le=LEVELS[-1])
    rollout_ids: list[str] = Field(default_factory=list)
    pair_type: Literal["trajectory", "verdict", "step"] | None = None
    step_index: int | None = None
    margin: float | None = None
    weight: float = Field(ge=0)


class TrainingRow(Record):
    """What every dataset row is: a record whose fields are its Parquet file's columns, in order
    (`model_dump()` is the row as written; `model_validate` reads one back). Its `row_id` is the
    content hash of its `CONTENT` fields (what makes two rows the same row); its `weight` the
    curriculum's sampling weight, which it shares with the other rows of its `owner` (the
    rollout, or task, the curriculum splits a cell's share among)."""

    CONTENT: ClassVar[tuple[str, ...]] = ()

    def content_id(self) -> str:
        return content_hash([getattr(self, name) for name in self.CONTENT], 20)


class SFTRow(TrainingRow):
    """An SFT row in TRL's conversational format: a verified success's conversation (`messages`,
    tool-call arguments as JSON strings) and its tool schemas (`tools`, a JSON string); the PRM
    reward of each assistant turn (`step_rewards`) and the turns whose reward is negative
    (`masked_turns`: kept as context, out of the loss)."""

    CONTENT: ClassVar[tuple[str, ...]] = ("messages", "tools", "masked_turns")

    messages: list[dict[str, Any]]
    tools: str
    task_id: str
    task_family: str
    difficulty: int
    step_rewards: list[float] = Field(default_factory=list)
    masked_turns: list[int] = Field(default_factory=list)
    rollout_id: str
    row_id: str = ""
    weight: float = Field(default=1.0, ge=0)

    @property
    def owner(self) -> str:
        return self.rollout_id

    @property
    def rollout_ids(self) -> list[str]:
        return [self.rollout_id]


class DPORow(TrainingRow):
    """A DPO pair from one task: the shared `prompt` and the `chosen` / `rejected` continuations
    (message lists, each ending on an assistant turn), the rollouts they came from, what kind of
    pair it is (whole trajectories, verdicts, or the step `step_index` after a shared prefix) and
    its `margin`."""

    CONTENT: ClassVar[tuple[str, ...]] = ("prompt", "chosen", "rejected", "tools")

    prompt: list[dict[str, Any]]
    chosen: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    tools: str
    task_id: str
    task_family: str
    difficulty: int
    chosen_rollout_id: str
    rejected_rollout_id: str
    pair_type: Literal["trajectory", "verdict", "step"]
    step_index: int | None = None
    margin: float
    row_id: str = ""
    weight: float = Field(default=1.0, ge=0)

    @property
    def owner(self) -> str:
        return self.rejected_rollout_id  # a failure shares one unit among its pairs

    @property
    def rollout_ids(self) -> list[str]:
        return [self.chosen_rollout_id, self.rejected_rollout_id]


def _unset(value: Any) -> bool:
    return value is None


class GRPORow(TrainingRow):
    """A GRPO prompt for online RL: what recreates its task's env (`env_id`, and the generator
    `seed` and `level`: `generate_task(seed, level)`), and the annealed parallelism reward's
    schedule where the dataset offers one (the two columns exist only then)."""

    CONTENT: ClassVar[tuple[str, ...]] = ("task_id", "env_id", "seed", "level")

    prompt: list[dict[str, Any]]
    tools: str
    task_id: str
    task_family: str
    difficulty: int
    env_id: str
    seed: int | None
    level: int
    generator: str
    generator_version: str
    parallelism_weight: float | None = Field(default=None, exclude_if=_unset)
    parallelism_anneal_steps: int | None = Field(default=None, exclude_if=_unset)
    row_id: str = ""
    weight: float = Field(default=1.0, ge=0)

    @property
    def owner(self) -> str:
        return self.task_id

    @property
    def rollout_ids(self) -> list[str]:
        return []

    @property
    def parallelism(self) -> ParallelismReward | None:
        if self.parallelism_weight is None:
            return None
        return ParallelismReward(weight=self.parallelism_weight, anneal_steps=self.parallelism_anneal_steps)


DATASET_ROWS: dict[str, type[TrainingRow]] = {"sft": SFTRow, "dpo": DPORow, "grpo": GRPORow}


class TrainingRun(Record):
    """One training run: the dataset it read (lineage through `datasets` / `dataset_rows`),
    the base model, method and hyperparameters (which fix `run_id`), the checkpoint written
    and its metrics (loss, seconds per step, peak memory, held-out success where evaluated)."""

    run_id: str = ""
    method: Literal["sft", "dpo", "grpo"]
    base_model: str
    base_model_version: str = ""
    dataset_id: str | None = None
    dataset_path: str | None = None
    families: list[str] = Field(default_factory=list)
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    checkpoint: str = ""
    checkpoint_version: str = ""
    status: Literal["completed", "failed"] = "completed"
    metrics: dict[str, Any] = Field(default_factory=dict)
    started_at: str = ""
    finished_at: str = ""

    @model_validator(mode="after")
    def _fill_run_id(self) -> TrainingRun:
        if not self.run_id:
            key = [self.method, self.base_model_version or self.base_model, self.dataset_id, self.hyperparameters]
            self.run_id = "train-" + content_hash(key)
        return self
