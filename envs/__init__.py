"""The agent-facing world. `import envs` registers every built-in environment."""

from envs.base import AgentEnv, EnvFault, ToolEnv, ToolError
from envs.profile import DomainProfile, ToolSpec
from envs.records import (Budget, Cost, Difficulty, Hidden, OutcomeReport, Rollout, Source, Split, Step,
                          StepScore, TaskSpec, Termination, ToolCall, ToolCategory)
from envs.registry import list_envs, make, register
from envs.timestep import TimeStep

register("gymfoundry/inventory-v0", "envs.inventory.world:InventoryEnv",
         verifier="verifiers.inventory:InventoryVerifier",
         scripted_policy="envs.inventory.policy:ScriptedInventoryPolicy")
register("gymfoundry/coding-v0", "envs.coding.world:CodingEnv",
         verifier="verifiers.coding:CodingVerifier",
         scripted_policy="envs.coding.policy:ScriptedCodingPolicy")

__all__ = [
    "AgentEnv", "Budget", "Cost", "Difficulty", "DomainProfile", "EnvFault", "Hidden", "OutcomeReport",
    "Rollout", "Source", "Split", "Step", "StepScore", "TaskSpec", "Termination", "TimeStep", "ToolCall",
    "ToolCategory", "ToolEnv", "ToolError", "ToolSpec", "list_envs", "make", "register",
]

from envs.check import check_family  # noqa: E402  (the conformance checker; envs/check.py)
