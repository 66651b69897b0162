"""The discussion family: moderate a group of simulated participants (envs.person) choosing among
options, each with a hidden score table, a threshold below which they reject a decision, and a
confidential reason told only when asked; decide an option everyone accepts, or "none" when no
option can, without repeating a confidential reason or claiming a stance nobody stated."""

from gymfoundry.envs.family import Family

from .facts import DiscussionFacts
from .generator import GENERATOR_VERSION, generate
from .policy import ScriptedDiscussionPolicy
from .verifier import DiscussionVerifier
from .world import DiscussionEnv

FAMILY = Family(
    name="discussion", env=DiscussionEnv, generator=generate, generator_version=GENERATOR_VERSION,
    facts=DiscussionFacts, verifier=DiscussionVerifier, scripted_policy=ScriptedDiscussionPolicy)
generate_task = FAMILY.generate

__all__ = ["FAMILY", "GENERATOR_VERSION", "DiscussionEnv", "generate_task"]
