"""Policies: the protocol, the registry (`make_policy`), the hf and openai policies, and the chat
format they share with dataset assembly."""
