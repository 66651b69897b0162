"""The canonical records. Each concept is defined once, here; the warehouse schema,
the datasets and the trainers derive from these models, never the other way round."""

from __future__ import annotations

import hashlib
import json
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


def content_hash(payload: Any, length: int = 16) -> str:
    """Stable hash of a JSON-serialisable payload (keys sorted, no whitespace)."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


FAMILY_NAME = r"^[a-z][a-z0-9_]*$"


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
    policy_error = "policy_error"
    constraint_violation = "constraint_violation"
    verifier_error = "verifier_error"


class Source(Record):
    """Where a task came from: a generator (name, version, seed) or an external origin."""

    generator: str
    version: str
    seed: int | None = None
    origin: str | None = None


class Budget(Record):
    """Limits the runtime enforces for an episode (not merely rewards)."""

    max_steps: int = 20
    max_tool_calls: int = 20
    step_timeout_s: float = 10.0
    episode_timeout_s: float = 120.0
    max_action_chars: int = 8192


class Difficulty(Record):
    level: int = Field(ge=1, le=5)
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
        # The split is assigned later by the isolation stage and is not part of the content.
        content = self.model_dump(mode="json", exclude={"task_id", "split"})
        return "t-" + content_hash(content)


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

    @model_validator(mode="after")
    def _fill_rollout_id(self) -> Rollout:
        if not self.rollout_id:
            self.rollout_id = self.compute_id()
        return self

    def compute_id(self) -> str:
        """Identity, not content: the same task, env, policy, seed and attempt is the same
        rollout, so re-running a flow with the same inputs lands nothing new."""
        key = [self.task_id, self.env_id, self.env_version, self.policy_id, self.policy_version,
               self.seed, self.attempt]
        return "r-" + content_hash(key)

    @property
    def success(self) -> bool:
        return self.termination == Termination.success


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
