"""The agent-facing world. `import gymfoundry.envs` registers every family: the built-in ones found in
their folders, external ones through the `gymfoundry.families` entry points (envs/discovery.py)."""

from gymfoundry.envs.base import AgentEnv, EnvFault, ToolEnv, ToolError
from gymfoundry.envs.profile import DomainProfile, ToolSpec
from gymfoundry.envs.records import (Budget, Cost, Difficulty, Hidden, OutcomeReport, Rollout, Source, Split, Step,
                          StepScore, TaskSpec, Termination, ToolCall, ToolCategory)
from gymfoundry.envs.registry import list_envs, make, register
from gymfoundry.envs.timestep import TimeStep
from gymfoundry.envs.family import Family, HiddenFacts, families, family
from gymfoundry.envs.tools import tool
from gymfoundry.envs.discovery import discover

discover()

__all__ = [
    "AgentEnv", "Budget", "Cost", "Difficulty", "DomainProfile", "EnvFault", "Family", "Hidden", "HiddenFacts",
    "OutcomeReport", "Rollout", "Source", "Split", "Step", "StepScore", "TaskSpec", "Termination", "TimeStep", "ToolCall",
    "ToolCategory", "ToolEnv", "ToolError", "ToolSpec", "families", "family", "list_envs", "make", "register", "tool",
]

from gymfoundry.envs.check import check_family  # noqa: E402  (the conformance checker; envs/check.py)
