"""Copy pretraining of the embedded tiny base model, before it sees any factory data.

Every useful tool call copies something from the context: an item name from the goal, a SKU
from a search result, an order id, an auth token. A randomly initialised model has no
attention circuit that copies (real base models get one from pretraining on text), and SFT on
agent data alone is too sparse a signal to grow one in minutes on a CPU. A few hundred steps
on synthetic sequences give it that circuit:

- recall: `key-value` records whose values are digit / hex strings like ids, SKUs and
  tokens, then the same keys again; the loss is on the recalled values. A value is a random
  string put through the tokenizer, so it is made of the very tokens such strings become in
  agent data (a hex token splits into merges like `cfb`, `ee`, `ac`; single letters alone
  would leave those uncopyable: 73% recalled against 99.5% for single letters);
- repeats: a random token span followed by the same span; the loss is on the repeat.

No factory text is used, so nothing of the held-out tasks can leak in."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

RECALL_SHARE = 0.7
HEX_SHARE = 0.5  # of recalled values; the rest are digit strings
DIGITS, HEX = "0123456789", "0123456789abcdef"


def token_pools(tokenizer) -> dict[str, list[int]]:
    vocab = tokenizer.get_vocab()
    special = set(tokenizer.all_special_ids)
    return {"any": [i for t, i in vocab.items() if i not in special and not t.startswith("<")],
            "words": [i for t, i in vocab.items() if t.isalpha() and len(t) > 2],
            "dash": [vocab["-"]],
            "separators": [vocab[c] for c in (",", "\n", '",', "Ġ") if c in vocab]}


def random_value(rng: random.Random) -> str:
    """A string like an id, a SKU number or an auth token."""
    if rng.random() < HEX_SHARE:
        return "".join(rng.choice(HEX) for _ in range(rng.randint(6, 14)))
    return "".join(rng.choice(DIGITS) for _ in range(rng.randint(3, 12)))


def recall_sequence(pools: dict[str, list[int]], length: int, rng: random.Random,
                    encode: Callable[[str], list[int]]) -> tuple[list[int], list[int]]:
    ids, labels, records = [], [], []
    while len(ids) < length // 2:
        key = [rng.choice(pools["words"]) for _ in range(rng.randint(1, 2))]
        value = encode(random_value(rng))
        records.append((key, value))
        record = key + pools["dash"] + value + [rng.choice(pools["separators"])]
        ids += record
        labels += [-100] * len(record)
    while len(ids) < length:
        key, value = rng.choice(records)
        ids += key + pools["dash"] + value + [rng.choice(pools["separators"])]
        labels += [-100] * (len(key) + 1) + value + [-100]
    return ids[:length], labels[:length]


def repeat_sequence(pools: dict[str, list[int]], length: int, rng: random.Random) -> tuple[list[int], list[int]]:
    span = [rng.choice(pools["any"]) for _ in range(length // 2)]
    return span + span, [-100] * len(span) + span


def copy_sequences(tokenizer, n: int, length: int = 128, seed: int = 0,
                   recall_share: float = RECALL_SHARE) -> list[dict[str, list[int]]]:
    """`n` training examples (`input_ids`, `labels` with -100 where nothing can be predicted)."""
    pools = token_pools(tokenizer)
    rng = random.Random(seed)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    examples = []
    for _ in range(n):
        if rng.random() < recall_share:
            ids, labels = recall_sequence(pools, length, rng, encode)
        else:
            ids, labels = repeat_sequence(pools, length, rng)
        examples.append({"input_ids": ids, "labels": labels})
    return examples


def pretrain_copying(model, tokenizer, output_dir: str, steps: int, batch_size: int = 32, length: int = 128,
                     learning_rate: float = 1e-3, recall_share: float = RECALL_SHARE, seed: int = 0) -> dict[str, Any]:
    """Train `model` in place for `steps` steps with transformers' Trainer; returns the metrics."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments, default_data_collator

    data = Dataset.from_list(copy_sequences(tokenizer, steps * batch_size, length, seed, recall_share))
    args = TrainingArguments(output_dir=output_dir, max_steps=steps, per_device_train_batch_size=batch_size,
                             learning_rate=learning_rate, lr_scheduler_type="constant", warmup_steps=0,
                             logging_steps=max(1, steps // 10), save_strategy="no", report_to=[], use_cpu=True,
                             bf16=False, seed=seed, dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator)
    started = time.perf_counter()
    trainer.train()
    history = [(h["step"], round(h["loss"], 4)) for h in trainer.state.log_history if "loss" in h]
    return {"steps": trainer.state.global_step, "train_seconds": round(time.perf_counter() - started, 2),
            "final_loss": history[-1][1] if history else None, "loss_history": history}
