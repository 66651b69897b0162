"""The conversation family: τ-style order support with a simulated customer and a written policy
(envs/conversation/policy.md). Declared once, here; found by discovery (envs/discovery.py)."""

from gymfoundry.envs.conversation.facts import ConversationFacts
from gymfoundry.envs.conversation.generator import GENERATOR_VERSION, generate
from gymfoundry.envs.conversation.world import ConversationEnv
from gymfoundry.envs.conversation.policy import ScriptedConversationPolicy
from gymfoundry.envs.conversation.verifier import ConversationVerifier
from gymfoundry.envs.family import Family

FAMILY = Family(
    name="conversation", env=ConversationEnv, generator=generate, generator_version=GENERATOR_VERSION,
    facts=ConversationFacts, verifier=ConversationVerifier, scripted_policy=ScriptedConversationPolicy)

__all__ = ["FAMILY", "ConversationEnv"]
