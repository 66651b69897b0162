"""A policy endpoint on the OpenAIStub: replies with tool calls an inventory episode can end on."""

from __future__ import annotations

import json
import socket


def tool_reply(name: str, arguments: dict, call_id: str = "call_1") -> dict:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return {"id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": "stub",
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                         "logprobs": {"content": [{"token": "x", "logprob": -0.25}]}}]}


def inventory_agent(body: dict, headers: dict) -> tuple[int, dict]:
    """Look something up once, then submit: a model outcome whatever the verdict."""
    turns = sum(m["role"] == "assistant" for m in body["messages"])
    if turns == 0:
        return 200, tool_reply("find_items", {"query": "clamp"})
    return 200, tool_reply("submit", {"status": "denied"}, f"call_{turns + 1}")


def always(status: int, payload: dict | None = None):
    return lambda body, headers: (status, payload or {"error": {"message": f"stub says {status}"}})


def closed_port_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/v1"
