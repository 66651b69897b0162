"""The conversation family: τ-style order support with a simulated customer and a written policy
(envs/conversation/policy.md). Declared once, here; found by `import envs`."""

from envs.conversation.facts import ConversationFacts
from envs.conversation.generator import GENERATOR_VERSION, generate
from envs.conversation.world import ConversationEnv
from envs.family import Family

FAMILY = Family(
    name="conversation", env=ConversationEnv, generator=generate, generator_version=GENERATOR_VERSION,
    facts=ConversationFacts, verifier="envs.conversation.verifier:ConversationVerifier",
    scripted_policy="envs.conversation.policy:ScriptedConversationPolicy")

__all__ = ["FAMILY", "ConversationEnv"]
