"""The embedded default base model, built offline: a byte-level BPE tokenizer trained on
factory text, a chat template with `{% generation %}` markers, and a tiny causal LM from a
Qwen3 config. Any local model directory (or hub id, where downloads are allowed) loads the
same way through `load_model`."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

PAD, TURN_START, TURN_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TOOL_TAGS = ["<tool_call>", "</tool_call>"]

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


def text_tasks(family: str = "inventory", n_tasks: int = 200, seed: int = 0,
               known: Mapping[str, Any] | None = None,
               holdout_fraction: float | Mapping[str, float] | None = None) -> list[tuple[int, Any]]:
    """(index among the `n_tasks` generated, task) of the tasks whose text `factory_texts` uses:
    the train tasks, as the split authority decides with the splits and holdout fractions a
    warehouse recorded (`known`, template_id -> split; `holdout_fraction`, family -> fraction).
    The holdout never enters training, tokenizer included."""
    from gymfoundry.envs.records import Split
    from gymfoundry.tasks.stages.generate import generate_tasks
    from gymfoundry.tasks.stages.isolate import HOLDOUT_FRACTION, tasks_of_split

    generated = generate_tasks(family, n_tasks, seed)
    fraction = HOLDOUT_FRACTION if holdout_fraction is None else holdout_fraction
    train = {t.task_id for t in tasks_of_split(generated, Split.train, known, fraction)}
    return [(i, t) for i, t in enumerate(generated) if t.task_id in train]


def factory_texts(family: str = "inventory", n_tasks: int = 200, seed: int = 0,
                  known: Mapping[str, Any] | None = None,
                  holdout_fraction: float | Mapping[str, float] | None = None) -> list[str]:
    """Text the factory produces for `family`: goals, tool schemas, and what the family's
    scripted policy writes (thoughts and calls) with the observations it gets back, for the
    `text_tasks` only."""
    from gymfoundry.tasks.policies.registry import make_policy
    from gymfoundry.tasks.rollout.episodes import run_episode

    policy = make_policy("scripted", family, mistake_rate=0.1)
    texts = []
    for i, task in text_tasks(family, n_tasks, seed, known, holdout_fraction):
        texts.append(task.goal)
        texts.append(json.dumps(task.allowed_tools))
        for step in run_episode(task, policy, seed=seed + i).steps:
            texts += [step.observation, step.thought or ""]
            if step.tool_call is not None:
                texts.append(json.dumps({"name": step.tool_call.name, "arguments": step.tool_call.arguments},
                                        sort_keys=True))
            texts.append(step.result)
    return texts


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048):
    """A byte-level BPE tokenizer (GPT-2 style bytes, so any text round-trips) wrapped as a
    transformers fast tokenizer with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # Spaces as tokens of their own and digits one by one: a name, SKU or id then tokenises the
    # same wherever it appears (after a space, a quote or a dash), so taking it from the goal or
    # an observation into a call is copying tokens, which a tiny model learns early.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="isolated"), pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, TURN_START, TURN_END, *TOOL_TAGS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    roles = [f"{role}\n" for role in ("system", "user", "assistant", "tool")] * 100
    tokenizer.train_from_iterator(list(texts) + roles, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD, eos_token=TURN_END,
                                      bos_token=None, unk_token=None, additional_special_tokens=[TURN_START])
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.padding_side = "left"  # generation pads on the left; the trainers pad themselves
    return wrapped


def build_base_model(out_dir: str | Path, texts: Iterable[str] | None = None, *, family: str = "inventory",
                     vocab_size: int = 2048, hidden_size: int = 128, layers: int = 4, heads: int = 4,
                     intermediate_size: int | None = None, max_positions: int = 4096, copy_steps: int = 0,
                     seed: int = 0, known_splits: Mapping[str, Any] | None = None,
                     holdout_fraction: float | Mapping[str, float] | None = None) -> Path:
    """Train the tokenizer (on `texts`, else on `factory_texts` of `family` with the recorded
    `known_splits` and `holdout_fraction`, so on no holdout task's text), create a randomly initialised Qwen3 causal LM,
    give it `copy_steps` of copy pretraining (`tasks/training/copy_pretraining.py`) and save both
    with `save_pretrained` under `out_dir` (the pretraining metrics in `copy_pretraining.json`).
    Returns the directory."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    if texts is None:
        texts = factory_texts(family, known=known_splits, holdout_fraction=holdout_fraction)
    tokenizer = train_tokenizer(texts, vocab_size)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size or 3 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        head_dim=hidden_size // heads, max_position_embeddings=max_positions, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        use_cache=True)
    torch.manual_seed(seed)
    random.seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=False)
    out.mkdir(parents=True, exist_ok=True)
    if copy_steps:
        from gymfoundry.tasks.training.copy_pretraining import pretrain_copying

        metrics = pretrain_copying(model, tokenizer, str(out / "copy-pretraining"), copy_steps, seed=seed)
        (out / "copy_pretraining.json").write_text(json.dumps(metrics))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


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
