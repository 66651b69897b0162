"""The orchestrator family: delegate whole sub-tasks of other families to frozen sub-agents in
parallel stages (envs/delegation.py), retry what failed, finish when all succeeded."""

from gymfoundry.envs.family import Family

from .facts import OrchestratorFacts
from .generator import GENERATOR_VERSION, generate
from .policy import ScriptedOrchestratorPolicy
from .verifier import OrchestratorVerifier
from .world import OrchestratorEnv

FAMILY = Family(
    name="orchestrator", env=OrchestratorEnv, generator=generate, generator_version=GENERATOR_VERSION,
    facts=OrchestratorFacts, verifier=OrchestratorVerifier, scripted_policy=ScriptedOrchestratorPolicy)
generate_task = FAMILY.generate

__all__ = ["FAMILY", "GENERATOR_VERSION", "OrchestratorEnv", "generate_task"]
