"""The coding family: fix injected bugs in a small Python package, in a sandbox, graded by
hidden tests the agent never sees."""

from envs.coding.generator import GENERATOR_VERSION, generate_task
from envs.coding.world import CodingEnv

__all__ = ["GENERATOR_VERSION", "CodingEnv", "generate_task"]
