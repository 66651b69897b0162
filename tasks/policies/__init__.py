"""Policies: the protocol (base), the registry (`make_policy`), the hf and openai policies, the chat
format they share with dataset assembly (chat) and checkpoint loading: model, tokenizer, chat template."""
