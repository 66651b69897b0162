"""The agent-facing world. Importing it loads no family: the families are found on the first
lookup (`family(name)`, `families()`), built-in ones in their folders and external ones through
the `gymfoundry.families` entry points (envs/discovery.py, installed here as the finder)."""

from gymfoundry.envs.base import AgentEnv, EnvFault, ToolEnv, ToolError
from gymfoundry.envs.errors import UnknownEnv
from gymfoundry.envs.family import Family, HiddenFacts, families, family, find_with
from gymfoundry.envs.profile import DomainProfile, ToolSpec
from gymfoundry.envs.records import (Budget, Cost, Difficulty, Hidden, OutcomeReport, Rollout, Source, Split, Step,
                                     StepScore, TaskSpec, Termination, ToolCall, ToolCategory)
from gymfoundry.envs.timestep import TimeStep
from gymfoundry.envs.tools import tool


def discover() -> list[Family]:
    """Find (again) every family: the built-in folders, the entry points, the YAML folders."""
    from gymfoundry.envs.discovery import discover as find  # local: it imports families; this package loads none

    return find()


find_with(discover)

__all__ = [
    "AgentEnv", "Budget", "Cost", "Difficulty", "DomainProfile", "EnvFault", "Family", "Hidden", "HiddenFacts",
    "OutcomeReport", "Rollout", "Source", "Split", "Step", "StepScore", "TaskSpec", "Termination", "TimeStep", "ToolCall",
    "ToolCategory", "ToolEnv", "ToolError", "ToolSpec", "UnknownEnv", "discover", "families", "family", "tool",
]
