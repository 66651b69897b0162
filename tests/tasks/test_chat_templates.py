"""Which chat template training uses: the checkpoint's own when it marks assistant turns, TRL's
training variant of it when TRL ships one, this project's compact one for the embedded model
and other ChatML tokenizers; and tool-call arguments rendered as each template wants them."""

from __future__ import annotations

import json

import pytest
from trl import chat_template_utils as trl_templates

from gymfoundry.tasks.policies.checkpoint import CHAT_TEMPLATE, load_tokenizer, template_source, tool_arguments_for
from gymfoundry.tasks.training.sft import render_ids, turn_spans

UNKNOWN = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
           "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def checkpoint_with(tiny_model_dir, tmp_path, template: str):
    """The tiny model's tokenizer saved as a checkpoint whose own template is `template`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tokenizer.chat_template = template
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_the_embedded_model_keeps_the_compact_template(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert template_source(tokenizer.chat_template) == "gymfoundry-compact"
    assert tool_arguments_for(tokenizer) == "string"  # it takes dicts too; strings render as stored


@pytest.mark.parametrize("family, arguments", [("qwen2_5", "dict"), ("qwen3", "string")])
def test_a_template_trl_knows_gets_trls_training_variant(tiny_model_dir, tmp_path, conversation, family, arguments):
    original = getattr(trl_templates, f"{family}_chat_template")
    assert not trl_templates.has_generation_markers(original)  # ChatML: this used to become the compact one
    tokenizer = load_tokenizer(checkpoint_with(tiny_model_dir, tmp_path, original))
    assert tokenizer.chat_template == getattr(trl_templates, f"{family}_training_chat_template")
    assert template_source(tokenizer.chat_template) == f"trl:{family}_training"
    assert tool_arguments_for(tokenizer) == arguments
    # Assistant-only loss works with it, and the arguments come out as one JSON object.
    ids, spans = turn_spans(conversation, tokenizer)
    assert len(spans) == 3
    first = tokenizer.decode(ids[spans[0][0]:spans[0][1]])
    assert '{"name": "find_items", "arguments": {"query": "cotton clamp"}}' in first
    assert tokenizer.decode(ids).count("<tool_response>") == 3  # Qwen's own format, not the compact one


def test_qwen25_training_template_would_double_encode_string_arguments(tiny_model_dir, tmp_path, conversation):
    tokenizer = load_tokenizer(checkpoint_with(tiny_model_dir, tmp_path, trl_templates.qwen2_5_chat_template))
    stored = tokenizer.apply_chat_template(conversation.messages, tokenize=False)
    assert '"arguments": "{\\"query\\": \\"cotton clamp\\"}"' in stored  # what render_ids avoids
    ids, _ = render_ids(tokenizer, conversation.messages, None)
    assert '"arguments": {"query": "cotton clamp"}' in tokenizer.decode(ids)


def test_an_unknown_chatml_template_gets_the_compact_one(tiny_model_dir, tmp_path):
    tokenizer = load_tokenizer(checkpoint_with(tiny_model_dir, tmp_path, UNKNOWN))
    assert tokenizer.chat_template == CHAT_TEMPLATE


def test_a_template_with_markers_is_kept(tiny_model_dir, tmp_path):
    training = trl_templates.qwen3_training_chat_template
    assert template_source(load_tokenizer(checkpoint_with(tiny_model_dir, tmp_path, training)).chat_template) \
        == "trl:qwen3_training"
    own = CHAT_TEMPLATE.replace("Tools:", "Functions:")
    assert load_tokenizer(checkpoint_with(tiny_model_dir, tmp_path, own)).chat_template == own
    assert template_source(own) == "model"


def test_an_unknown_template_without_chatml_is_refused(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(["a b c"], trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                                           show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>", pad_token="<s>")
    tokenizer.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="TRL ships no training variant"):
        load_tokenizer(tmp_path)


def test_a_training_run_records_the_template_it_used(tiny_model_dir, tmp_path, conversation):
    import shutil

    from gymfoundry.tasks.stages.assemble import write_dataset
    from gymfoundry.tasks.training.train import train

    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    checkpoint_with(tiny_model_dir, base, trl_templates.qwen2_5_chat_template)
    dataset = write_dataset([conversation], "sft-test", tmp_path)
    metrics = train(str(dataset), "sft", str(base), str(tmp_path / "out"),
                    {"max_steps": 1, "batch_size": 1, "warmup_steps": 0, "num_threads": 1,
                     "max_length": 4096})  # Qwen lists the tools in full
    assert (metrics["chat_template"], metrics["tool_arguments"]) == ("trl:qwen2_5_training", "dict")
    saved = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text()).get("chat_template")
    saved = saved or (tmp_path / "out" / "chat_template.jinja").read_text()
    assert saved == trl_templates.qwen2_5_training_chat_template
