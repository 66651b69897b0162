"""Tokens as sampled: ids a server returns are stored with the logprobs; without them the ids
stay empty (never rebuilt by re-tokenising the text)."""

from __future__ import annotations

import pytest

from gymfoundry.envs.records import PolicySpec
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.policies.openai import sampled_ids
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.episodes import run_episode
from tests.tasks.policy_endpoint import inventory_agent
from tests.verifiers.openai_stub import OpenAIStub


def with_ids(style: str):
    """The inventory agent's replies, carrying token ids the way vLLM does in `style`."""
    def respond(body, headers):
        status, payload = inventory_agent(body, headers)
        choice = payload["choices"][0]
        if style == "token_ids":  # return_token_ids: true
            choice["token_ids"] = [11, 12, 13]
            choice["logprobs"] = {"content": [{"token": t, "logprob": -0.5} for t in ("a", "b", "c")]}
            payload["prompt_token_ids"] = [1, 2]
        elif style == "as_token_ids":  # return_tokens_as_token_ids: true
            choice["logprobs"] = {"content": [{"token": f"token_id:{i}", "logprob": -0.1 * i} for i in (7, 8)]}
        return status, payload
    return respond


@pytest.mark.parametrize("style, ids, logprobs", [("token_ids", [11, 12, 13], [-0.5, -0.5, -0.5]),
                                                  ("as_token_ids", [7, 8], [-0.7, -0.8]),
                                                  ("strings", None, [-0.25])])
def test_rollout_steps_keep_the_ids_the_server_returned(style, ids, logprobs):
    task = generate_tasks("inventory", 1, seed=3)[0]
    with OpenAIStub(respond=with_ids(style)) as server:
        spec = PolicySpec(kind="openai", model="stub", base_url=server.base_url, options={"request_token_ids": True})
        rollout = run_episode(task, make_policy(spec, "inventory"), seed=1)
    assert len(rollout.steps) == 2
    for step in rollout.steps:
        assert step.token_ids == ids and step.logprobs == pytest.approx(logprobs)
    assert rollout.cost.tokens == (2 * len(ids) if ids else 0)
    assert all(body["return_token_ids"] is True and body["return_tokens_as_token_ids"] is True
               for body in server.requests)


def test_token_ids_are_not_requested_unless_asked():
    task = generate_tasks("inventory", 1, seed=3)[0]
    with OpenAIStub(respond=inventory_agent) as server:
        run_episode(task, make_policy(PolicySpec(kind="openai", model="stub", base_url=server.base_url),
                                      "inventory"), seed=1)
    assert server.requests and not any("return_token_ids" in b or "return_tokens_as_token_ids" in b
                                       for b in server.requests)


def test_partial_or_malformed_ids_are_dropped_not_guessed():
    tokens = lambda *ts: [{"token": t, "logprob": -1.0} for t in ts]  # noqa: E731
    assert sampled_ids({}, tokens("token_id:1", "hello")) is None        # partly ids: none at all
    assert sampled_ids({}, tokens("token_id:-1")) is None
    assert sampled_ids({"token_ids": [1, True]}, None) is None
    assert sampled_ids({"token_ids": [1, -2]}, None) is None
    assert sampled_ids({"token_ids": "1 2"}, tokens("token_id:4")) == [4]
    assert sampled_ids({"token_ids": []}, None) is None
