"""The inventory family: authorise an order, then reserve its items (seed 002's example)."""

from gymfoundry.envs.inventory.policy import ScriptedInventoryPolicy
from gymfoundry.envs.inventory.verifier import InventoryVerifier
from gymfoundry.envs.family import Family
from gymfoundry.envs.inventory import generator
from gymfoundry.envs.inventory.facts import InventoryFacts
from gymfoundry.envs.inventory.generator import GENERATOR_VERSION
from gymfoundry.envs.inventory.world import InventoryEnv

FAMILY = Family(
    name="inventory", env=InventoryEnv, generator=generator.generate, generator_version=GENERATOR_VERSION,
    facts=InventoryFacts, verifier=InventoryVerifier, scripted_policy=ScriptedInventoryPolicy)
generate_task = FAMILY.generate

__all__ = ["FAMILY", "GENERATOR_VERSION", "InventoryEnv", "generate_task"]
