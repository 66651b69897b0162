"""The inventory family: authorise an order, then reserve its items (seed 002's example)."""

from envs.family import Family
from envs.inventory import generator
from envs.inventory.facts import InventoryFacts
from envs.inventory.generator import GENERATOR_VERSION
from envs.inventory.world import InventoryEnv

FAMILY = Family(
    name="inventory", env=InventoryEnv, generator=generator.generate, generator_version=GENERATOR_VERSION,
    facts=InventoryFacts, verifier="verifiers.inventory:InventoryVerifier",
    scripted_policy="envs.inventory.policy:ScriptedInventoryPolicy")
generate_task = FAMILY.generate

__all__ = ["FAMILY", "GENERATOR_VERSION", "InventoryEnv", "generate_task"]
