"""The coding family: fix injected bugs in a small Python package, in a sandbox, graded by
hidden tests the agent never sees."""

from gymfoundry.envs.coding import generator
from gymfoundry.envs.coding.facts import CodingFacts
from gymfoundry.envs.coding.generator import GENERATOR_VERSION
from gymfoundry.envs.coding.world import CodingEnv
from gymfoundry.envs.coding.policy import ScriptedCodingPolicy
from gymfoundry.envs.coding.verifier import CodingVerifier
from gymfoundry.envs.family import Family

FAMILY = Family(
    name="coding", env=CodingEnv, generator=generator.generate, generator_version=GENERATOR_VERSION,
    facts=CodingFacts, verifier=CodingVerifier, scripted_policy=ScriptedCodingPolicy)
generate_task = FAMILY.generate

__all__ = ["FAMILY", "GENERATOR_VERSION", "CodingEnv", "CodingFacts", "generate_task"]
