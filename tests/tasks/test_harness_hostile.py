"""The harness as the examinee, attacking the public interface (serve-env's HTTP endpoints and the
proxy on 127.0.0.1): what it controls must never turn its failing episode into a fault, a class
outside every statistic or a success, never show it a verdict, and never crash the proxy."""

from __future__ import annotations

import json
import time

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from gymfoundry import envs  # noqa: F401
from gymfoundry.envs.records import MODEL_OUTCOMES, Termination
from gymfoundry.envs.secrets import SECRET_ENV_VARS
from gymfoundry.tasks.harness.hub import EpisodeHub
from gymfoundry.tasks.harness.mcp_server import build_app, served
from gymfoundry.tasks.harness.proxy import build_proxy
from tests.tasks.harness_stub import scripted_inventory
from tests.verifiers.openai_stub import OpenAIStub

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]  # the harness servers and proxy, over HTTP


def slow_stream(delay_s: float = 1.0, gap_s: float = 0.2):
    """An upstream whose stream starts after `delay_s`, then three chunks `gap_s` apart."""
    async def chat(request):
        await request.json()

        async def events():
            await anyio.sleep(delay_s)
            for n in range(3):
                yield "data: " + json.dumps({"model": "m", "choices": [{"index": 0, "delta": {"content": f"w{n} "}}]}) \
                    + "\n\n"
                await anyio.sleep(gap_s)
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")
    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def wait_for_calls(hub: EpisodeHub, name: str, n: int) -> list:
    """The episode's first `n` logged calls, once logged (the module's timeout ends a wait that never does)."""
    while len(calls := hub.log.read(name)) < n:
        time.sleep(0.05)
    return calls


def test_a_failing_harness_cannot_leave_the_statistics_by_ending_on_a_request_of_its_own(tmp_path):
    """Garbage, a model the upstream does not serve, a submit that failed after a garbage request:
    each episode stays a model outcome (before: `policy_error`, outside every success rate)."""
    def upstream_answer(body, headers):
        if body.get("model") != "stub-model":
            return 404, {"error": {"message": "model not found", "code": "model_not_found"}}
        return scripted_inventory(body, headers)

    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with OpenAIStub(respond=upstream_answer) as upstream, served(build_proxy(upstream.base_url, str(tmp_path))) as px:
        for name, request in [("garbage", {"content": b"not json"}),
                              ("nomodel", {"json": {"model": "nope", "messages": [{"role": "user", "content": "x"}]}})]:
            token = hub.open(name)
            hub.goal(name)
            hub.call(name, "find_items", {"query": "definitely not an item"})  # a failing episode
            assert httpx.post(f"{px}/episodes/{name}/v1/chat/completions", headers=auth(token),
                              **request).status_code in (400, 404)
            rollout = hub.finish(name)
            assert rollout.termination in MODEL_OUTCOMES and rollout.termination != Termination.success, name
            assert "the harness's last model request was refused" in rollout.termination_reason
        token = hub.open("denied")  # the env ends this one with a wrong submit, its tool calls from no model call
        assert httpx.post(f"{px}/episodes/denied/v1/chat/completions", content=b"[]",
                          headers=auth(token)).status_code == 400
        hub.call("denied", "submit", {"status": "denied", "note": "no"})
        assert hub.finish("denied").termination in (Termination.failure, Termination.constraint_violation)
    hub.close()


def test_a_stream_the_harness_closes_is_its_own_never_a_fault_nor_a_whole_answer(tmp_path, monkeypatch):
    # No secret known to this process (earlier tests register theirs): with one, the proxy holds a
    # chunk shorter than it back until more text follows, and the first chunk would come 3 s later.
    monkeypatch.setattr("gymfoundry.envs.secrets._registered", set())
    for name in SECRET_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    # the chunks 3 s apart: a loaded machine still sees the harness leave before the stream's end
    with served(slow_stream(gap_s=3.0)) as upstream, served(build_proxy(upstream + "/v1", str(tmp_path))) as px:
        early, midway = hub.open("early"), hub.open("midway")
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": hub.goal("early")}]}
        with httpx.stream("POST", f"{px}/episodes/early/v1/chat/completions", json=body, headers=auth(early)) as reply:
            assert reply.status_code == 200  # and the harness walks away before the first chunk
        with httpx.stream("POST", f"{px}/episodes/midway/v1/chat/completions", json=body,
                          headers=auth(midway), timeout=30) as reply:
            for line in reply.iter_lines():
                if line.startswith("data:"):
                    break  # one chunk, then it walks away
        [early] = wait_for_calls(hub, "early", 1)
        [midway] = wait_for_calls(hub, "midway", 1)
        assert early.status == midway.status == "cancelled"  # before: a fault, and a partial answer as "ok"
        assert midway.response is None
        for name in ("early", "midway"):
            rollout = hub.finish(name)
            assert rollout.termination in MODEL_OUTCOMES, (name, rollout.termination, rollout.termination_reason)
    hub.close()


def test_finishing_an_episode_tells_the_harness_no_verdict(tmp_path):
    """The pool repeats its tasks: a verdict shown for one episode is the answer to another."""
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with served(build_app(hub)) as env_url:
        token = hub.open("probe")
        hub.call("probe", "submit", {"status": "denied", "note": "guess"})
        reply = httpx.post(f"{env_url}/episodes/probe/finish", headers=auth(token))
        assert reply.status_code == 200
        assert set(reply.json()) == {"episode", "rollout_id", "task_id"}
        assert not any(t.value in reply.text for t in Termination)
    hub.close()


def test_a_chat_request_the_proxy_cannot_record_is_refused_clearly_and_the_proxy_goes_on(tmp_path):
    """Messages that are not objects, tools that are not a list, text that is not Unicode, nesting
    past any parser: a 400 that says so, recorded as the harness's refused request (before: the
    proxy answered 500 and recorded nothing). A reply that cannot be stored is the upstream's."""
    def answer(body, headers):
        if body["messages"][0]["content"] == "surrogate please":
            return 200, {"model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "\ud800"}}]}
        return scripted_inventory(body, headers)

    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    user = {"role": "user", "content": "x"}
    with OpenAIStub(respond=answer) as upstream, served(build_proxy(upstream.base_url, str(tmp_path))) as px:
        url, headers = f"{px}/episodes/bad/v1/chat/completions", auth(hub.open("bad"))
        bodies = [json.dumps({"model": "m", "messages": [1, "x", None]}),
                  json.dumps({"model": "m", "messages": [user], "tools": "not a list"}),
                  '{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
                  '{"model": "m", "messages": [' + "[" * 100_000 + "]" * 100_000 + "]}"]
        for body in bodies:
            reply = httpx.post(url, content=body, headers={"content-type": "application/json", **headers})
            assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error", reply.text
        assert len(upstream.requests) == 0  # never forwarded
        assert [c.status for c in hub.log.read("bad")] == ["refused"] * 4
        reply = httpx.post(url, json={"model": "m", "messages": [{"role": "user", "content": "surrogate please"}]},
                           headers=headers)
        assert reply.status_code == 502
        assert hub.log.read("bad")[-1].status == "fault"
        good = hub.open("good")  # the proxy goes on serving
        reply = httpx.post(f"{px}/episodes/good/v1/chat/completions", headers=auth(good),
                           json={"model": "m", "messages": [{"role": "user", "content": hub.goal("good")}]})
        assert reply.status_code == 200 and [c.status for c in hub.log.read("good")] == ["ok"]
    hub.close()


def test_a_failing_harness_cannot_drop_its_episode_by_spraying_candidate_secrets(tmp_path):
    """The inventory's hidden credit limit is a decimal in a known range: a harness that failed can
    send its model every candidate. Before, the leak scan of the proxy's records then kept the
    episode out of the warehouse (and of every statistic); now it lands, a model outcome."""
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0)
    with OpenAIStub(respond=lambda body, headers: (200, {"model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}}]})) as upstream, \
            served(build_proxy(upstream.base_url, str(tmp_path))) as px:
        token = hub.open("sprayer")
        goal = hub.goal("sprayer")
        hub.call("sprayer", "find_items", {"query": "definitely not an item"})  # a failing episode
        limit = hub.episode("sprayer").task.hidden.secrets[0]
        cents = int(limit.replace(".", ""))
        spray = " ".join(f"{c // 100}.{c % 100:02d}" for c in range(cents - 2000, cents + 2000))  # in the test: near it
        body = {"model": "m", "messages": [{"role": "user", "content": goal}, {"role": "user", "content": spray}]}
        assert httpx.post(f"{px}/episodes/sprayer/v1/chat/completions", json=body,
                          headers=auth(token)).status_code == 200
        episode = hub.episode("sprayer")
        hub.finish("sprayer")
    hub.close()
    assert episode.landing_error is None and episode.harness_leak
    from gymfoundry.warehouse import Warehouse
    with Warehouse(tmp_path, read_only=True) as wh:
        [rollout] = wh.load_rollouts()
    assert rollout.rollout_id == episode.rollout.rollout_id
    assert rollout.termination in MODEL_OUTCOMES and rollout.termination != Termination.success
    assert limit not in rollout.model_dump_json()


def test_a_harness_that_asks_a_stronger_model_for_a_turn_credits_both_models(tmp_path):
    """The upstream serves two models; the harness asks the big one for the first (hard) turn and
    the model under test for the rest. Before, the episode was the last call's model's alone."""
    def two_models(body, headers):
        status, payload = scripted_inventory(body, headers)
        return status, {**payload, "model": body["model"]}

    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with OpenAIStub(respond=two_models) as upstream, served(build_proxy(upstream.base_url, str(tmp_path))) as px:
        token = hub.open("mixed")
        messages = [{"role": "user", "content": hub.goal("mixed")}]
        for turn in range(4):
            body = {"model": "big" if turn == 0 else "small", "messages": messages}
            message = httpx.post(f"{px}/episodes/mixed/v1/chat/completions", json=body,
                                 headers=auth(token)).json()["choices"][0]["message"]
            call = message["tool_calls"][0]
            text, _ = hub.call("mixed", call["function"]["name"], json.loads(call["function"]["arguments"]))
            messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": text}]
    hub.close()
    [rollout] = hub.rollouts
    assert rollout.termination == Termination.success
    assert rollout.policy_id == "harness:big+small"


def test_a_harness_that_sleeps_past_the_episode_limit_gets_no_timeout_outside_the_statistics(tmp_path):
    """A failing harness waits out the episode's clock, then calls a tool: the runtime ends the
    episode on its time limit. Before, that was `timeout`, outside every success rate; the time was
    the harness's own (no tool or model call took it), so it is a model outcome."""
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with served(build_app(hub)):
        hub.open("sleeper")
        hub.call("sleeper", "find_items", {"query": "definitely not an item"})
        clock = hub.episode("sleeper").env.env
        clock.deadline = time.monotonic() - 1  # as if it slept the task's 120 s away
        text, is_error = hub.call("sleeper", "find_items", {"query": "anything"})
        assert is_error and "time limit" in text
    hub.close()
    [rollout] = hub.rollouts
    assert rollout.termination == Termination.truncated, rollout.termination_reason
    assert "the policy's own time ran out" in rollout.termination_reason  # the runtime's clock says whose


def test_a_step_over_its_own_limit_is_an_environment_fault(tmp_path, monkeypatch):
    """The other side of the rule: a tool that runs past the step's limit is the env's time."""
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    hub.open("slow-tool")
    clock = hub.episode("slow-tool").env.env
    clock.step_timeout_s = 0.2
    inner = clock.env

    def slow_step(action):
        time.sleep(1.0)
        return type(inner).step(inner, action)
    monkeypatch.setattr(inner, "step", slow_step)
    text, is_error = hub.call("slow-tool", "find_items", {"query": "anything"})
    assert is_error and "time limit" in text
    hub.close()
    [rollout] = hub.rollouts
    assert rollout.termination == Termination.env_fault


def mcp_tool_call(client: httpx.AsyncClient, url: str, tool: str, arguments: dict, auth: dict | None = None):
    """One tools/call of the current (stateless) MCP protocol, as a harness's client sends it."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"_meta": meta, "name": tool,
                                                                          "arguments": arguments}}
    headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28",
               "mcp-method": "tools/call", "mcp-name": tool, **(auth or {})}
    return client.post(url, json=body, headers=headers, timeout=60)


def test_many_calls_on_one_slow_episode_do_not_wedge_the_other_sessions(tmp_path, monkeypatch):
    """45 concurrent tool calls on one episode whose tool takes 0.3 s: they wait for the episode in
    turn. Before, each waited in a worker thread of the 40 the server shares, so another harness's
    request waited behind them all (seconds); now it is answered at once."""
    import asyncio

    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    hog, other = auth(hub.open("hog")), auth(hub.open("other"))
    inner = hub.episode("hog").env.env.env

    def slow_step(action):
        time.sleep(0.3)
        return type(inner).step(inner, action)
    monkeypatch.setattr(inner, "step", slow_step)

    async def attack(env_url):
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=100)) as client:
            flood = [asyncio.create_task(mcp_tool_call(client, f"{env_url}/episodes/hog/mcp", "get_stock",
                                                       {"sku": "nope"}, hog)) for _ in range(45)]
            await asyncio.sleep(0.5)  # the flood is in
            reply = await mcp_tool_call(client, f"{env_url}/episodes/other/mcp", "find_items", {"query": "a"}, other)
            queued = sum(not call.done() for call in flood)  # the hog's calls still waiting their turn
            assert reply.status_code == 200, reply.text
            replies = await asyncio.gather(*flood)
            assert all(r.status_code == 200 for r in replies)
            return queued

    with served(build_app(hub)) as env_url:
        queued = asyncio.run(attack(env_url))
    hub.close()
    # the flood takes 45 x 0.3 s in turn: the other session was answered with it still queued, not behind it
    assert queued >= 30, f"another session waited behind {45 - queued} of the flood's 45 calls"


def test_a_harness_reading_its_stream_slowly_does_not_make_the_upstream_late(tmp_path):
    """The upstream sends its whole stream at once (about 12 MB); the harness reads it slowly, past
    the proxy's 1 s limit. Before, the time the relay waited on the harness counted against the
    upstream: an inference fault of the harness's making. Now the call is whole and `ok`."""
    big = "x" * 60_000

    async def chat(request):
        await request.json()

        async def events():
            for n in range(200):
                yield "data: " + json.dumps({"model": "m", "choices": [{"index": 0, "delta": {"content": big}}]}) \
                    + "\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    fast = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with served(fast) as upstream, served(build_proxy(upstream + "/v1", str(tmp_path), timeout_s=1.0)) as px:
        token = hub.open("slow-reader")
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": hub.goal("slow-reader")}]}
        chunks = 0
        with httpx.stream("POST", f"{px}/episodes/slow-reader/v1/chat/completions", json=body, timeout=60,
                          headers=auth(token)) as reply:
            for line in reply.iter_lines():
                if line.startswith("data:"):
                    chunks += 1
                    time.sleep(0.02)
        assert chunks == 201  # read 20 ms a chunk: about 4 s, past the proxy's 1 s limit
        [call] = wait_for_calls(hub, "slow-reader", 1)
        assert call.status == "ok", call.error
        assert len(call.response["content"]) == 200 * len(big)
    hub.close()


@pytest.mark.parametrize("status", [401, 403])
def test_an_upstream_refusing_the_proxys_key_is_an_inference_fault_never_the_harness(tmp_path, status):
    """The harness's own key is never forwarded: an upstream answering 401/403 refused the proxy's
    credentials, and counting the episode as the harness's (a model outcome) would blame the model."""
    from tests.tasks.policy_endpoint import always

    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with OpenAIStub(respond=always(status, {"error": {"message": "bad key"}})) as upstream, \
            served(build_proxy(upstream.base_url, str(tmp_path))) as px:
        token = hub.open("keyless")
        body = {"model": "m", "messages": [{"role": "user", "content": hub.goal("keyless")}]}
        assert httpx.post(f"{px}/episodes/keyless/v1/chat/completions", json=body,
                          headers=auth(token)).status_code == status
    rollout = hub.finish("keyless")
    hub.close()
    assert rollout.termination == Termination.inference_fault


def test_a_request_body_over_the_limit_is_refused_unread_and_recorded(tmp_path):
    """A harness that sends a huge body (declared, or streamed without a length) gets 413 and a
    refused call on record; the upstream never sees it, and a request under the limit still passes."""
    seen = []

    def upstream_answer(body, headers):
        seen.append(body)
        return scripted_inventory(body, headers)

    hub = EpisodeHub("inventory", tmp_path, tasks=1, seed=0, land=False)
    small = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]}
    huge = json.dumps({**small, "messages": [{"role": "user", "content": "x" * 5000}]}).encode()

    def chunks():
        for i in range(0, len(huge), 512):
            yield huge[i:i + 512]

    with pytest.raises(ValueError, match="positive number of bytes"):
        build_proxy("http://127.0.0.1:9", str(tmp_path), max_request_bytes=0)
    limit = len(json.dumps(small)) + 100
    with OpenAIStub(respond=upstream_answer) as upstream, \
            served(build_proxy(upstream.base_url, str(tmp_path), max_request_bytes=limit)) as px:
        headers = auth(hub.open("big"))
        url = f"{px}/episodes/big/v1/chat/completions"
        declared = httpx.post(url, content=huge, headers=headers)
        streamed = httpx.post(url, content=chunks(), headers=headers)  # no Content-Length: read to the limit
        assert (declared.status_code, streamed.status_code) == (413, 413)
        assert f"over the proxy's limit of {limit} bytes" in declared.json()["error"]["message"]
        assert httpx.post(url, json=small, headers=headers).status_code == 200
        calls = wait_for_calls(hub, "big", 3)
    hub.close()
    assert [c.status for c in calls] == ["refused", "refused", "ok"]
    assert len(seen) == 1 and seen[0]["messages"] == small["messages"]


def test_a_harness_hanging_up_mid_body_spends_no_call_number_and_a_restart_continues_after_the_last(tmp_path):
    """The proxy numbers a call once its body is in: a client that disconnects while sending made no
    call. A restarted proxy numbers after the highest index on record (a gap left by a crash is
    never filled with a second call of the same number)."""
    from gymfoundry.tasks.harness.hub import CallLog

    path, token = "/episodes/ep/v1/chat/completions", CallLog(str(tmp_path)).open("ep")

    async def post(app, parts: list[bytes], hang_up: bool = False) -> list:
        messages = [{"type": "http.request", "body": p, "more_body": True} for p in parts]
        if hang_up:
            messages.append({"type": "http.disconnect"})
        else:
            messages[-1]["more_body"] = False
        sent = []

        async def receive():
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
                 "headers": [(b"content-type", b"application/json"), (b"authorization", f"Bearer {token}".encode())],
                 "client": ("c", 1), "server": ("s", 80)}
        try:
            await app(scope, receive, send)
        except Exception as exc:  # Starlette's ClientDisconnect reaches the server, which drops the connection
            return [type(exc).__name__]
        return [m["status"] for m in sent if m["type"] == "http.response.start"]

    app = build_proxy("http://127.0.0.1:9", str(tmp_path))
    assert anyio.run(post, app, [b'{"messages": ['], True) == ["ClientDisconnect"]
    assert anyio.run(post, app, [b"not json"]) == [400]
    log = CallLog(str(tmp_path))
    assert [c.index for c in log.read("ep")] == [0]
    gap = log.read("ep")[0].model_copy(update={"index": 5})  # what a proxy that crashed mid-way left
    log.append(gap)
    restarted = build_proxy("http://127.0.0.1:9", str(tmp_path))
    assert anyio.run(post, restarted, [b"still not json"]) == [400]
    assert [c.index for c in CallLog(str(tmp_path)).read("ep")] == [0, 5, 6]
