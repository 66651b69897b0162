import json

import httpx
import pytest

from gymfoundry import envs
from gymfoundry.envs.records import Termination
from gymfoundry.tasks.policies.hf import HFPolicy, family_tools
from gymfoundry.tasks.policies.openai import OpenAIPolicy
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.episodes import run_episode


@pytest.fixture(scope="module")
def task():
    return envs.family("inventory").generate(seed=3, level=1)


def test_hf_policy_plays_an_episode_keeping_sampled_tokens(tiny_model_dir, task):
    policy = make_policy("hf", "inventory", model=str(tiny_model_dir), max_new_tokens=6, temperature=1.0)
    assert isinstance(policy, HFPolicy) and policy.policy_id == f"hf:{tiny_model_dir.name}"
    rollout = run_episode(task, policy, seed=5)
    assert rollout.steps and rollout.termination != Termination.policy_error
    for step in rollout.steps:
        assert step.token_ids and len(step.token_ids) == len(step.logprobs) <= 6
        assert all(lp <= 0 for lp in step.logprobs) and step.policy_version == policy.version
    # The context holds the sampled ids verbatim, never a re-tokenisation of the text.
    context = policy.context
    for step in rollout.steps:
        ids = step.token_ids
        assert any(context[i:i + len(ids)] == ids for i in range(len(context) - len(ids) + 1))
    assert rollout.cost.tokens == sum(len(s.token_ids) for s in rollout.steps)


def test_hf_policy_context_matches_the_template_render(tiny_model_dir, task):
    policy = HFPolicy(tiny_model_dir, family_tools("inventory"), max_new_tokens=4)
    replies = iter(['Find it.\n<tool_call>{"name": "find_items", "arguments": {"query": "x"}}</tool_call>',
                    "no call here"])

    def scripted():
        ids = policy.tokenizer(next(replies), add_special_tokens=False)["input_ids"] + [policy.tokenizer.eos_token_id]
        return ids, [0.0] * len(ids)

    policy._generate = scripted
    policy.reset(0)
    env = envs.family(task.env_id).make()
    ts = env.reset(task=task)
    out = policy.act(ts.observation)
    ts = env.step(out.text)
    assert ts.info["tool_call"].name == "find_items"      # parsed by the env
    policy.act(ts.observation)
    assert policy.messages[2]["tool_calls"][0]["function"]["name"] == "find_items"
    assert policy.messages[3]["role"] == "tool" and policy.messages[-1]["role"] == "assistant"
    rendered = policy.tokenizer.apply_chat_template(policy.messages, tools=policy.tools, tokenize=False)
    assert policy.tokenizer.decode(policy.context) == rendered


def test_openai_policy_turns_tool_calls_into_actions(task):
    requests = []

    def handler(request):
        body = json.loads(request.content)
        requests.append(body)
        call = {"id": "call_1", "type": "function",
                "function": {"name": "find_items", "arguments": json.dumps({"query": "cotton clamp"})}}
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": "Look it up.",
                                                                  "tool_calls": [call]},
                                                      "logprobs": {"content": [{"token": "x", "logprob": -0.5}]}}]})

    policy = OpenAIPolicy("stub-model", family_tools("inventory"), base_url="http://stub/v1",
                          transport=httpx.MockTransport(handler))
    policy.reset(1)
    env = envs.family(task.env_id).make()
    ts = env.reset(task=task)
    out = policy.act(ts.observation)
    ts = env.step(out.text)
    assert ts.info["tool_call"].name == "find_items" and out.thought == "Look it up." and out.logprobs == [-0.5]
    policy.act(ts.observation)
    second = requests[1]["messages"]
    assert second[-1] == {"role": "tool", "tool_call_id": "call_1", "content": ts.observation}
    assert requests[0]["tools"][0]["function"]["name"] == "find_items" and requests[0]["seed"] == 1


def test_openai_policy_needs_an_endpoint(monkeypatch):
    monkeypatch.delenv("GYMFOUNDRY_POLICY_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="GYMFOUNDRY_POLICY_BASE_URL"):
        OpenAIPolicy("m")
