"""A tiny causal LM and tokenizer built offline (no downloads), to check that datasets load into
TRL's trainers exactly as written."""

from __future__ import annotations

from collections.abc import Iterable

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Assistant turns, end-of-turn token included, sit inside {% generation %} for assistant-only loss.
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>tools\n{% for t in tools %}{{ t.function.name if t.function is defined else t.name }} "
    "{% endfor %}<|im_end|>\n{% endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}<|im_start|>assistant\n{% generation %}{{ m.content or '' }}"
    "{%- if m.tool_calls %}{% for tc in m.tool_calls %}<tool_call>{{ tc.function.name }} "
    "{{ tc.function.arguments }}</tool_call>{% endfor %}{% endif %}<|im_end|>{% endgeneration %}\n"
    "{%- else -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)


def tiny_tokenizer(texts: Iterable[str], vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=None, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_model(vocab_size: int):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=4096,
                         tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(config)
