"""A model behind an OpenAI-compatible chat-completions endpoint (vLLM, Ollama, llama.cpp
server, hosted APIs) as a policy. The tools go in the request's `tools`; the reply's tool call
becomes the action text `<tool_call>{...}</tool_call>` that the env parses like any other.

Settings: `base_url` (or GYMFOUNDRY_POLICY_BASE_URL, e.g. http://localhost:8000/v1) and
`api_key` (or GYMFOUNDRY_POLICY_API_KEY / OPENAI_API_KEY; local servers need none)."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx

from tasks.hf_policy import SYSTEM_PROMPT
from tasks.policies import PolicyOutput


class OpenAIPolicy:
    def __init__(self, model: str, tools: list[dict[str, Any]] | None = None, *, base_url: str | None = None,
                 api_key: str | None = None, max_new_tokens: int = 256, temperature: float = 0.0,
                 system_prompt: str = SYSTEM_PROMPT, timeout_s: float = 60.0, transport: httpx.BaseTransport | None = None):
        self.model = model
        self.tools = tools
        self.base_url = (base_url or os.environ.get("GYMFOUNDRY_POLICY_BASE_URL") or "").rstrip("/")
        if not self.base_url:
            raise ValueError("no endpoint: pass base_url or set GYMFOUNDRY_POLICY_BASE_URL (e.g. http://localhost:8000/v1)")
        key = api_key or os.environ.get("GYMFOUNDRY_POLICY_API_KEY") or os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s, transport=transport)
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.system_prompt = system_prompt
        self.policy_id = f"openai:{model}"
        self.version = f"{self.base_url}|t{temperature:g}"
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        self.seed = seed
        self.messages: list[dict[str, Any]] = []
        self.pending_call_id: str | None = None

    def act(self, observation: str) -> PolicyOutput:
        if not self.messages:
            self.messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": observation}]
        elif self.pending_call_id:
            self.messages.append({"role": "tool", "tool_call_id": self.pending_call_id, "content": observation})
        else:
            self.messages.append({"role": "user", "content": observation})
        body: dict[str, Any] = {"model": self.model, "messages": self.messages, "max_tokens": self.max_new_tokens,
                                "temperature": self.temperature, "logprobs": True}
        if self.tools:
            body["tools"] = self.tools
        if self.seed is not None:
            body["seed"] = self.seed
        response = self.client.post("/chat/completions", json=body)
        response.raise_for_status()
        choice = response.json()["choices"][0]
        message = choice["message"]
        calls = message.get("tool_calls") or []
        thought = message.get("content") or ""
        self.pending_call_id = None
        if calls:
            call = calls[0]["function"]
            self.pending_call_id = calls[0].get("id") or f"call_{len(self.messages)}"
            arguments = call.get("arguments") or "{}"
            # A string of arguments stays a string: the env parses it and reports bad JSON itself.
            text = (thought + "\n" if thought else "") + "<tool_call>" + json.dumps(
                {"name": call.get("name"), "arguments": arguments}) + "</tool_call>"
            self.messages.append({"role": "assistant", "content": thought or None,
                                  "tool_calls": [{"id": self.pending_call_id, "type": "function",
                                                  "function": {"name": call.get("name"), "arguments": arguments}}]})
        else:
            text = thought
            self.messages.append({"role": "assistant", "content": thought})
        content_logprobs = ((choice.get("logprobs") or {}).get("content")) or None
        logprobs = [t["logprob"] for t in content_logprobs] if content_logprobs else None
        # Endpoints return token strings, not ids: ids stay unknown rather than re-tokenised.
        return PolicyOutput(text=text, thought=thought or None, token_ids=None, logprobs=logprobs)
