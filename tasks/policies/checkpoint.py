"""A model checkpoint as the policies and the trainers load it: model and tokenizer from a local
directory (the embedded default base model, tasks/training/base_model.py, or any HF checkpoint),
its chat template made trainable (`{% generation %}` markers), named, and asked how it wants
tool-call arguments. The compact ChatML template of the embedded model is defined here."""

from __future__ import annotations

from pathlib import Path

TURN_START, TURN_END = "<|im_start|>", "<|im_end|>"

# Renders system/user/assistant/tool turns. Tools are listed compactly (name and argument
# names) because the goal already explains them and a tiny model pays for every token.
# Assistant turns, their end-of-turn token included, sit inside {% generation %} so that
# `return_assistant_tokens_mask` marks exactly the tokens the model must learn to emit.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}"
    "{%- if messages and messages[0].role == 'system' -%}{%- set ns.system = messages[0].content -%}"
    "{%- set rest = messages[1:] -%}{%- else -%}{%- set rest = messages -%}{%- endif -%}"
    "<|im_start|>system\n{{ ns.system }}"
    "{%- if tools %}{{ '\\nTools:' }}{% for t in tools %}{% set f = t.function if t.function is defined else t %}"
    "{{ '\\n- ' }}{{ f.name }}({{ (f.parameters.properties if f.parameters is defined else {}).keys() | join(', ') }})"
    "{%- endfor %}{%- endif %}<|im_end|>"
    "{%- for m in rest -%}"
    "{%- if m.role == 'assistant' -%}<|im_start|>assistant\n{% generation %}"
    "{{- m.content if m.content else '' -}}"
    "{%- if m.tool_calls -%}{%- for tc in m.tool_calls -%}"
    "{%- set f = tc.function if tc.function is defined else tc -%}"
    "{%- if m.content or not loop.first %}{{ '\\n' }}{% endif -%}"
    "<tool_call>{\"name\": \"{{ f.name }}\", \"arguments\": "
    "{{- ' ' ~ (f.arguments if f.arguments is string else f.arguments | tojson) -}}}</tool_call>"
    "{%- endfor -%}{%- endif -%}<|im_end|>{% endgeneration %}"
    "{%- else -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    ensure_generation_template(tokenizer)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(path: str | Path, dtype=None):
    """Model and tokenizer from a local directory (the embedded default or any HF checkpoint)."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32)
    return model, tokenizer


def ensure_generation_template(tokenizer) -> None:
    """Assistant-only loss needs `{% generation %}` markers. A template that has them is kept.
    One without them that TRL knows (TRL matches the template text exactly against the
    originals it ships) gets TRL's training variant of it, the model's own format with markers
    added; any other ChatML tokenizer gets this project's compact template; others must bring
    one. `template_source` names the result."""
    from jinja2 import TemplateError
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    if tokenizer.chat_template and has_generation_markers(tokenizer.chat_template):
        return
    if tokenizer.chat_template:
        try:
            training = get_training_chat_template(tokenizer)
        except (ValueError, TemplateError):  # TRL ships no training variant of this template
            training = None
        if training:
            tokenizer.chat_template = training
            return
    vocab = tokenizer.get_vocab()
    if TURN_START in vocab and TURN_END in vocab:
        tokenizer.chat_template = CHAT_TEMPLATE
        return
    raise ValueError("the tokenizer's chat template has no {% generation %} markers, TRL ships no training "
                     "variant of it and it is not ChatML; set tokenizer.chat_template to one that marks "
                     "assistant turns")


def template_source(template: str | dict | None) -> str:
    """Where a chat template comes from: "gymfoundry-compact" (this project's), "trl:<name>"
    (a training template TRL ships), else "model" (the checkpoint's own)."""
    from trl import chat_template_utils

    if template == CHAT_TEMPLATE:
        return "gymfoundry-compact"
    for name, text in vars(chat_template_utils).items():
        if name.endswith("_training_chat_template") and text == template:
            return "trl:" + name.removesuffix("_chat_template")
    return "model"


_ARGUMENT_FORMS: dict[str, str] = {}
_PROBE = [{"role": "user", "content": "hi"},
          {"role": "assistant", "content": "", "tool_calls": [
              {"type": "function", "function": {"name": "probe", "arguments": '{"probe_key": 1}'}}]}]


def tool_arguments_for(tokenizer) -> str:
    """How the tokenizer's chat template wants tool-call arguments: "dict" when it JSON-encodes
    them itself (a JSON string would come out encoded twice) or refuses a string, else "string"."""
    from jinja2 import TemplateError

    key = str(tokenizer.chat_template)
    if key not in _ARGUMENT_FORMS:
        try:
            text = tokenizer.apply_chat_template(_PROBE, tokenize=False)
            _ARGUMENT_FORMS[key] = "dict" if '\\"probe_key\\"' in text else "string"
        except (TemplateError, TypeError, ValueError):
            _ARGUMENT_FORMS[key] = "dict"
    return _ARGUMENT_FORMS[key]
