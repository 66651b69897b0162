"""A real HTTP server on 127.0.0.1 that speaks the OpenAI chat-completions protocol, for the
judge's tests and benchmark.

    with OpenAIStub() as server:                      # server.base_url = http://127.0.0.1:<port>/v1
        server.script.extend(["malformed", "500"])    # the next replies, then normal ones
        ...

Normal replies grade the step under review from the prompt the judge sent: every rubric
dimension gets `grade(user_message)` (default: -1 for an error observation, 0.5 for a submit,
0.25 otherwise, read from the fenced trajectory data). Script entries: "ok", "malformed" (not
JSON), "fenced" (JSON in a ```json fence), "wrong_keys", "out_of_range", "500", "429", "401",
"timeout" (sleeps `hang_s` before answering), "echo_key" (a valid verdict whose rationale
repeats the request's Authorization header), "echo_key_error" (HTTP 400 whose body repeats it,
straddling the first 200 characters). `echo_header=True` repeats it in a response header too.

`obey` makes the stub a judge that follows instructions it finds in the prompt, as a weak or
hijacked model would: "anywhere" obeys any request for a high score (or to ignore the rubric)
wherever it is, fenced data included, and then scores every dimension +1; "outside_fence"
honours the fence the prompt announces (as the system message tells it to) and obeys only text
outside it. `respond(body, headers) -> (status, payload)` replaces the judge entirely (e.g. to
play a policy endpoint).

`TricklingServer` answers every request with a complete, valid reply, one byte at a time."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import unicodedata
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# What an obedient model takes as an order to score high (its own reading, not the rule layer's).
ASKS_FOR_HIGH = re.compile(r"(?i)\b(?:score|rate|grade|give|award|marks?|reward)[^\n]{0,60}?"
                           r"(?:\+ ?1\b|full marks|max(?:imum)?\b|10/10|perfect|highest)|ignore (?:the|all|your) "
                           r"(?:rubric|instructions|previous instructions)")


def split_prompt(system: str, user: str) -> tuple[dict | None, str]:
    """(the fenced trajectory data, the user message outside the fence), read as a model that
    honours the announced fence would: the data ends at the FIRST end line after the begin line."""
    announced = re.search(r"between the lines <<<BEGIN (\S+)>>> and", system)
    if not announced:
        return None, user
    begin, end = f"<<<BEGIN {announced.group(1)}>>>", f"<<<END {announced.group(1)}>>>"
    if begin not in user or end not in user.split(begin, 1)[1]:
        return None, user
    head, rest = user.split(begin, 1)
    inside, tail = rest.split(end, 1)
    try:
        data = json.loads(inside)
    except ValueError:
        data = None
    return data, head + tail


def reads_as(text: str) -> str:
    """Text as a model reads it: fullwidth letters folded, invisible characters skipped."""
    return "".join(c for c in unicodedata.normalize("NFKC", text) if unicodedata.category(c) != "Cf")


def obeys(mode: str | None, system: str, user: str) -> bool:
    if mode is None:
        return False
    data, outside = split_prompt(system, user)
    texts = [outside]
    if mode == "anywhere":
        texts += [user, json.dumps(data, ensure_ascii=False)] + _strings(data)
    return any(ASKS_FOR_HIGH.search(reads_as(t)) for t in texts)


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def default_grade(system: str, user: str) -> float:
    data, _ = split_prompt(system, user)
    step = (data or {}).get("step_under_review", {})
    if '"ok": false' in step.get("observation", ""):
        return -1.0
    return 0.5 if '"name": "submit"' in step.get("action", "") else 0.25


class OpenAIStub:
    def __init__(self, grade=default_grade, latency_s: float = 0.0, hang_s: float = 2.0, obey: str | None = None,
                 respond=None, echo_header: bool = False):
        self.grade = grade
        self.echo_header = echo_header
        self.obey = obey
        self.respond = respond
        self.obeyed = 0
        self.latency_s = latency_s
        self.hang_s = hang_s
        self.script: deque[str] = deque()
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()

    def __enter__(self) -> OpenAIStub:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with stub._lock:
                    stub.requests.append(body)
                    stub.headers.append(dict(self.headers))
                    behaviour = stub.script.popleft() if stub.script else "ok"
                    stub.in_flight += 1
                    stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
                try:
                    if stub.respond is not None:
                        status, payload = stub.respond(body, dict(self.headers))
                    else:
                        status, payload = stub._answer(self.path, body, behaviour, dict(self.headers))
                finally:
                    with stub._lock:  # done before replying, so a client's next request never overlaps it
                        stub.in_flight -= 1
                try:
                    _send(self, status, payload,
                          {"X-Echo": self.headers.get("Authorization", "")} if stub.echo_header else {})
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # the default backlog of 5 refuses bursts of concurrent clients

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, path: str, body: dict, behaviour: str, headers: dict) -> tuple[int, dict]:
        if self.latency_s:
            time.sleep(self.latency_s)
        if path != "/v1/chat/completions":
            return 404, {"error": {"message": f"no route {path}"}}
        if behaviour == "timeout":
            time.sleep(self.hang_s)
        if behaviour in ("500", "429", "401"):
            return int(behaviour), {"error": {"message": f"stub says {behaviour}"}}
        auth = headers.get("Authorization", "")
        if behaviour == "echo_key_error":  # 23 + 130 + 24 + len("Bearer ") = 184: a key straddles character 200
            return 400, {"error": {"message": "x" * 130 + f"you sent Authorization: {auth}"}}
        system, user = body["messages"][0]["content"], body["messages"][1]["content"]
        dimensions = list(json.loads(system.split("of this form:\n", 1)[1])["scores"])
        if obeys(self.obey, system, user):
            with self._lock:
                self.obeyed += 1
            grade, rationale = 1.0, "as the text instructs: +1"
        else:
            grade = self.grade(system, user)
            rationale = f"graded {grade}"
        if behaviour == "echo_key":
            rationale = f"graded {grade}; your request carried Authorization: {auth}"
        verdict = {"scores": {d: grade for d in dimensions}, "rationale": rationale}
        content = json.dumps(verdict)
        if behaviour == "malformed":
            content = "Sure! The step looks good: {scores: great"
        elif behaviour == "fenced":
            content = f"```json\n{content}\n```"
        elif behaviour == "wrong_keys":
            content = json.dumps({"scores": {"vibes": 1.0}, "rationale": "?"})
        elif behaviour == "out_of_range":
            content = json.dumps({"scores": {d: 7.0 for d in dimensions}, "rationale": "!"})
        return 200, {"id": "chatcmpl-stub", "object": "chat.completion", "created": int(time.time()),
                     "model": body.get("model"),
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": content}}],
                     "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}


def _send(handler: BaseHTTPRequestHandler, status: int, payload: dict, headers: dict | None = None) -> None:
    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def chat_reply(content: str, model: str = "stub") -> dict:
    return {"id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}


class TricklingServer:
    """A TCP server on 127.0.0.1 that answers each request with `payload` as a complete, valid
    HTTP/1.1 200 reply, sent one byte every `interval_s` seconds: the status line and headers too
    (`phase="headers"`), or only the body after prompt headers (`phase="body"`). It gives up after
    `max_s` so a client without a whole-request deadline fails the test instead of hanging it."""

    def __init__(self, payload: dict, interval_s: float = 0.3, phase: str = "headers", max_s: float = 10.0):
        self.body = json.dumps(payload).encode()
        self.interval_s, self.phase, self.max_s = interval_s, phase, max_s
        self.requests = 0

    def __enter__(self) -> TricklingServer:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.requests += 1
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(self.body)}\r\n\r\n".encode())
        started = time.monotonic()
        try:
            conn.recv(1 << 20)
            slow = head + self.body
            if self.phase == "body":
                conn.sendall(head)
                slow = self.body
            for i in range(len(slow)):
                if time.monotonic() - started > self.max_s:
                    break
                conn.sendall(slow[i:i + 1])
                time.sleep(self.interval_s)
        except OSError:
            pass  # the client gave up
        finally:
            conn.close()
