"""A real HTTP server on 127.0.0.1 that speaks the OpenAI chat-completions protocol, for the
judge's tests and benchmark.

    with OpenAIStub() as server:                      # server.base_url = http://127.0.0.1:<port>/v1
        server.script.extend(["malformed", "500"])    # the next replies, then normal ones
        ...

Normal replies grade the step under review from the prompt the judge sent: every rubric
dimension gets `grade(user_message)` (default: -1 for an error observation, 0.5 for a submit,
0.25 otherwise). Script entries: "ok", "malformed" (not JSON), "fenced" (JSON in a ```json
fence), "wrong_keys", "out_of_range", "500", "429", "401", "timeout" (sleeps `hang_s` before
answering)."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def default_grade(user: str) -> float:
    observation = user.split("Observation returned:", 1)[-1]
    if '"ok": false' in observation:
        return -1.0
    action = user.split("## Step under review", 1)[-1].split("Observation returned:", 1)[0]
    return 0.5 if '"name": "submit"' in action else 0.25


class OpenAIStub:
    def __init__(self, grade=default_grade, latency_s: float = 0.0, hang_s: float = 2.0):
        self.grade = grade
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
                    status, payload = stub._answer(self.path, body, behaviour)
                finally:
                    with stub._lock:  # done before replying, so a client's next request never overlaps it
                        stub.in_flight -= 1
                try:
                    _send(self, status, payload)
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

    def _answer(self, path: str, body: dict, behaviour: str) -> tuple[int, dict]:
        if self.latency_s:
            time.sleep(self.latency_s)
        if path != "/v1/chat/completions":
            return 404, {"error": {"message": f"no route {path}"}}
        if behaviour == "timeout":
            time.sleep(self.hang_s)
        if behaviour in ("500", "429", "401"):
            return int(behaviour), {"error": {"message": f"stub says {behaviour}"}}
        system, user = body["messages"][0]["content"], body["messages"][1]["content"]
        dimensions = list(json.loads(system.split("of this form:\n", 1)[1])["scores"])
        grade = self.grade(user)
        verdict = {"scores": {d: grade for d in dimensions}, "rationale": f"graded {grade}"}
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


def _send(handler: BaseHTTPRequestHandler, status: int, payload: dict) -> None:
    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
