"""The engineering family: incident response on a simulated fleet of services, with the
irreversible actions (delete_data, drop_queue, rotate_credentials) behind approvals that the
runtime enforces and a hidden approver grants only when the state warrants them."""

from gymfoundry.envs.family import Family

from .facts import EngineeringFacts
from .generator import GENERATOR_VERSION, generate
from .policy import ScriptedEngineeringPolicy
from .verifier import EngineeringVerifier
from .world import EngineeringEnv

FAMILY = Family(
    name="engineering", env=EngineeringEnv, generator=generate, generator_version=GENERATOR_VERSION,
    facts=EngineeringFacts, verifier=EngineeringVerifier, scripted_policy=ScriptedEngineeringPolicy)
generate_task = FAMILY.generate

__all__ = ["FAMILY", "GENERATOR_VERSION", "EngineeringEnv", "generate_task"]
