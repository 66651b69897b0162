"""A model behind an OpenAI-compatible chat-completions endpoint (vLLM, Ollama, llama.cpp
server, hosted APIs) as a policy. The tools go in the request's `tools`; the reply's tool call
becomes the action text `<tool_call>{...}</tool_call>` that the env parses like any other.

Settings: `base_url` (or GYMFOUNDRY_POLICY_BASE_URL, e.g. http://localhost:8000/v1) and
`api_key` (or GYMFOUNDRY_POLICY_API_KEY / OPENAI_API_KEY; local servers need none).

Each request has `timeout_s` of wall-clock time in all (verifiers/endpoint.py). Whatever goes
wrong at the endpoint (no answer in time, no connection, an HTTP error, an unreadable reply) is
raised as `EndpointError`, which the rollout records as `policy_error` (an inference fault, not
a model outcome). The key is never kept: the reply's text, and every error message, pass through
`envs.secrets.redact` before they leave this class (an endpoint may echo the key)."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx

from envs.secrets import redact, register_secret
from tasks.hf_policy import SYSTEM_PROMPT
from tasks.policies import PolicyOutput
from verifiers.endpoint import DeadlineClient, EndpointError


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
        register_secret(key)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout_s = timeout_s
        self.client = DeadlineClient(timeout_s, base_url=self.base_url, headers=headers, transport=transport)
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.system_prompt = system_prompt
        self.policy_id = f"openai:{model}"
        self.version = f"{redact(self.base_url)}|t{temperature:g}"
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        self.seed = seed
        self.messages: list[dict[str, Any]] = []
        self.pending_call_id: str | None = None

    def act(self, observation: str) -> PolicyOutput:
        try:
            return self._act(observation)
        except EndpointError:
            raise
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:  # a reply of the wrong shape
            raise EndpointError(redact(f"unreadable reply from {redact(self.base_url)}: "
                                       f"{type(exc).__name__}: {exc}")[:500]) from None

    def _act(self, observation: str) -> PolicyOutput:
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
        choice = self._complete(body)
        # One redaction of the whole reply: everything kept from it below (thought, tool name,
        # arguments, the history sent back) is then free of the key, whatever field echoed it.
        message = json.loads(redact(json.dumps(choice["message"])))
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

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """The reply's first choice; any failure of the endpoint is an EndpointError whose message
        is redacted and says what went wrong (never the model's output)."""
        where = redact(self.base_url)
        try:
            response = self.client.post("/chat/completions", json=body)
        except httpx.TimeoutException:
            raise EndpointError(f"{where} gave no complete answer within the {self.timeout_s:g} s deadline") from None
        except httpx.TransportError as exc:
            raise EndpointError(redact(f"connection to {where} failed: {type(exc).__name__}: {exc}")) from None
        if response.status_code != 200:
            raise EndpointError(f"HTTP {response.status_code} from {where}: {redact(response.text)[:300]}")
        try:
            choice = response.json()["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise EndpointError(f"unreadable reply from {where}: {type(exc).__name__}: "
                                f"{redact(response.text)[:300]}") from None
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            raise EndpointError(f"unreadable reply from {where}: no message: {redact(response.text)[:300]}")
        return choice
