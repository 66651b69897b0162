"""A model behind an OpenAI-compatible chat-completions endpoint (vLLM, Ollama, llama.cpp
server, hosted APIs) as a policy. The tools go in the request's `tools`; the reply's tool call
becomes the action text `<tool_call>{...}</tool_call>` that the env parses like any other.

Settings: `base_url` (or GYMFOUNDRY_POLICY_BASE_URL, e.g. http://localhost:8000/v1) and
`api_key` (or GYMFOUNDRY_POLICY_API_KEY / OPENAI_API_KEY; local servers need none).

With `request_token_ids` the request asks a vLLM server for the sampled token ids
(`return_token_ids`, `return_tokens_as_token_ids`); whenever a reply carries them, they are
stored with the logprobs (`sampled_ids`), and otherwise the ids stay empty. `fork()` gives the
rollout engine one conversation per episode in flight over one connection pool.

Each request has `timeout_s` of wall-clock time in all (verifiers/endpoint.py). A request that
gets no connection, no answer in time, 429 or 5xx is sent again up to `max_retries` times with
backoff; whatever then goes wrong at the endpoint (those, another HTTP error, an unreadable reply)
is raised as `EndpointError`, which the rollout records as `inference_fault` (not a model
outcome; the run retries the episode under its RetryPolicy). A reply holding a value no record
can store as sent (a token id outside int64, a logprob that is no finite number, a lone surrogate
in its text or its call) is unreadable in the same way: no step keeps it (`check_storable`). A
400 whose body carries the structured code `context_length_exceeded` is `ContextLengthExceeded`:
the episode is truncated.
A reply that is not a valid tool call is the model's: its text goes to the env, which answers
with an error observation. The key is never kept: the reply's text, and every error message, pass through
`gymfoundry.envs.secrets.redact` before they leave this class (an endpoint may echo the key).

The history sent back is one every server takes, while the step keeps what the model wrote (its
action text, as sampled): a tool call whose arguments are not a JSON object (vLLM answers 400 to
such a history) is replayed as the model's plain text, and the env's answer as a user turn. A
400 on a history holding the model's turns is sent once more with all of them as plain text
(a server whose template takes no tool turns), and that form is kept for the episode; refused
again, the request differs from the episode's first, which the server took, only by what the
model wrote and what the env answered to it: `ModelOutputRefused`, the model's outcome (a
failure), never `inference_fault`. A 400 on the first request stays an endpoint fault."""

from __future__ import annotations

import copy
import json
import math
import os
import re
import time
from typing import Any

import httpx

from gymfoundry.envs.secrets import check_endpoint_url, redact, redact_json, register_secret
from gymfoundry.tasks.policies.base import PolicyOutput
from gymfoundry.tasks.policies.chat import SYSTEM_PROMPT
from gymfoundry.envs.records import PolicySpec
from gymfoundry.verifiers.endpoint import (ContextLengthExceeded, DeadlineClient, EndpointError, ModelOutputRefused,
                                context_length_code)

RETRIED_STATUS = frozenset({408, 429, 500, 502, 503, 504})


TOKEN_ID_MAX = 2**63 - 1  # the warehouse keeps token ids as int64


def sampled_ids(choice: dict[str, Any], content_logprobs: list[dict] | None) -> list[int] | None:
    """The completion's token ids as the server returned them: the choice's `token_ids` (vLLM's
    `return_token_ids`), else every logprob token written `token_id:<n>` (vLLM's
    `return_tokens_as_token_ids`). Anything else (token strings only, a partial or malformed
    list) gives None: ids are never rebuilt by re-tokenising text."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        return list(ids)
    tokens = [t.get("token") for t in content_logprobs or []]
    if tokens and all(isinstance(t, str) and re.fullmatch(r"token_id:\d+", t) for t in tokens):
        return [int(t.split(":", 1)[1]) for t in tokens]
    return None


def check_storable(message: dict[str, Any], token_ids: list[int] | None, logprobs: list[float] | None) -> None:
    """Raise ValueError (an unreadable reply: `act` makes it an EndpointError) naming a value of
    the reply that no step can store as the server sent it. A number the model wrote in its call's
    arguments is its text, stored as written whatever its size; a lone surrogate there (escaped in
    the arguments' JSON) is not Unicode and no record can hold it."""
    if token_ids and max(token_ids) > TOKEN_ID_MAX:
        raise ValueError(f"token id {max(token_ids)} is outside int64")
    if logprobs and not all(map(math.isfinite, logprobs)):
        raise ValueError(f"logprob {next(v for v in logprobs if not math.isfinite(v))} is no finite number")
    texts = [message]
    for call in message.get("tool_calls") or []:
        arguments = call.get("function", {}).get("arguments")
        if isinstance(arguments, str):
            try:
                texts.append(json.loads(arguments))
            except (ValueError, RecursionError):
                pass  # not JSON: the env reports it to the model
    for text in texts:
        try:
            json.dumps(text, ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            raise ValueError(f"a lone surrogate {exc.object[exc.start]!r} in the reply: not Unicode text") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def replayable_arguments(arguments: Any) -> str | None:
    """The arguments as a JSON string every server parses back to an object, or None: a string
    must be strict JSON (no NaN or Infinity) holding an object; a dict (some servers send one)
    is encoded."""
    if isinstance(arguments, dict):
        try:
            return json.dumps(arguments, allow_nan=False)
        except ValueError:
            return None
    if not isinstance(arguments, str):
        return None
    try:
        parsed = json.loads(arguments, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    return arguments if isinstance(parsed, dict) else None


def call_text(thought: str, name: Any, arguments: Any) -> str:
    """A tool call as action text, the way the env parses it; a string of arguments stays a
    string (the env parses it and reports bad JSON itself)."""
    return (thought + "\n" if thought else "") + "<tool_call>" + json.dumps(
        {"name": name, "arguments": arguments}) + "</tool_call>"


def plain_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with every assistant tool call written out as the model's text and every tool
    result as a user turn: roles and contents any chat server takes."""
    plain = []
    for message in messages:
        if message["role"] == "tool":
            plain.append({"role": "user", "content": message["content"]})
        elif message["role"] == "assistant" and message.get("tool_calls"):
            call = message["tool_calls"][0]["function"]
            plain.append({"role": "assistant",
                          "content": call_text(message.get("content") or "", call["name"], call["arguments"])})
        else:
            plain.append(message)
    return plain


class OpenAIPolicy:
    def __init__(self, model: str, tools: list[dict[str, Any]] | None = None, *, base_url: str | None = None,
                 api_key: str | None = None, max_new_tokens: int = 256, temperature: float = 0.0,
                 system_prompt: str = SYSTEM_PROMPT, timeout_s: float = 60.0, transport: httpx.BaseTransport | None = None,
                 top_p: float | None = None, stop: list[str] | None = None, sampling_seed: int | None = None,
                 max_retries: int = 2, retry_backoff_s: float = 0.5, sleep=None, max_connections: int = 100,
                 request_token_ids: bool = False):
        self.model = model
        self.top_p, self.stop, self.sampling_seed = top_p, stop, sampling_seed
        self.max_retries, self.retry_backoff_s = max_retries, retry_backoff_s
        self._sleep = sleep or time.sleep
        self.tools = tools
        self.base_url = (base_url or os.environ.get("GYMFOUNDRY_POLICY_BASE_URL") or "").rstrip("/")
        if not self.base_url:
            raise ValueError("no endpoint: pass base_url or set GYMFOUNDRY_POLICY_BASE_URL (e.g. http://localhost:8000/v1)")
        check_endpoint_url(self.base_url, "api_key or GYMFOUNDRY_POLICY_API_KEY")  # httpx would send it instead
        key = api_key or os.environ.get("GYMFOUNDRY_POLICY_API_KEY") or os.environ.get("OPENAI_API_KEY")
        register_secret(key)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout_s = timeout_s
        self.request_token_ids = request_token_ids
        self.inference_wait_s = 0.0  # seconds waited on failed requests and backoff (envs.wrappers.act)
        # One connection pool for the policy and all its forks: as many connections as episodes in flight.
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.client = DeadlineClient(timeout_s, base_url=self.base_url, headers=headers, transport=transport,
                                     limits=limits)
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.system_prompt = system_prompt
        self.policy_id = f"openai:{model}"
        self.version = f"{redact(self.base_url)}|t{temperature:g}"
        self.reset()

    @classmethod
    def from_spec(cls, spec: PolicySpec, tools: list[dict[str, Any]] | None = None, **kwargs: Any) -> OpenAIPolicy:
        """The policy a spec names. The key is read from the variable `spec.api_key_env` names
        (an error if it is named but unset); without one, the usual variables apply."""
        api_key = None
        if spec.api_key_env:
            api_key = os.environ.get(spec.api_key_env)
            if not api_key:
                raise ValueError(f"the policy's key variable {spec.api_key_env} is not set")
        s = spec.sampling
        options = {"max_new_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p, "stop": s.stop,
                   "sampling_seed": s.seed}
        return cls(spec.model, tools, base_url=spec.base_url, api_key=api_key, timeout_s=spec.timeout_s,
                   max_retries=spec.max_retries, max_connections=max(100, spec.max_concurrency),
                   **{k: v for k, v in options.items() if v is not None}, **{**spec.options, **kwargs})

    def fork(self) -> OpenAIPolicy:
        """Another instance for a concurrent episode: the same client (its connection pool),
        endpoint and knobs; its own conversation."""
        twin = copy.copy(self)
        twin.reset()
        return twin

    def reset(self, seed: int | None = None) -> None:
        self.seed = seed
        self.messages: list[dict[str, Any]] = []
        self.pending_call_id: str | None = None
        self.plain = False  # the server refused the model's tool turns: all of them go as plain text

    def act(self, observation: str) -> PolicyOutput:
        try:
            return self._act(observation)
        except EndpointError:
            raise
        except (KeyError, IndexError, TypeError, AttributeError, ValueError, OverflowError) as exc:
            # a reply of the wrong shape, or holding a value no step can store
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
        if self.request_token_ids:  # vLLM's fields (other servers may refuse them: off by default)
            body.update(return_token_ids=True, return_tokens_as_token_ids=True)
        if self.tools:
            body["tools"] = self.tools
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.stop:
            body["stop"] = self.stop
        if self.seed is not None:
            body["seed"] = self.seed if self.sampling_seed is None else \
                (self.sampling_seed * 1000003 + self.seed) & 0x7FFFFFFF
        choice = self._complete(body)
        # One redaction of the whole reply: everything kept from it below (thought, tool name,
        # arguments, the history sent back) is then free of the key, whatever field echoed it.
        message = redact_json(choice["message"])
        content_logprobs = ((choice.get("logprobs") or {}).get("content")) or None
        logprobs = [float(t["logprob"]) for t in content_logprobs] if content_logprobs else None
        token_ids = sampled_ids(choice, content_logprobs)
        check_storable(message, token_ids, logprobs)  # before the history takes any of it
        calls = message.get("tool_calls") or []
        thought = message.get("content") or ""
        self.pending_call_id = None
        if calls:
            call = calls[0]["function"]
            name, arguments = call.get("name"), call.get("arguments") or "{}"
            text = call_text(thought, name, arguments)
            replay = replayable_arguments(arguments)
            if self.plain or replay is None or not isinstance(name, str) or not name:
                # The step keeps `text`; the server gets it as the model's words, and the env's
                # answer as a user turn (no tool call id to answer).
                self.messages.append({"role": "assistant", "content": text})
            else:
                self.pending_call_id = calls[0].get("id") or f"call_{len(self.messages)}"
                self.messages.append({"role": "assistant", "content": thought or None,
                                      "tool_calls": [{"id": self.pending_call_id, "type": "function",
                                                      "function": {"name": name, "arguments": replay}}]})
        else:
            text = thought
            self.messages.append({"role": "assistant", "content": thought})
        return PolicyOutput(text=text, thought=thought or None, token_ids=token_ids, logprobs=logprobs)

    def _post(self, body: dict[str, Any]) -> httpx.Response:
        """The endpoint's reply, after up to `max_retries` retries (with doubling backoff) of a
        request that got no connection, no answer in time, 429 or 5xx; then an EndpointError."""
        where = redact(self.base_url)
        for attempt in range(self.max_retries + 1):
            if attempt:  # the backoff is the infrastructure's time, not the model's (envs.wrappers.act)
                slept = time.monotonic()
                self._sleep(min(self.retry_backoff_s * 2 ** (attempt - 1), 10.0))
                self.inference_wait_s += time.monotonic() - slept
            started = time.monotonic()
            try:
                response = self.client.post("/chat/completions", json=body)
            except httpx.TimeoutException:
                error = f"{where} gave no complete answer within the {self.timeout_s:g} s deadline"
            except httpx.TransportError as exc:
                error = redact(f"connection to {where} failed: {type(exc).__name__}: {exc}")
            else:
                if response.status_code not in RETRIED_STATUS:
                    return response
                error = f"HTTP {response.status_code} from {where}: {redact(response.text)[:300]}"
            self.inference_wait_s += time.monotonic() - started  # a failed request: the infrastructure's too
        raise EndpointError(f"{error} (after {self.max_retries + 1} request(s))")

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """The reply's first choice; any failure of the endpoint is an EndpointError whose message
        is redacted and says what went wrong (never the model's output). A refused history
        holding the model's turns: see the module's docstring."""
        where = redact(self.base_url)
        response = self._post(body)
        if _refused(response) and any(m["role"] == "assistant" for m in body["messages"]):
            plain = plain_history(body["messages"])
            if plain != body["messages"]:  # else it was refused as plain text already
                response = self._post({**body, "messages": plain})
                if response.status_code == 200:
                    self.messages, self.plain = plain, True
            if _refused(response):
                raise ModelOutputRefused(f"the endpoint refused the conversation holding the model's own output: "
                                         f"HTTP 400 from {where}: {redact(response.text)[:300]}")
        if response.status_code != 200:
            message = f"HTTP {response.status_code} from {where}: {redact(response.text)[:300]}"
            if response.status_code == 400:
                try:
                    payload = response.json()
                except ValueError:
                    payload = None
                if context_length_code(payload):
                    raise ContextLengthExceeded(message)
            raise EndpointError(message)
        try:
            choice = response.json()["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise EndpointError(f"unreadable reply from {where}: {type(exc).__name__}: "
                                f"{redact(response.text)[:300]}") from None
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            raise EndpointError(f"unreadable reply from {where}: no message: {redact(response.text)[:300]}")
        return choice


def _refused(response: httpx.Response) -> bool:
    """A 400 that is not the structured context-length rejection."""
    if response.status_code != 400:
        return False
    try:
        return not context_length_code(response.json())
    except ValueError:
        return True
