"""The agent-facing world. `import envs` registers every family: the built-in ones found in
their folders, external ones through the `gymfoundry.families` entry points (envs/discovery.py)."""

from envs.base import AgentEnv, EnvFault, ToolEnv, ToolError
from envs.profile import DomainProfile, ToolSpec
from envs.records import (Budget, Cost, Difficulty, Hidden, OutcomeReport, Rollout, Source, Split, Step,
                          StepScore, TaskSpec, Termination, ToolCall, ToolCategory)
from envs.registry import list_envs, make, register
from envs.timestep import TimeStep
from envs.family import Family, HiddenFacts, families, family
from envs.tools import tool
from envs.discovery import discover

discover()

__all__ = [
    "AgentEnv", "Budget", "Cost", "Difficulty", "DomainProfile", "EnvFault", "Family", "Hidden", "HiddenFacts",
    "OutcomeReport", "Rollout", "Source", "Split", "Step", "StepScore", "TaskSpec", "Termination", "TimeStep", "ToolCall",
    "ToolCategory", "ToolEnv", "ToolError", "ToolSpec", "families", "family", "list_envs", "make", "register", "tool",
]

from envs.check import check_family  # noqa: E402  (the conformance checker; envs/check.py)
