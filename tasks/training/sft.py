"""SFT with the agent enhancements, on TRL's SFTTrainer.

- Observation masking: the loss covers exactly the tokens inside the chat template's
  `{% generation %}` markers (assistant turns with their end-of-turn token); system, user and
  tool turns carry none. The mask comes from the template, never from re-tokenised prefixes.
- Negative-reward turns: the assistant turns a row lists in `masked_turns` (its step reward is
  negative: a success that over-reserved, then released) stay in the context and carry no loss.
- Step-weighted loss: each trained assistant turn's tokens carry the weight of that step,
  exp(reward / temperature) of its PRM step reward, mean-normalised per rollout (so a rollout's
  weights average 1 and the loss is never identically zero, even when every reward is 0).
- Trajectory chunking: a conversation longer than `max_length` is cut at step boundaries into
  chunks that each repeat the prompt (system + goal); a chunk may start with `overlap_steps`
  earlier steps as context, masked so that no step is trained twice.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from trl import SFTTrainer
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from gymfoundry.envs.records import SFTRow
from gymfoundry.tasks.policies.chat import with_tool_arguments
from gymfoundry.tasks.policies.checkpoint import tool_arguments_for

STEP_WEIGHT_TEMPERATURE = 0.25


def step_weights(rewards: list[float], temperature: float = STEP_WEIGHT_TEMPERATURE) -> list[float]:
    """Per-step loss weights of one rollout: exp(reward / temperature) divided by their mean,
    as advantage-weighted regression weighs actions. A neutral step (reward 0: a lookup that
    moves no potential) keeps about the weight of an average step, progress weighs more, a
    harmful step less; the order of the rewards is kept. All-equal rewards give all ones."""
    if not rewards:
        return []
    if temperature <= 0:
        raise ValueError(f"step weight temperature must be positive, not {temperature}")
    exps = [math.exp(max(-30.0, min(30.0, float(r) / temperature))) for r in rewards]
    mean = sum(exps) / len(exps)
    return [e / mean for e in exps]


def render_ids(tokenizer, messages: list[dict], tools: list[dict] | str | None) -> tuple[list[int], list[int]]:
    """Token ids of the conversation and its assistant mask from the template's markers, the
    tool-call arguments given as the template wants them (`tool_arguments_for`)."""
    tools = json.loads(tools) if isinstance(tools, str) else tools
    messages = with_tool_arguments(messages, tool_arguments_for(tokenizer))
    out = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def turn_spans(row: SFTRow, tokenizer) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of an SFT row and the [start, end) span of each assistant turn, checked to be
    one span per assistant message."""
    ids, mask = render_ids(tokenizer, row.messages, row.tools)
    spans = assistant_spans(mask)
    n_assistant = sum(m["role"] == "assistant" for m in row.messages)
    if len(spans) != n_assistant:
        raise ValueError(f"template marked {len(spans)} assistant spans for {n_assistant} assistant turns")
    return ids, spans


def assistant_tokens(row: SFTRow, tokenizer) -> dict[str, list[int]]:
    """An SFT row as plain TRL's SFTTrainer takes it pre-tokenised: `input_ids` and
    `assistant_masks` (TRL builds the labels from it), the `masked_turns` left out."""
    ids, spans = turn_spans(row, tokenizer)
    masked = set(row.masked_turns)
    mask = [0] * len(ids)
    for k, (a, b) in enumerate(spans):
        if k not in masked:
            mask[a:b] = [1] * (b - a)
    return {"input_ids": ids, "assistant_masks": mask}


def assistant_spans(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of ones: one per assistant turn."""
    spans, start = [], None
    for i, bit in enumerate(mask + [0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            spans.append((start, i))
            start = None
    return spans


def sft_examples(row: SFTRow, tokenizer, max_length: int | None = None, overlap_steps: int = 1,
                 weighted: bool = True, temperature: float = STEP_WEIGHT_TEMPERATURE) -> list[dict[str, list]]:
    """Trainer-ready examples (`input_ids`, `labels`, `token_weights`) of one SFT row, chunked
    at step boundaries when the conversation exceeds `max_length`."""
    ids, spans = turn_spans(row, tokenizer)
    masked = set(row.masked_turns)
    kept = [k for k in range(len(spans)) if k not in masked]
    rewards = row.step_rewards
    if weighted and len(rewards) == len(spans):
        weights = dict(zip(kept, step_weights([rewards[k] for k in kept], temperature)))
    else:
        weights = dict.fromkeys(kept, 1.0)
    prefix_end = spans[0][0] if spans else len(ids)
    # Step k's context region starts at its assistant span and runs to the next one.
    starts = [s for s, _ in spans]
    limit = max_length or len(ids)
    examples = []
    first = 0
    while first < len(spans):
        for overlap in (overlap_steps, 0):  # drop the overlap before giving up on a step
            context = max(0, first - overlap)
            last = first
            # Add steps while the chunk (prompt + context steps + trained steps, ending at the
            # last trained step's end-of-turn token) fits.
            while last < len(spans) and prefix_end + spans[last][1] - starts[context] <= limit:
                last += 1
            if last > first:
                break
        if last == first:
            first += 1  # a single step longer than max_length cannot be trained
            continue
        chunk = list(range(prefix_end)) + list(range(starts[context], spans[last - 1][1]))
        labels, token_weights = [], []
        trained = {i: k for k in range(first, last) if k in weights for i in range(*spans[k])}
        for i in chunk:
            hit = i in trained
            labels.append(ids[i] if hit else -100)
            token_weights.append(weights[trained[i]] if hit else 0.0)
        if trained:  # a chunk of masked turns only has nothing to train
            examples.append({"input_ids": [ids[i] for i in chunk], "labels": labels, "token_weights": token_weights})
        first = last
    return examples


@dataclass
class WeightedCollator:
    """TRL's language-modelling collator, plus `token_weights` padded with zeros."""

    pad_token_id: int

    def __post_init__(self):
        self.base = DataCollatorForLanguageModeling(pad_token_id=self.pad_token_id)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = self.base([{"input_ids": e["input_ids"], "labels": e["labels"]} for e in examples])
        width = batch["input_ids"].shape[1]
        batch["token_weights"] = torch.tensor(
            [list(e["token_weights"]) + [0.0] * (width - len(e["token_weights"])) for e in examples],
            dtype=torch.float32)
        return batch


def weighted_token_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum over trainable tokens of weight × cross-entropy (next-token shift), and their count."""
    targets = labels[:, 1:]
    ce = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), targets, ignore_index=-100, reduction="none")
    return (ce * weights[:, 1:]).sum(), (targets != -100).sum()


class StepWeightedSFTTrainer(SFTTrainer):
    """SFTTrainer whose per-token loss is scaled by `token_weights` (see `sft_examples`)."""

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = ["input_ids", "labels", "token_weights"]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        weights = inputs.pop("token_weights")
        labels = inputs.pop("labels")
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"), use_cache=False)
        total, count = weighted_token_loss(outputs.logits, labels, weights)
        denominator = num_items_in_batch if num_items_in_batch is not None else count
        loss = total / torch.as_tensor(denominator, device=total.device).clamp(min=1)
        with torch.no_grad():
            targets = labels[:, 1:]
            valid = targets != -100
            correct = (outputs.logits[:, :-1].argmax(-1) == targets) & valid
            mode = "train" if model.training else "eval"
            self._metrics[mode]["mean_token_accuracy"].append((correct.sum() / valid.sum().clamp(min=1)).item())
        return (loss, outputs) if return_outputs else loss
