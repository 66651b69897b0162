"""An upstream model for harness tests, on the OpenAIStub: a correct inventory agent.

It is stateless: each request replays the family's scripted policy (no mistakes) over the
conversation it carries (the user message with the goal, then every tool result), and answers
with the policy's next call as an OpenAI tool call; once it has submitted, it answers "Done."
Each reply carries token ids and logprobs the way vLLM returns them, so tests can check they
are kept as sampled."""

from __future__ import annotations

import json

from gymfoundry.envs.harness import text_of
from gymfoundry.envs.inventory.policy import ScriptedInventoryPolicy
from gymfoundry.envs.parsing import parse_action

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


def streaming_upstream(cut_after: int | None = None):
    """An ASGI app answering chat completions like `scripted_inventory`, as an event stream when
    asked (`stream: true`): the reply in chunks, the tool call's arguments split in two, a logprob
    and a token id per chunk. `cut_after`: the stream of every request stops after that many
    chunks without its end (the connection drops)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def chunks(payload: dict) -> list[dict]:
        message = payload["choices"][0]["message"]
        deltas: list[dict] = [{"role": "assistant", "content": message.get("content") or ""}]
        for k, call in enumerate(message.get("tool_calls") or []):
            arguments = call["function"]["arguments"]
            half = len(arguments) // 2
            head = {"name": call["function"]["name"], "arguments": arguments[:half]}
            deltas += [{"tool_calls": [{"index": k, "id": call["id"], "type": "function", "function": head}]},
                       {"tool_calls": [{"index": k, "function": {"arguments": arguments[half:]}}]}]
        out = [{"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0, "model": payload["model"],
                "system_fingerprint": "fp_stub",
                "choices": [{"index": 0, "delta": delta, "finish_reason": None, "token_ids": [TOKEN_IDS[n]],
                             "logprobs": {"content": [{"token": "abc"[n], "logprob": LOGPROBS[n],
                                                       "top_logprobs": []}]}}]}
               for n, delta in enumerate(deltas[:3])]
        out += [{"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0, "model": payload["model"],
                 "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas[3:]]
        out.append({"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0, "model": payload["model"],
                    "choices": [{"index": 0, "delta": {}, "finish_reason": payload["choices"][0]["finish_reason"]}]})
        return out

    async def chat(request: Request):
        body = await request.json()
        _, payload = scripted_inventory(body, dict(request.headers))
        if not body.get("stream"):
            return JSONResponse(payload)

        async def events():
            for n, chunk in enumerate(chunks(payload)):
                if cut_after is not None and n == cut_after:
                    raise ConnectionError("the upstream went away mid-stream")
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
