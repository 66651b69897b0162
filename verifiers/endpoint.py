"""HTTP calls to model endpoints (the LLM judge, an OpenAI-compatible policy) under a
wall-clock deadline for the whole request.

    with DeadlineClient(deadline_s=5) as client:
        client.post(url, json=body)   # returns, or raises httpx.TimeoutException, within ~5 s

httpx's timeouts bound each socket operation, not the request: a server that sends one byte
every 2 s kept a 5 s-timeout request alive for ~40 s. Here each socket operation of a request
(connect, TLS, every write and read, headers and body alike) is given only the time left until
the request's deadline, and none once it has passed, so the request ends within the deadline
plus one system call, with httpx's own timeout exceptions. Each redirect and retry is a request of
its own with a fresh deadline only when the caller sends it; `send` covers redirects it follows.
Streaming responses (`stream=True`) are not covered after `send` returns: don't stream. Name
resolution (getaddrinfo) has no timeout in Python at all and is not covered either.

`EndpointError` is a failure of the endpoint (no answer in time, no connection, an HTTP error, an
unreadable reply): never the model's output, never a score. `ModelOutputRefused` is the other
side: a request refused for what the model itself wrote (tasks/policies/openai.py decides when)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpcore
import httpx

from gymfoundry.envs.secrets import HTTP_LOGGERS, redact_logs

_local = threading.local()  # this thread's current request deadline (time.monotonic())
redact_logs(*HTTP_LOGGERS)


class EndpointError(RuntimeError):
    """The inference endpoint failed: its message is already redacted (envs.secrets.redact)."""


class ContextLengthExceeded(EndpointError):
    """The endpoint refused the request because the conversation no longer fits the model's
    context, as the reply's structured error code says (`context_length_exceeded`): the episode
    is truncated there, not faulted."""


class ModelOutputRefused(RuntimeError):
    """The endpoint refused (HTTP 400) a conversation it had taken the start of, even with every
    turn of the model's sent as plain text: what differs from the accepted start is what the model
    wrote and the env's answers to it, so the refusal is the model's outcome (a failure), not an
    endpoint fault. Not an EndpointError: nothing retries it. Its message is already redacted."""


CONTEXT_LENGTH_CODES = frozenset({"context_length_exceeded"})


def context_length_code(payload: Any) -> bool:
    """Whether an error reply's body carries the structured context-length code (OpenAI's
    `{"error": {"code": "context_length_exceeded"}}`). The message text is never read: a server
    that says so only in prose (e.g. vLLM's 400) is treated as an ordinary endpoint fault."""
    error = payload.get("error") if isinstance(payload, dict) else None
    return isinstance(error, dict) and error.get("code") in CONTEXT_LENGTH_CODES


def _time_left(timeout: float | None, error: type[Exception]) -> float | None:
    deadline = getattr(_local, "deadline", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise error("the request's wall-clock deadline has passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream):
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _time_left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _time_left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname,
                                                      _time_left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, backend: httpcore.NetworkBackend):
        self._backend = backend

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _DeadlineStream(self._backend.connect_tcp(host, port, _time_left(timeout, httpcore.ConnectTimeout),
                                                         local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _DeadlineStream(self._backend.connect_unix_socket(
            path, _time_left(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def _bound(transport: httpx.BaseTransport | None) -> None:
    """Route an httpx transport's sockets through the deadline. httpx has no public hook for a
    network backend, so this reaches one private attribute on each side, and refuses loudly
    (rather than silently losing the deadline) if a new httpx version moved them."""
    if not isinstance(transport, httpx.HTTPTransport):
        return  # e.g. httpx.MockTransport: no sockets
    pool = getattr(transport, "_pool", None)
    if not isinstance(getattr(pool, "_network_backend", None), httpcore.NetworkBackend):
        raise RuntimeError("this httpx/httpcore version hides its network backend: the whole-request "
                           "deadline cannot be enforced")
    if not isinstance(pool._network_backend, _DeadlineBackend):
        pool._network_backend = _DeadlineBackend(pool._network_backend)


class DeadlineClient(httpx.Client):
    """An httpx.Client whose every `send` (and so `get`, `post`, ...) finishes within
    `deadline_s` seconds of wall-clock time, or raises an httpx.TimeoutException."""

    def __init__(self, deadline_s: float, **kwargs: Any):
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be positive, got {deadline_s!r}")
        super().__init__(timeout=deadline_s, **kwargs)
        self.deadline_s = float(deadline_s)
        for transport in [self._transport, *self._mounts.values()]:
            _bound(transport)

    def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        outer = getattr(_local, "deadline", None)
        mine = time.monotonic() + self.deadline_s
        _local.deadline = mine if outer is None else min(outer, mine)
        try:
            return super().send(request, **kwargs)
        finally:
            _local.deadline = outer
