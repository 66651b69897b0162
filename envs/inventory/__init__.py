"""The inventory family: authorise an order, then reserve its items (seed 002's example)."""

from envs.inventory.generator import GENERATOR_VERSION, generate_task
from envs.inventory.world import InventoryEnv

__all__ = ["GENERATOR_VERSION", "InventoryEnv", "generate_task"]
