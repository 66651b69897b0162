import json

from gymfoundry.tasks.policies.checkpoint import CHAT_TEMPLATE, load_model
from gymfoundry.tasks.training.sft import assistant_spans, render_ids


def test_builder_saves_a_model_that_loads_like_any_checkpoint(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir)
    assert model.config.model_type == "qwen3" and model.config.hidden_size == 32
    assert tokenizer.chat_template == CHAT_TEMPLATE and tokenizer.eos_token == "<|im_end|>"
    text = 'Order ORD-7 {"sku": "SKU-9"} é ✓'
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text  # byte level


def test_template_renders_every_turn_and_tool_calls(tiny_model_dir, conversation):
    _, tokenizer = load_model(tiny_model_dir)
    text = tokenizer.apply_chat_template(conversation.messages, tools=json.loads(conversation.tools),
                                         tokenize=False)
    assert text.startswith("<|im_start|>system\nSYS\nTools:\n- find_items(query)\n")
    assert ('<|im_start|>assistant\nFind it.\n<tool_call>{"name": "find_items", "arguments": '
            '{"query": "cotton clamp"}}</tool_call><|im_end|>') in text
    assert '<|im_start|>assistant\n<tool_call>{"name": "request_authorization"' in text
    assert '<|im_start|>tool\n{"ok": true}<|im_end|>' in text
    prompt = tokenizer.apply_chat_template(conversation.messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_end|><|im_start|>assistant\n")


def test_assistant_mask_covers_exactly_the_assistant_turns_and_their_end_token(tiny_model_dir, conversation):
    _, tokenizer = load_model(tiny_model_dir)
    ids, mask = render_ids(tokenizer, conversation.messages, conversation.tools)
    spans = assistant_spans(mask)
    assert len(spans) == 3
    expected = ['Find it.\n<tool_call>{"name": "find_items", "arguments": {"query": "cotton clamp"}}</tool_call>',
                '<tool_call>{"name": "request_authorization", "arguments": {"order_id": "ORD-1"}}</tool_call>',
                'Done.\n<tool_call>{"name": "submit", "arguments": {"status": "reserved"}}</tool_call>']
    eos, start = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_start|>")
    for (a, b), want in zip(spans, expected):
        assert tokenizer.decode(ids[a:b - 1]) == want
        assert ids[b - 1] == eos                      # the end-of-turn token carries loss
        assert tokenizer.decode(ids[a - 2:a]) == "assistant\n" and ids[a - 3] == start  # the header does not
        assert b == len(ids) or ids[b] == start       # nothing after the end-of-turn token does
    outside = tokenizer.decode([t for t, m in zip(ids, mask) if not m])
    for message in conversation.messages:
        if message["role"] != "assistant":
            assert message["content"] in outside
