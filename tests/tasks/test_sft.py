import math

import pytest
import torch

from gymfoundry.tasks.policies.checkpoint import load_model
from gymfoundry.tasks.training.curriculum import curriculum_order
from gymfoundry.tasks.training.sft import (WeightedCollator, assistant_spans, render_ids, sft_examples, step_weights,
                                weighted_token_loss)


def test_step_weights_are_mean_normalised_and_never_all_zero():
    assert step_weights([0.0, 0.0, 0.0]) == pytest.approx([1.0, 1.0, 1.0])
    weights = step_weights([0.5, -1.0, 1.0])
    assert sum(weights) / 3 == pytest.approx(1.0) and min(weights) > 0
    assert weights[2] > weights[0] > weights[1]
    # exp(r / 0.25), mean-normalised: exactly 2 / (1 + e) and 2e / (1 + e)
    assert step_weights([0.0, 0.25]) == pytest.approx([2 / (1 + math.e), 2 * math.e / (1 + math.e)])
    assert step_weights([0.0, 0.25], temperature=0.5) == pytest.approx(
        [2 / (1 + math.e ** 0.5), 2 * math.e ** 0.5 / (1 + math.e ** 0.5)])


def test_a_neutral_lookup_outweighs_a_harmful_step():
    # A lookup moves no potential (reward 0); a wrong reservation undone later costs reward.
    lookup, harmful, progress = step_weights([0.0, -0.36, 0.2])
    assert progress > lookup > 2 * harmful and lookup > 0.5


def test_labels_are_exactly_the_assistant_tokens_weighted_per_step(tiny_model_dir, conversation):
    _, tokenizer = load_model(tiny_model_dir)
    ids, mask = render_ids(tokenizer, conversation.messages, conversation.tools)
    (example,) = sft_examples(conversation, tokenizer)
    spans = assistant_spans(mask)
    # The last tool result comes after the final trained token and is dropped.
    assert example["input_ids"] == ids[:spans[-1][1]]
    trained = [i for i, label in enumerate(example["labels"]) if label != -100]
    assert trained == [i for a, b in spans for i in range(a, b)]
    weights = step_weights(conversation.step_rewards)
    for (a, b), w in zip(spans, weights):
        assert example["token_weights"][a:b] == pytest.approx([w] * (b - a))
    assert all(example["token_weights"][i] == 0 for i in range(len(example["labels"])) if i not in trained)
    unweighted = sft_examples(conversation, tokenizer, weighted=False)[0]
    assert unweighted["labels"] == example["labels"] and set(unweighted["token_weights"]) == {0.0, 1.0}


def test_step_weights_change_the_gradients(tiny_model_dir, conversation):
    model, tokenizer = load_model(tiny_model_dir)
    collate = WeightedCollator(tokenizer.pad_token_id)

    def grads(row):
        model.zero_grad()
        batch = collate(sft_examples(row, tokenizer))
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        total, count = weighted_token_loss(logits, batch["labels"], batch["token_weights"])
        (total / count).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).clone()

    flat = conversation.model_copy(update={"step_rewards": [0.0, 0.0, 0.0]})
    skewed = conversation.model_copy(update={"step_rewards": [0.05, 0.05, 1.0]})
    g_flat, g_skewed = grads(flat), grads(skewed)
    assert g_flat.abs().sum() > 0 and g_skewed.abs().sum() > 0  # never a zero loss
    assert not torch.allclose(g_flat, g_skewed, rtol=1e-3, atol=1e-7)


def test_chunks_cut_at_step_boundaries_within_max_length(tiny_model_dir, conversation):
    _, tokenizer = load_model(tiny_model_dir)
    ids, mask = render_ids(tokenizer, conversation.messages, conversation.tools)
    spans = assistant_spans(mask)
    prefix = ids[:spans[0][0]]
    step_len = max(b - a for a, b in zip([s for s, _ in spans], [s for s, _ in spans[1:]] + [spans[-1][1]]))
    max_length = len(prefix) + 2 * step_len - 1  # room for one step plus context, never for three steps
    chunks = sft_examples(conversation, tokenizer, max_length=max_length, overlap_steps=1)
    assert len(chunks) >= 2
    trained_steps = []
    for chunk in chunks:
        assert len(chunk["input_ids"]) <= max_length
        assert chunk["input_ids"][:len(prefix)] == prefix  # the goal is in every chunk
        trained = [i for i, label in enumerate(chunk["labels"]) if label != -100]
        # Trained tokens form whole assistant turns ending on the end-of-turn token.
        runs = assistant_spans([1 if label != -100 else 0 for label in chunk["labels"]])
        for a, b in runs:
            assert chunk["input_ids"][b - 1] == tokenizer.eos_token_id
        text = tokenizer.decode([chunk["input_ids"][i] for i in trained])
        trained_steps += [s for s in ("find_items", "request_authorization", "submit") if s in text]
    assert trained_steps == ["find_items", "request_authorization", "submit"]  # each step trained once
    # A later chunk carries the previous step as masked context.
    later = chunks[1]
    context = tokenizer.decode([t for t, label in zip(later["input_ids"], later["labels"]) if label == -100])
    assert "<tool_call>" in context


def test_curriculum_starts_easy_then_follows_the_weights():
    levels = [1] * 5 + [3] * 5 + [5] * 5
    weights = [1.0] * 5 + [1.0] * 5 + [4.0] * 5
    order = curriculum_order(weights, levels, 2000, seed=0, warmup_fraction=0.5)
    assert all(levels[i] == 1 for i in order[:100])
    late = order[1000:]
    share_hard = sum(levels[i] == 5 for i in late) / len(late)
    assert share_hard == pytest.approx(4 / 6, abs=0.05)
    first_half_mean = sum(levels[i] for i in order[:1000]) / 1000
    assert first_half_mean < sum(levels[i] for i in late) / len(late)


def test_a_non_positive_step_weight_temperature_is_refused_before_training():
    from gymfoundry.tasks.training.train import Hyperparameters

    with pytest.raises(ValueError, match="step_weight_temperature must be positive"):
        Hyperparameters.from_dict({"step_weight_temperature": 0})
