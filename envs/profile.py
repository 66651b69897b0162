"""DomainProfile: the declarative description of a domain, loadable from YAML.

A profile declares the tools (with JSON-schema arguments and a category), the outcome
rules a rollout must satisfy to count as a success, the score weights of the reward
layers, and which tool categories the runtime refuses without approval."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gymfoundry.envs.records import FAMILY_NAME, ToolCategory

OUTCOME_RULES = ("completed", "no_regression", "no_constraint_violation", "no_side_effects")


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    category: ToolCategory
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    def function_schema(self) -> dict[str, Any]:
        """OpenAI / chat-template style tool definition."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": self.parameters}}


class ScoreWeights(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rules: dict[str, float] = Field(default_factory=lambda: {
        "valid_call": 0.2, "permitted": 0.3, "non_redundant": 0.1, "no_undo": 0.2, "information_use": 0.2,
        "progress": 1.0, "injection_attempt": 1.0})
    # Step reward = Σ w·layer score / Σ w over the layers that scored the step (a judge that is
    # not configured or failed contributes nothing).
    layers: dict[str, float] = Field(default_factory=lambda: {"rules": 1.0, "judge": 0.5})

    @model_validator(mode="after")
    def _check(self) -> ScoreWeights:
        unknown = set(self.layers) - {"rules", "judge"}
        if unknown or any(w < 0 for w in self.layers.values()):
            raise ValueError(f"layer weights must be non-negative, for rules and judge only: {self.layers}")
        if any(w < 0 for w in self.rules.values()):  # a negative weight would reward a penalty
            raise ValueError(f"rule weights must be non-negative: {self.rules}")
        return self


class UndoRule(BaseModel):
    """A successful call of the owning tool reverts an earlier successful call of `reverts` in the
    same rollout when its argument `argument` equals that call's `matches` value
    (`result.<field>` of the earlier result, or `arguments.<field>` of the earlier call)."""

    model_config = ConfigDict(extra="forbid")

    reverts: str
    argument: str
    matches: str = Field(pattern=r"^(result|arguments)\.[A-Za-z_][A-Za-z0-9_]*$")


class RubricDimension(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=FAMILY_NAME)
    description: str
    weight: float = Field(default=1.0, gt=0)


class JudgeRubric(BaseModel):
    """What the LLM judge grades a step on; each dimension is scored in [-1, 1]."""

    model_config = ConfigDict(extra="forbid")

    instructions: str = ""
    dimensions: list[RubricDimension] = Field(min_length=1)


class DomainProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    tools: list[ToolSpec]
    outcome_rules: list[str] = Field(default_factory=lambda: ["completed", "no_constraint_violation"])
    score_weights: ScoreWeights = Field(default_factory=ScoreWeights)
    approval_required: list[ToolCategory] = Field(default_factory=list)
    # PRM rule layer: which write reverts which earlier write (tool -> rule), and which arguments
    # must carry values the agent has seen (tool -> scalar argument names; none unless declared).
    undoes: dict[str, UndoRule] = Field(default_factory=dict)
    grounded_arguments: dict[str, list[str]] | None = None
    judge_rubric: JudgeRubric | None = None
    # Tool refusal kinds the rule layer scores as a refused permission (`permitted` -1), like the
    # runtime's own permission_denied: the tool said no because the call was not the agent's to make.
    permission_refusals: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> DomainProfile:
        names = [t.name for t in self.tools]
        if len(names) != len(set(names)):
            raise ValueError(f"profile {self.name!r} declares a tool twice: {names}")
        named = set(self.undoes) | {r.reverts for r in self.undoes.values()} | set(self.grounded_arguments or {})
        if named - set(names):
            raise ValueError(f"profile {self.name!r}: undoes / grounded_arguments name unknown tools "
                             f"{sorted(named - set(names))}")
        unknown = set(self.outcome_rules) - set(OUTCOME_RULES)
        if unknown:
            raise ValueError(f"profile {self.name!r}: unknown outcome rules {sorted(unknown)}; "
                             f"known: {list(OUTCOME_RULES)}")
        return self

    @classmethod
    def from_yaml(cls, path: str | Path) -> DomainProfile:
        with open(path, encoding="utf-8") as fh:
            return cls.model_validate(yaml.safe_load(fh))

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)

    def category(self, name: str) -> ToolCategory | None:
        spec = self.tool(name)
        return spec.category if spec else None

    def function_schemas(self, allowed: list[str] | None = None) -> list[dict[str, Any]]:
        return [t.function_schema() for t in self.tools if allowed is None or t.name in allowed]

    def grounded(self, tool: str) -> list[str]:
        """Arguments of `tool` whose values should come from earlier observations (none unless
        declared: free text such as a note or new file content is never seen before)."""
        return list((self.grounded_arguments or {}).get(tool, []))
