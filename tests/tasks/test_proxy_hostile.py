"""The recording proxy against a hostile harness and an upstream that echoes what it is sent: only
an open episode's owner is recorded or forwarded, what the call log could not read back is
refused, the proxy's own key never reaches the harness or the log, and slow or many clients
cannot hold the server."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gymfoundry.envs.secrets import MASK
from gymfoundry.tasks.harness.hub import CallLog
from gymfoundry.tasks.harness.http_guard import served
from gymfoundry.tasks.harness.proxy import build_proxy

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]  # the harness servers and proxy, over HTTP
KEY = "sk-proxy-upstream-7Qm2Zr9Xw4Lp8Vn3"  # the proxy's own key for the upstream
USER = {"role": "user", "content": "hi"}


def counting_upstream(seen: list):
    """An upstream that answers every chat completion and keeps what it was sent."""
    async def chat(request: Request):
        seen.append(await request.body())
        return JSONResponse({"model": "m", "choices": [{"index": 0, "message": {"role": "assistant",
                                                                                 "content": "ok"}}]})
    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def echo_upstream():
    """An upstream that repeats the Authorization header it received: in a streamed reply (content
    and tool-call arguments, the key cut into 5-character chunks), in a reply whose JSON escapes
    every character of it, and in an error body."""
    async def chat(request: Request):
        body = await request.json()
        echoed = request.headers.get("authorization", "")
        ask = body["messages"][-1]["content"]
        if ask == "error":
            return JSONResponse({"error": {"message": f"bad header {echoed}"}}, status_code=400)
        text = f"the header I was sent: {echoed} thanks, the end"
        if not body.get("stream"):
            escaped = "".join(f"\\u{ord(c):04x}" for c in echoed)
            return StreamingResponse(iter(['{"model": "m", "choices": [{"index": 0, "message": {"role": "assistant", '
                                           f'"content": "header: {escaped}"}}}}]}}']), media_type="application/json")

        async def events():
            for n in range(0, len(text), 5):
                delta = {"content": text[n:n + 5]} if n else {"role": "assistant", "content": text[n:n + 5]}
                yield "data: " + json.dumps({"model": "m", "choices": [{"index": 0, "delta": delta}]}) + "\n\n"
            arguments = json.dumps({"note": echoed})
            for n in range(0, len(arguments), 5):
                part = {"index": 0, "function": {"arguments": arguments[n:n + 5]}}
                if not n:
                    part.update(id="call_1", type="function", function={"name": "note", "arguments": arguments[:5]})
                yield "data: " + json.dumps({"model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [part]}}]}) \
                    + "\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")
    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def test_only_an_open_episodes_token_is_recorded_or_forwarded(tmp_path):
    """Whoever knows only an episode's name must not record into it or spend the proxy's upstream."""
    log, seen = CallLog(tmp_path), []
    token, other = log.open("mine"), log.open("theirs")
    log.open("over")
    log.close("over")
    with served(counting_upstream(seen)) as upstream, served(build_proxy(upstream + "/v1", str(tmp_path))) as px:
        def ask(name: str, token: str | None, **headers) -> httpx.Response:
            auth = {"Authorization": f"Bearer {token}"} if token else {}
            url = f"{px}/episodes/{name}/v1/chat/completions" if name else f"{px}/v1/chat/completions"
            return httpx.post(url, json={"model": "m", "messages": [USER]}, headers={**auth, **headers})

        assert ask("mine", None).status_code == 401
        assert ask("mine", "not-the-token").status_code == 401
        assert ask("mine", other).status_code == 401  # another episode's token
        assert ask("", None, **{"X-Gymfoundry-Episode": "mine"}).status_code == 401
        reply = ask("never", token)
        assert reply.status_code == 404 and reply.json()["error"]["message"] == "no open episode 'never'"
        assert ask("over", token).status_code == 404  # closed
        assert seen == [] and log.read("mine") == log.read("never") == log.read("over") == []
        assert ask("mine", token).status_code == 200
        assert ask("", token, **{"X-Gymfoundry-Episode": "mine"}).status_code == 200
    assert len(seen) == 2 and [c.status for c in log.read("mine")] == ["ok", "ok"]
    assert log.read("theirs") == []


def test_a_request_the_call_log_could_not_read_back_is_refused_and_the_episode_goes_on(tmp_path):
    """JSON nested 250 levels: before, forwarded and recorded, and the episode's log unreadable for
    good. Now a clear 400, recorded as the harness's refused request, and the next call is fine."""
    log, seen = CallLog(tmp_path), []
    auth = {"Authorization": f"Bearer {log.open('deep')}"}
    deep = {"role": "user", "content": "x", "extra": json.loads("[" * 250 + "]" * 250)}
    with served(counting_upstream(seen)) as upstream, served(build_proxy(upstream + "/v1", str(tmp_path))) as px:
        url = f"{px}/episodes/deep/v1/chat/completions"
        reply = httpx.post(url, json={"model": "m", "messages": [deep]}, headers=auth)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"].startswith(
            "the request is not a chat completion the proxy can record: the call log could not read it back (Invalid "
            "JSON: recursion limit exceeded")
        assert seen == []
        assert httpx.post(url, json={"model": "m", "messages": [USER]}, headers=auth).status_code == 200
    calls, unreadable = log.scan("deep")
    assert unreadable == [] and [(c.index, c.status) for c in calls] == [(0, "refused"), (1, "ok")]
    assert calls[0].messages == [] and len(seen) == 1


def test_a_request_over_8_mib_is_refused_by_default(tmp_path):
    """One call must not fill the disk: 8 MiB is the default bound."""
    log = CallLog(tmp_path)
    auth = {"Authorization": f"Bearer {log.open('big')}"}
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * (8 * 2**20)}]})
    with served(build_proxy("http://127.0.0.1:9/v1", str(tmp_path))) as px:
        reply = httpx.post(f"{px}/episodes/big/v1/chat/completions", content=body, headers=auth)
    assert reply.status_code == 413
    assert [(c.status, c.error) for c in log.read("big")] == \
        [("refused", "the request body is over the proxy's limit of 8388608 bytes")]


def test_an_upstream_echoing_the_proxys_key_shows_it_neither_to_the_harness_nor_to_the_log(tmp_path, monkeypatch):
    """An upstream that echoes the proxy's key must not show it to the harness: not in a stream (a key
    split between chunks passes any per-chunk redaction), not escaped in JSON, not in an error."""
    monkeypatch.setattr("gymfoundry.envs.secrets._registered", set())  # the key is this test's alone, not the process's
    log = CallLog(tmp_path)
    auth = {"Authorization": f"Bearer {log.open('echo')}"}
    with served(echo_upstream()) as upstream, \
            served(build_proxy(upstream + "/v1", str(tmp_path), api_key=KEY)) as px:
        url = f"{px}/episodes/echo/v1/chat/completions"
        with httpx.stream("POST", url, json={"model": "m", "stream": True, "messages": [USER]}, headers=auth) as reply:
            lines = list(reply.iter_lines())
        plain = httpx.post(url, json={"model": "m", "messages": [USER]}, headers=auth)
        error = httpx.post(url, json={"model": "m", "messages": [{"role": "user", "content": "error"}]}, headers=auth)
        streamed_error = httpx.post(url, json={"model": "m", "stream": True,
                                               "messages": [{"role": "user", "content": "error"}]}, headers=auth)
    chunks = [json.loads(line[5:]) for line in lines if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    content = "".join(d.get("content") or "" for d in deltas)
    arguments = "".join(t["function"]["arguments"] for d in deltas for t in d.get("tool_calls") or [])
    assert lines[-2:] == ["data: [DONE]", ""]
    assert content.startswith("the header I was sent: Bearer [REDACTED]") and content.endswith(" thanks, the end")
    assert json.loads(arguments)["note"].startswith("Bearer [REDACTED]")
    assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"].startswith("header: Bearer ")
    assert error.status_code == streamed_error.status_code == 400
    seen = [content, arguments, plain.json()["choices"][0]["message"]["content"], error.text, streamed_error.text]
    for text in seen:
        assert KEY not in text and KEY[-12:] not in text and MASK in text, text
    records = (tmp_path / "harness" / "calls" / "echo.jsonl").read_text()
    assert KEY not in records and KEY[-12:] not in records
    calls = log.read("echo")
    assert [c.status for c in calls] == ["ok", "ok", "refused", "refused"]
    assert calls[0].response["content"] == content and calls[0].tool_calls[0]["function"]["arguments"] == arguments


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def slow_client(port: int, sent: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(sent)
    sock.settimeout(60)
    return sock


def closed_unanswered(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:  # the server aborts: a reset, never a reply
        return True


def test_the_proxy_command_cuts_slow_clients_and_closes_connections_over_its_cap_with_a_line_per_10_s(tmp_path):
    """The proxy's limits are serve-env's (tasks.harness.http_guard), with the same options: one clock for a
    request's head and body, and a connection over the cap closed as it is accepted (answering 503
    would need its head first, so slow clients over the cap would still hold descriptors)."""
    token = CallLog(tmp_path).open("slow")
    port = free_port()
    proxy = subprocess.Popen([sys.executable, "-m", "gymfoundry.flows.cli", "proxy", "--upstream", "http://127.0.0.1:9/v1",
                              "--port", str(port), "--read-timeout", "1", "--max-connections", "2",
                              "--max-retries", "0", "--data-dir", str(tmp_path)], cwd=ROOT,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            assert proxy.poll() is None and time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.2)
        head = slow_client(port, b"POST /episodes/slow/v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        body = slow_client(port, f"POST /episodes/slow/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: "
                                 f"Bearer {token}\r\nContent-Length: 100\r\n\r\n{{\"mod".encode())
        assert closed_unanswered(head) and closed_unanswered(body)  # no 408: cut, as serve-env cuts
        held = [slow_client(port, b"") for _ in range(2)]  # the cap: 2 at once
        extra = slow_client(port, b"")
        assert closed_unanswered(extra)  # a third is closed as it is accepted
        assert all(closed_unanswered(sock) for sock in held)  # and the two held are cut in turn
        for sock in (head, body, extra, *held):
            sock.close()
        answer = httpx.post(f"http://127.0.0.1:{port}/episodes/slow/v1/chat/completions", json={"messages": [USER]},
                            headers={"Authorization": f"Bearer {token}"}, timeout=60)
        assert answer.status_code == 502  # a whole request is served (the upstream is down)
    finally:
        proxy.terminate()
        _, said = proxy.communicate(timeout=60)
    lines = [line for line in said.splitlines() if f"127.0.0.1:{port}: connection " in line]
    assert [line for line in lines if "refused" in line] == [
        f"http 127.0.0.1:{port}: connection refused: 2 open, the most served at once (--max-connections)"]
    cut = [line for line in lines if "cut" in line]  # 4 cut (head, body, the 2 held): a line per 10 s, not one each
    assert 1 <= len(cut) < 4 and cut[0] == (f"http 127.0.0.1:{port}: connection cut: its request was not in "
                                            "within 1 s (--read-timeout)")
    assert [c.status for c in CallLog(tmp_path).read("slow")] == ["fault"]  # only the whole request was recorded


def test_an_upstream_url_with_a_password_is_refused_without_repeating_it(tmp_path):
    """httpx would send the URL's user name and password in place of the proxy's key, and the URL is
    what records name as the upstream."""
    with pytest.raises(ValueError) as refused:
        build_proxy("http://alice:s3cret-pass-word@127.0.0.1:9/v1", str(tmp_path), api_key=KEY)
    assert "s3cret-pass-word" not in str(refused.value)
    assert str(refused.value) == ("the endpoint URL http://[REDACTED]@127.0.0.1:9/v1 holds a user name or password: "
                                  "put the password in the variable --api-key-env names, not in the URL")
