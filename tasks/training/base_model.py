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

from gymfoundry.envs.records import Split
from gymfoundry.tasks.policies.checkpoint import CHAT_TEMPLATE, TURN_END, TURN_START
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.episodes import run_episode
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.stages.isolate import HOLDOUT_FRACTION, tasks_of_split
from gymfoundry.tasks.training.copy_pretraining import pretrain_copying

PAD = "<|endoftext|>"
TOOL_TAGS = ["<tool_call>", "</tool_call>"]

def text_tasks(family: str = "inventory", n_tasks: int = 200, seed: int = 0,
               known: Mapping[str, Any] | None = None,
               holdout_fraction: float | Mapping[str, float] | None = None) -> list[tuple[int, Any]]:
    """(index among the `n_tasks` generated, task) of the tasks whose text `factory_texts` uses:
    the train tasks, as the split authority decides with the splits and holdout fractions a
    warehouse recorded (`known`, template_id -> split; `holdout_fraction`, family -> fraction).
    The holdout never enters training, tokenizer included."""
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
        metrics = pretrain_copying(model, tokenizer, str(out / "copy-pretraining"), copy_steps, seed=seed)
        (out / "copy_pretraining.json").write_text(json.dumps(metrics))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
