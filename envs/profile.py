"""DomainProfile: the declarative description of a domain, loadable from YAML.

A profile declares the tools (with JSON-schema arguments and a category), the outcome
rules a rollout must satisfy to count as a success, the score weights of the reward
layers, and which tool categories the runtime refuses without approval."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from envs.records import ToolCategory

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
        "valid_call": 0.2, "permitted": 0.3, "non_redundant": 0.1, "progress": 1.0})
    layers: dict[str, float] = Field(default_factory=lambda: {"rules": 1.0, "judge": 0.0})


class DomainProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    tools: list[ToolSpec]
    outcome_rules: list[str] = Field(default_factory=lambda: ["completed", "no_constraint_violation"])
    score_weights: ScoreWeights = Field(default_factory=ScoreWeights)
    approval_required: list[ToolCategory] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> DomainProfile:
        names = [t.name for t in self.tools]
        if len(names) != len(set(names)):
            raise ValueError(f"profile {self.name!r} declares a tool twice: {names}")
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
