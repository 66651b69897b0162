"""The coding family: fix injected bugs in a small Python package, in a sandbox, graded by
hidden tests the agent never sees."""

from envs.coding import generator
from envs.coding.facts import CodingFacts
from envs.coding.generator import GENERATOR_VERSION
from envs.coding.world import CodingEnv
from envs.family import Family

FAMILY = Family(
    name="coding", env=CodingEnv, generator=generator.generate, generator_version=GENERATOR_VERSION,
    facts=CodingFacts, verifier="verifiers.coding:CodingVerifier",
    scripted_policy="envs.coding.policy:ScriptedCodingPolicy")
generate_task = FAMILY.generate

__all__ = ["FAMILY", "GENERATOR_VERSION", "CodingEnv", "CodingFacts", "generate_task"]
