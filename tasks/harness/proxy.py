"""A recording OpenAI-compatible chat endpoint (`gymfoundry proxy`): a harness points its base URL
at `http://<proxy>/episodes/<name>/v1` (or `/v1` with the `X-Gymfoundry-Episode` header); each
chat completion is forwarded to the upstream model server and recorded against the episode
(tasks/harness/hub.py `CallLog`) before the reply goes back: the request's messages and tools, the
reply's message, token ids and logprobs when the upstream returns them (`sampled_ids`: never
re-tokenised), latency, the model's name and the upstream.

Where a call fails decides what it is: no connection, no whole answer within `timeout_s`, 401/403 (the
proxy's key), 429, 5xx or an unreadable reply is the upstream's. The proxy itself sends such a request
again up to `max_retries` times, as the factory's endpoint policy does (`PolicySpec.max_retries`); one
that still fails is recorded as a `fault`, and the episode it touched is an inference fault whatever
the harness does next (an attempt touched by a fault is in no statistic: a harness that retried
only when it was doing well would otherwise raise its success rate with the fault rate); a 400
with the structured `context_length_exceeded` code
is a full context (the episode is truncated); another 4xx is the harness's malformed request. The
harness gets the upstream's status and body as they were, so its client retries as it would. A
streamed completion is relayed as it comes and recorded as what its chunks add up to; a stream the
upstream cuts is a fault, and the harness's stream is cut there too.
The upstream's key is the proxy's (`api_key`), never the harness's, and is redacted from records and
from every reply relayed, streamed ones across chunk boundaries (`StreamRedactor`).

Only an open episode's owner is served: the harness passes the token its episode was opened with
(`Authorization: Bearer <token>`, its OpenAI client's api_key); a wrong or missing one is 401 and a
name not open 404, before the body is read. A request whose record the call log could not read back
is refused (400), as is one over `max_request_bytes` (413). The server's limits (connections, slow
clients) are `gymfoundry.tasks.harness.http_guard`'s, as serve-env's."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any, Iterator

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gymfoundry.envs.harness import ModelCall
from gymfoundry.envs.records import PolicySpec
from gymfoundry.envs.secrets import check_endpoint_url, known_secrets, redact, redact_json, register_secret
from gymfoundry.tasks.harness.hub import EPISODE_HEADER, EPISODE_NAME, CallLog, EpisodeNotOpen, WrongToken, unreadable
from gymfoundry.tasks.harness.http_guard import bearer
from gymfoundry.tasks.policies.openai import RETRIED_STATUS, sampled_ids
from gymfoundry.verifiers.endpoint import context_length_code

MAX_RETRIES = PolicySpec.model_fields["max_retries"].default  # the factory's endpoint policy's own default
RETRY_BACKOFF_S = 0.5
# a chat request's body: a 1M-token context is about 4 MB of text (a body over it is refused 413)
MAX_REQUEST_BYTES = 8 * 2**20


class _TooLarge(Exception):
    pass


async def _body(request: Request, limit: int) -> bytes:
    """The request's body, read no further than `limit` bytes (a declared length over it is refused unread)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _retried(status: int) -> bool:
    """A status the upstream may answer differently when asked again (not 401/403: a refused key stays refused)."""
    return status in RETRIED_STATUS or status >= 500


def _relayed(text: str) -> tuple[str, Any]:
    """A whole reply as the harness gets it, redacted (in its decoded strings too: an upstream may
    escape what it echoes), and what it reads as (None: not JSON)."""
    text = redact(text)
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        return text, None
    try:
        clean = redact_json(payload)
    except RecursionError:
        return text, payload
    return (text, payload) if clean == payload else (json.dumps(clean, ensure_ascii=False), clean)


# the fields a stream spreads over its chunks: the generated text (other fields come whole in each chunk)
STREAMED_FIELDS = frozenset({"content", "arguments", "reasoning_content", "reasoning", "refusal", "text"})


def _streamed(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any, Any]]:
    """(field, container, key) for each streamed text in an event: a list item with an `index` (a
    choice, a tool call) is named by it, so a field names the same text in every chunk."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        name = item.get("index", key) if isinstance(value, list) and isinstance(item, dict) else key
        if isinstance(item, str):
            if key in STREAMED_FIELDS:
                yield path + (name,), value, key
        else:
            yield from _streamed(item, path + (name,))


class StreamRedactor:
    """A streamed reply's lines, each given out only once no known secret can straddle it: each text
    a stream spreads over its chunks (a choice's content, a tool call's arguments) is read whole
    across them and redacted, and a line waits until each of its texts has run `reach` characters
    further, another text of its choice has begun (content gives way to tool calls), or the stream
    ended. A key the upstream split between chunks is so redacted before the harness sees any of
    it; with no known secret (`reach` 0) nothing waits."""

    def __init__(self, reach: int):
        self.reach = reach
        self.pending: list[list] = []  # [line, its event or None, whether the event was changed]

    def feed(self, line: str) -> list[str]:
        event = None
        if line.startswith("data:"):
            with contextlib.suppress(ValueError, RecursionError):
                event = json.loads(line[5:])
        self.pending.append([line, event if isinstance(event, (dict, list)) else None, False])
        fields: dict[tuple, list] = {}
        for n, entry in enumerate(self.pending):
            if entry[1] is not None:
                for field, container, key in _streamed(entry[1]):
                    fields.setdefault(field, []).append((n, entry, container, key))
        waits, newest = set(), len(self.pending) - 1  # the pending lines some text still waits on
        for field, pieces in fields.items():
            text = "".join(container[key] for _, _, container, key in pieces)
            new = sum(len(container[key]) for n, _, container, key in pieces if n == newest)
            # only what the newest chunk can complete: its text and the `reach` characters before it
            if new and redact(text[-new - self.reach:]) != text[-new - self.reach:] and (clean := redact(text)) != text:
                # the whole redacted text in the first piece, the others emptied
                for n, (_, entry, container, key) in enumerate(pieces):
                    container[key], entry[2] = clean if n == 0 else "", True
            last = pieces[-1][0]
            if any(other[:2] == field[:2] and any(n > last and container[key] for n, _, container, key in more)
                   for other, more in fields.items() if other != field):
                continue  # another text of this choice has begun after it: this one has ended
            after = 0
            for n, _, container, key in reversed(pieces):
                if after < self.reach:
                    waits.add(n)
                after += len(container[key])
        ready = min(waits, default=len(self.pending))
        return self._give(ready)

    def flush(self) -> list[str]:
        return self._give(len(self.pending))

    def _give(self, count: int) -> list[str]:
        out, self.pending = self.pending[:count], self.pending[count:]
        return [redact("data: " + json.dumps(event, ensure_ascii=False) if changed else line)
                for line, event, changed in out]


def merged(events: list[str]) -> Any:
    """The completion a stream's `data:` events add up to (choice 0): content, tool calls put
    together by index, logprobs and token ids in order; None if an event is not a chunk."""
    if not events:
        return None
    content, tool_calls, logprobs, ids, head = [], {}, [], [], {}
    try:
        for event in events:
            chunk = json.loads(event)
            head.update({k: chunk[k] for k in ("model", "system_fingerprint") if chunk.get(k)})
            for choice in chunk.get("choices") or []:
                if choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                content.append(delta.get("content") or "")
                for part in delta.get("tool_calls") or []:
                    call = tool_calls.setdefault(part.get("index", 0), {"id": None, "type": "function",
                                                                         "function": {"name": "", "arguments": ""}})
                    call["id"] = part.get("id") or call["id"]
                    call["function"]["name"] += (part.get("function") or {}).get("name") or ""
                    call["function"]["arguments"] += (part.get("function") or {}).get("arguments") or ""
                logprobs += (choice.get("logprobs") or {}).get("content") or []
                ids += choice.get("token_ids") or []
        message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
        if tool_calls:
            message["tool_calls"] = [tool_calls[k] for k in sorted(tool_calls)]
    except (ValueError, TypeError, AttributeError):
        return None
    choice = {"message": message, "logprobs": {"content": logprobs} if logprobs else None}
    if ids:
        choice["token_ids"] = ids
    return {**head, "choices": [choice]}


def build_proxy(upstream: str, data_dir: str, *, api_key: str | None = None, timeout_s: float = 60.0,
                request_logprobs: bool = False, request_token_ids: bool = False, max_connections: int = 256,
                max_retries: int = MAX_RETRIES, retry_backoff_s: float = RETRY_BACKOFF_S,
                max_request_bytes: int = MAX_REQUEST_BYTES,
                transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    """`request_logprobs` asks the upstream for the sampled tokens' logprobs, and `request_token_ids`
    a vLLM server for their ids (`return_token_ids`, `return_tokens_as_token_ids`), whatever the
    harness asked: a harness rarely asks, and training needs them. A request body over
    `max_request_bytes` is refused (413) without being read whole, and recorded as refused."""
    if max_request_bytes < 1:
        raise ValueError(f"max_request_bytes must be a positive number of bytes, not {max_request_bytes}")
    upstream = check_endpoint_url(upstream, "the variable --api-key-env names").rstrip("/")
    where = redact(upstream)
    register_secret(api_key)
    calls = CallLog(data_dir)
    state: dict[str, httpx.AsyncClient] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        async with httpx.AsyncClient(base_url=upstream, timeout=timeout_s, limits=limits, transport=transport,
                                     headers={"Authorization": f"Bearer {api_key}"} if api_key else {}) as client:
            state["client"] = client
            yield

    async def again(attempt: int) -> None:
        await anyio.sleep(min(retry_backoff_s * 2 ** (attempt - 1), 10.0))

    async def forward(body: dict) -> tuple[httpx.Response | None, str | None]:
        """The upstream's answer, sent again up to `max_retries` times while it fails on its side: the
        last response (or None and why there was none)."""
        response, failure = None, None
        for attempt in range(max_retries + 1):
            if attempt:
                await again(attempt)
            try:
                with anyio.fail_after(timeout_s):  # the whole answer, not each read: a trickling server is a fault too
                    response, failure = await state["client"].post("/chat/completions", json=body), None
            except TimeoutError:
                response, failure = None, f"{where} gave no complete answer within {timeout_s:g} s"
            except httpx.TransportError as exc:
                response, failure = None, redact(f"connection to {where} failed: {type(exc).__name__}: {exc}")
            if response is not None and not _retried(response.status_code):
                break
        return response, failure

    async def chat(request: Request) -> Response:
        name = request.path_params.get("episode") or request.headers.get(EPISODE_HEADER)
        if not name or not EPISODE_NAME.fullmatch(name):
            return JSONResponse({"error": {"message": "name the episode: base URL /episodes/<name>/v1 or the "
                                                      f"{EPISODE_HEADER} header", "type": "invalid_request_error"}},
                                status_code=404)
        try:  # before a byte of the body is read: only an open episode's owner is recorded or forwarded
            calls.check(name, bearer(request))
        except EpisodeNotOpen as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error"}}, status_code=404)
        except WrongToken as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error"}}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        try:  # a body trickled in is cut by the server's read timeout (tasks.harness.http_guard): no call made
            text, error = await _body(request, max_request_bytes), None
        except _TooLarge:
            text, error = b"", f"the request body is over the proxy's limit of {max_request_bytes} bytes"
        # numbered once the body is in (a harness that hangs up while sending it made no call)
        record = {"episode_id": name, "index": calls.next_index(name), "upstream": where, "at": time.time()}
        if error is not None:
            calls.append(ModelCall(**record, status="refused", error=error))
            return JSONResponse({"error": {"message": error, "type": "invalid_request_error"}}, status_code=413)
        try:
            body = json.loads(text)
        except (ValueError, RecursionError):
            body = None
        error = "the request is not a chat completion (a JSON object with messages)"
        if isinstance(body, dict) and isinstance(body.get("messages"), list):
            try:  # a request the proxy could not record is never forwarded: the harness's, said as such
                shown = dict(messages=redact_json(body["messages"]), tools=redact_json(body.get("tools")) or None,
                             model=str(body.get("model") or ""))
                json.dumps(body, ensure_ascii=False).encode("utf-8")
                line = ModelCall(**record, **shown).model_dump_json()
            except (ValueError, TypeError, RecursionError) as exc:  # pydantic's ValidationError, UnicodeError
                error = f"the request is not a chat completion the proxy can record: {type(exc).__name__}: " + \
                    " ".join(str(exc).split())[:300]
            else:
                try:  # read back as the call log's reader reads it (JSON nested past its limit is not)
                    ModelCall.model_validate_json(line)
                    record.update(shown)
                    error = None
                except ValueError as exc:
                    error = "the request is not a chat completion the proxy can record: the call log could not " \
                        f"read it back ({unreadable(exc)})"
        if error is not None:
            calls.append(ModelCall(**record, status="refused", error=error))
            return JSONResponse({"error": {"message": error, "type": "invalid_request_error"}}, status_code=400)
        if request_logprobs:
            body = {**body, "logprobs": True}
        if request_token_ids:
            body = {**body, "return_token_ids": True, "return_tokens_as_token_ids": True}
        if body.get("stream"):
            return await streamed(body, record)
        started = time.perf_counter()
        response, failure = await forward(body)
        record["latency_s"] = round(time.perf_counter() - started, 6)
        if response is None:
            calls.append(ModelCall(**record, status="fault", error=failure))
            return JSONResponse({"error": {"message": failure, "type": "upstream_error"}}, status_code=502)
        text, payload = _relayed(response.text)
        if response.status_code != 200:
            keep_failure(record, response.status_code, payload, text)
        elif not keep_reply(record, payload):
            error = f"unreadable reply from {where}: {text[:300]}"
            calls.append(ModelCall(**record, status="fault", error=error))
            return JSONResponse({"error": {"message": error, "type": "upstream_error"}}, status_code=502)
        return Response(text, status_code=response.status_code,
                        media_type=response.headers.get("content-type", "application/json"))

    def keep_reply(record: dict, payload: Any) -> bool:
        """Record a 200 reply's first choice; False when it is not a chat completion."""
        try:
            choice = payload["choices"][0]
            message = choice["message"]
            if not isinstance(message, dict):
                raise TypeError("message is not an object")
            content_logprobs = (choice.get("logprobs") or {}).get("content") or None
            logprobs = [float(t["logprob"]) for t in content_logprobs] if content_logprobs else None
            ids = sampled_ids(choice, content_logprobs)
        except (TypeError, KeyError, IndexError, ValueError, AttributeError):
            return False
        fingerprint = payload.get("system_fingerprint")
        try:  # a reply that cannot be stored or read back (not Unicode, not a message, too deep): the upstream's
            calls.append(ModelCall(**{**record, "model": str(payload.get("model") or record["model"])},
                                   response=redact_json(message), token_ids=ids, logprobs=logprobs,
                                   fingerprint=fingerprint if isinstance(fingerprint, str) and fingerprint else None))
        except (ValueError, TypeError, RecursionError):  # UnreadableCall is a ValueError
            return False
        return True

    def keep_failure(record: dict, status: int, payload: Any, text: str) -> None:
        # 401/403: the upstream refused the proxy's own key (the harness's is never forwarded): ours
        kind = "fault" if status in RETRIED_STATUS or status >= 500 or status in (401, 403) else \
            "context" if status == 400 and context_length_code(payload) else "refused"
        calls.append(ModelCall(**record, status=kind, error=f"HTTP {status} from {where}: {text[:300]}"))

    async def streamed(body: dict, record: dict) -> Response:
        """Relay the upstream's event stream as it comes; record the completion it adds up to (or
        the fault that cut it) once it ends."""
        client, started, response = state["client"], time.perf_counter(), None
        for attempt in range(max_retries + 1):  # sent again while it fails before its first chunk
            if attempt:
                await again(attempt)
            if response is not None:
                await response.aclose()
                response = None
            try:
                with anyio.fail_after(timeout_s):
                    response = await client.send(client.build_request("POST", "/chat/completions", json=body),
                                                 stream=True)
            except (TimeoutError, httpx.TransportError) as exc:
                failure = f"{where} did not answer within {timeout_s:g} s" if isinstance(exc, TimeoutError) else \
                    redact(f"connection to {where} failed: {type(exc).__name__}: {exc}")
                continue
            if not _retried(response.status_code):
                break
        if response is None:
            calls.append(ModelCall(**record, status="fault", error=failure, latency_s=time.perf_counter() - started))
            return JSONResponse({"error": {"message": failure, "type": "upstream_error"}}, status_code=502)
        if response.status_code != 200:
            text, payload = _relayed((await response.aread()).decode(errors="replace"))
            await response.aclose()
            record["latency_s"] = round(time.perf_counter() - started, 6)
            keep_failure(record, response.status_code, payload, text)
            return Response(text, status_code=response.status_code,
                            media_type=response.headers.get("content-type", "application/json"))

        async def relay():
            # `waited`: time spent waiting on the upstream (not on a harness reading slowly, nor on the
            # proxy's own work); `whole`: the upstream's stream ran to its end. A harness that closes its stream
            # before then cut its own call: `cancelled`, never a fault nor a whole answer.
            events, failure, waited, whole = [], None, 0.0, False
            # a known secret is never relayed, even split between chunks: a line waits for the text after it
            redactor = StreamRedactor(max(map(len, known_secrets()), default=1) - 1)
            lines = response.aiter_lines()
            try:
                while True:
                    asked = time.monotonic()
                    line = await anext(lines, None)
                    waited += time.monotonic() - asked
                    if waited > timeout_s:
                        failure = f"{where} gave no complete answer within {timeout_s:g} s"
                        raise TimeoutError(failure)
                    for out in redactor.feed(line) if line is not None else redactor.flush():
                        yield out + "\n"
                        if out.startswith("data:") and out[5:].strip() != "[DONE]":
                            events.append(out[5:].strip())
                    if line is None:
                        break
                whole = True
            except httpx.HTTPError as exc:  # the stream was cut: the upstream's, whatever came before
                failure = redact(f"the stream from {where} broke: {type(exc).__name__}: {exc}")
                raise  # and the harness's breaks too: a cut answer must never pass for a whole one
            finally:
                with anyio.CancelScope(shield=True):
                    await response.aclose()
                record["latency_s"] = round(time.perf_counter() - started, 6)
                if failure is None and not whole:
                    calls.append(ModelCall(**record, status="cancelled",
                                           error=f"the harness closed the stream after {len(events)} chunks"))
                else:
                    if failure is None and not keep_reply(record, merged(events)):
                        failure = f"unreadable stream from {where}: {redact(' '.join(events))[:300]}"
                    if failure is not None:
                        calls.append(ModelCall(**record, status="fault", error=failure))

        return StreamingResponse(relay(), media_type="text/event-stream")

    return Starlette(routes=[Route("/episodes/{episode}/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/chat/completions", chat, methods=["POST"])], lifespan=lifespan)
