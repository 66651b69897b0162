"""The advisory family: recommend a savings or insurance product that suits a client (a
simulated person who tells their risk tolerance, horizon, budget and exclusions only when
asked), with structured disclosures and no prohibited claim; or "none" when nothing suits."""

from gymfoundry.envs.family import Family

from .facts import AdvisoryFacts
from .generator import GENERATOR_VERSION, generate
from .policy import ScriptedAdvisoryPolicy
from .verifier import AdvisoryVerifier
from .world import AdvisoryEnv

FAMILY = Family(
    name="advisory", env=AdvisoryEnv, generator=generate, generator_version=GENERATOR_VERSION,
    facts=AdvisoryFacts, verifier=AdvisoryVerifier, scripted_policy=ScriptedAdvisoryPolicy)
generate_task = FAMILY.generate

__all__ = ["FAMILY", "GENERATOR_VERSION", "AdvisoryEnv", "generate_task"]
