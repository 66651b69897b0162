import json

import pytest

from gymfoundry.envs.records import SFTRow
from gymfoundry.tasks.training.base_model import build_base_model, factory_texts


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The embedded default at its smallest: tokenizer from 12 tasks' text, hidden size 32, 1 layer."""
    out = tmp_path_factory.mktemp("tiny-base")
    return build_base_model(out, factory_texts("inventory", n_tasks=12), vocab_size=400, hidden_size=32, layers=1,
                            heads=2)


def tool_call(name, arguments, call_id):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


@pytest.fixture
def conversation():
    """An SFT row as `gymfoundry.tasks.stages.assemble` writes it: three assistant steps with their tool results."""
    messages = [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": 'Order ORD-1 needs:\n- 1 x "cotton clamp"'},
        {"role": "assistant", "content": "Find it.", "tool_calls": [tool_call("find_items", {"query": "cotton clamp"}, "c0")]},
        {"role": "tool", "name": "find_items", "tool_call_id": "c0",
         "content": '{"ok": true, "result": {"items": [{"name": "cotton clamp", "sku": "SKU-193"}]}}'},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("request_authorization", {"order_id": "ORD-1"}, "c1")]},
        {"role": "tool", "name": "request_authorization", "tool_call_id": "c1",
         "content": '{"ok": true, "result": {"auth_token": "AUTH-1", "status": "approved"}}'},
        {"role": "assistant", "content": "Done.", "tool_calls": [tool_call("submit", {"status": "reserved"}, "c2")]},
        {"role": "tool", "name": "submit", "tool_call_id": "c2", "content": '{"ok": true}'},
    ]
    from gymfoundry import envs

    tools = envs.family("inventory").tool_schemas()
    return SFTRow(messages=messages, tools=json.dumps(tools), step_rewards=[0.5, 0.0, 1.0],
                  rollout_id="r-1", task_id="t-1", task_family="inventory", difficulty=1)
