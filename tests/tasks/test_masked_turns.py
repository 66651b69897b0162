"""SFT rows list their negative-reward turns (`masked_turns`); this project's SFT trainer and
plain TRL (through `assistant_tokens`) keep those turns as context and out of the loss."""

from __future__ import annotations

import pytest

from gymfoundry.envs.records import SFTRow
from gymfoundry.tasks.policies.checkpoint import load_model
from gymfoundry.tasks.training.sft import assistant_tokens, sft_examples, step_weights, turn_spans


@pytest.fixture
def over_reserved(conversation):
    """The conversation whose second turn lost reward (say, a reservation undone later)."""
    return conversation.model_copy(update={"step_rewards": [0.5, -0.3, 1.0], "masked_turns": [1]})


def test_the_sft_loss_leaves_out_exactly_the_masked_turn(tiny_model_dir, over_reserved):
    _, tokenizer = load_model(tiny_model_dir)
    ids, spans = turn_spans(over_reserved, tokenizer)
    (example,) = sft_examples(over_reserved, tokenizer)
    assert example["input_ids"] == ids[:spans[-1][1]]  # the masked turn stays as context
    trained = [i for i, label in enumerate(example["labels"]) if label != -100]
    assert trained == [i for k in (0, 2) for i in range(*spans[k])]
    (a, b) = spans[1]
    assert example["token_weights"][a:b] == [0.0] * (b - a)
    kept = step_weights([0.5, 1.0])  # normalised over the turns that are trained
    assert example["token_weights"][spans[0][0]] == pytest.approx(kept[0])
    assert example["token_weights"][spans[2][0]] == pytest.approx(kept[1])
    unmasked = sft_examples(over_reserved.model_copy(update={"masked_turns": []}), tokenizer)[0]
    assert [i for i, label in enumerate(unmasked["labels"]) if label != -100] == \
        [i for a, b in spans for i in range(a, b)]


def test_a_chunk_of_masked_turns_only_is_not_an_example(tiny_model_dir, over_reserved):
    _, tokenizer = load_model(tiny_model_dir)
    ids, spans = turn_spans(over_reserved, tokenizer)
    chunks = sft_examples(over_reserved, tokenizer, max_length=spans[0][1] + 8, overlap_steps=0)  # a turn each
    trained = [[label for label in c["labels"] if label != -100] for c in chunks]
    assert trained == [ids[slice(*spans[0])], ids[slice(*spans[2])]]  # turn 1's chunk would train nothing
    assert sft_examples(over_reserved.model_copy(update={"masked_turns": [0, 1, 2]}), tokenizer) == []


def test_plain_trl_sft_trainer_leaves_out_the_masked_turn(tiny_model_dir, over_reserved, tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    model, tokenizer = load_model(tiny_model_dir)
    ids, spans = turn_spans(over_reserved, tokenizer)
    dataset = Dataset.from_list([over_reserved.model_dump()]).map(
        lambda row: assistant_tokens(SFTRow.model_validate(row), tokenizer), remove_columns=list(SFTRow.model_fields))
    trainer = SFTTrainer(model=model, train_dataset=dataset, processing_class=tokenizer,
                         args=SFTConfig(output_dir=str(tmp_path), max_steps=1, use_cpu=True, bf16=False,
                                        report_to=[], dataset_num_proc=None, disable_tqdm=True, max_length=None))
    labels = trainer.train_dataset[0]["labels"]
    assert trainer.train_dataset[0]["input_ids"] == ids
    assert [i for i, label in enumerate(labels) if label != -100] == [i for k in (0, 2) for i in range(*spans[k])]
