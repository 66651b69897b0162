"""An upstream model for harness tests, on the OpenAIStub: a correct inventory agent.

It is stateless: each request replays the family's scripted policy (no mistakes) over the
conversation it carries (the user message with the goal, then every tool result), and answers
with the policy's next call as an OpenAI tool call; once it has submitted, it answers "Done."
Each reply carries token ids and logprobs the way vLLM returns them, so tests can check they
are kept as sampled."""

from __future__ import annotations

import json

from envs.harness import text_of
from envs.inventory.policy import ScriptedInventoryPolicy
from envs.parsing import parse_action

TOKEN_IDS = [101, 102, 103]
LOGPROBS = [-0.5, -0.25, -0.125]


def reply(message: dict, model: str = "stub-model") -> dict:
    return {"id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": model,
            "system_fingerprint": "fp_stub",
            "choices": [{"index": 0, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                         "message": message, "token_ids": TOKEN_IDS,
                         "logprobs": {"content": [{"token": t, "logprob": p, "top_logprobs": []}
                                                  for t, p in zip("abc", LOGPROBS)]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}}


def scripted_inventory(body: dict, headers: dict) -> tuple[int, dict]:
    messages = body["messages"]
    goal = next(text_of(m["content"]) for m in messages if m["role"] == "user")
    calls = [c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    if calls and calls[-1]["function"]["name"] == "submit":
        return 200, reply({"role": "assistant", "content": "Done."})
    policy = ScriptedInventoryPolicy(mistake_rate=0.0)
    action = policy.act(goal)
    for message in messages:
        if message["role"] == "tool":
            action = policy.act(text_of(message["content"]))
    parsed = parse_action(action)
    call = {"id": f"call_{len(calls)}", "type": "function",
            "function": {"name": parsed.call.name, "arguments": json.dumps(parsed.call.arguments)}}
    return 200, reply({"role": "assistant", "content": parsed.thought or None, "tool_calls": [call]})
