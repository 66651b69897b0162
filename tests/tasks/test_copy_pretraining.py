import pytest
import torch

from gymfoundry.tasks.policies.checkpoint import load_model
from gymfoundry.tasks.training.base_model import build_base_model, factory_texts
from gymfoundry.tasks.training.copy_pretraining import copy_sequences, random_value, recall_sequence, token_pools


pytestmark = pytest.mark.training  # builds and trains small models


def test_recall_labels_are_exactly_the_recalled_values(tiny_model_dir):
    import random

    _, tokenizer = load_model(tiny_model_dir)
    pools = token_pools(tokenizer)

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    ids, labels = recall_sequence(pools, 96, random.Random(3), encode)
    assert len(ids) == len(labels) == 96
    half = next(i for i, label in enumerate(labels) if label != -100)
    assert half >= 48  # nothing is predictable before the records are recalled
    labelled = [i for i, label in enumerate(labels) if label != -100]
    assert all(labels[i] == ids[i] for i in labelled)
    # values are digit / hex strings as the tokenizer splits them, merges included
    assert all(set(tokenizer.decode([ids[i]])) <= set("0123456789abcdef") for i in labelled)
    # every labelled value was shown earlier after the same key and dash
    text = ids[:half]
    for i in labelled:
        start = i
        while labels[start - 1] != -100:
            start -= 1
        value_end = start
        while value_end < len(labels) and labels[value_end] != -100:
            value_end += 1
        anchor = ids[start - 2:start]
        assert any(text[j:j + 2] == anchor and text[j + 2:j + 2 + (value_end - start)] == ids[start:value_end]
                   for j in range(len(text)))


def test_copy_pretraining_teaches_the_model_to_copy(tmp_path):
    from gymfoundry.tasks.training.copy_pretraining import pretrain_copying

    texts = factory_texts("inventory", n_tasks=8)
    model, tokenizer = load_model(build_base_model(tmp_path / "base", texts, vocab_size=400, hidden_size=64,
                                                   layers=2, heads=4))
    # Repeats of uniformly random spans: a model that does not copy cannot beat ln(vocab) ~ 5.9.
    held_out = copy_sequences(tokenizer, 16, length=64, seed=12345, recall_share=0.0)
    ids = torch.tensor([e["input_ids"] for e in held_out])
    labels = torch.tensor([e["labels"] for e in held_out])

    def loss() -> float:
        with torch.no_grad():
            return model(input_ids=ids, labels=labels).loss.item()

    before = loss()
    metrics = pretrain_copying(model, tokenizer, str(tmp_path / "run"), steps=150, length=64, recall_share=0.0)
    assert metrics["steps"] == 150 and before > 5.0
    assert loss() < 4.0


def test_recalled_values_use_the_tokenizers_merges(tiny_model_dir):
    import random

    _, tokenizer = load_model(tiny_model_dir)
    rng = random.Random(0)
    assert all(set(random_value(rng)) <= set("0123456789abcdef") for _ in range(200))
    examples = copy_sequences(tokenizer, 40, length=96, seed=1, recall_share=1.0)
    recalled = [tokenizer.decode([t]) for e in examples for t in e["labels"] if t != -100]
    # hex strings become multi-letter merges (as ids and tokens do in agent data), not only single letters
    assert any(len(t) > 1 for t in recalled) and all(set(t) <= set("0123456789abcdef") for t in recalled)
