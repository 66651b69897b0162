"""Bring your own agent harness: an agent written with the OpenAI Agents SDK, unmodified except for
its base URL and MCP server address, plays inventory episodes through `serve-env` (MCP) and the
recording proxy; the episodes land as ordinary rollouts. Everything runs on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import pytest
from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from agents.mcp import MCPServerStreamableHttp
from openai import APIConnectionError, AsyncOpenAI

from gymfoundry import envs  # noqa: F401
from gymfoundry.envs.harness import ModelCall
from gymfoundry.envs.leaks import hidden_values
from gymfoundry.envs.records import Split, Termination
from gymfoundry.tasks.stages.assemble import assemble_datasets
from gymfoundry.tasks.harness.hub import EpisodeHub
from gymfoundry.tasks.harness.mcp_server import build_app, served
from gymfoundry.tasks.harness.proxy import build_proxy, merged
from tests.tasks.harness_stub import LOGPROBS, TOKEN_IDS, scripted_inventory
from tests.tasks.policy_endpoint import always
from tests.verifiers.openai_stub import OpenAIStub
from gymfoundry.warehouse import Warehouse
from tests.audits import audited

ROOT = Path(__file__).resolve().parents[2]
set_tracing_disabled(True)  # the SDK would upload traces: no network beyond 127.0.0.1
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]  # the harness servers and proxy, over HTTP


def documented(name: str):
    """A function of docs/harness.md's Python block: the harness the docs show is the one tested."""
    (block,) = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "harness.md").read_text(), re.DOTALL)
    scope: dict = {}
    exec(compile(block, "docs/harness.md", "exec"), scope)
    return scope[name]


play = documented("play")  # a harness as its author wrote it; only the two addresses name the episode


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def opened(env_url: str, name: str) -> str:
    """Open an episode over HTTP, as a harness does: its token."""
    reply = httpx.post(f"{env_url}/episodes/{name}/open")
    assert reply.status_code == 201, reply.text
    return reply.json()["token"]


async def run_agent(mcp, base_url: str, token: str) -> str:
    goal = (await mcp.get_prompt("task")).messages[0].content.text
    client = AsyncOpenAI(base_url=base_url, api_key=token)
    agent = Agent(name="inventory-agent", instructions="You reserve stock for orders with the tools you have.",
                  mcp_servers=[mcp], model=OpenAIChatCompletionsModel(model="stub-model", openai_client=client))
    return (await Runner.run(agent, goal, max_turns=20)).final_output


@pytest.fixture
def stack(tmp_path):
    """(hub, env URL, proxy URL, upstream stub) for a scripted correct upstream."""
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0)
    with OpenAIStub(respond=scripted_inventory) as upstream, served(build_app(hub)) as env_url, \
            served(build_proxy(upstream.base_url, str(tmp_path))) as proxy_url:
        yield hub, env_url, proxy_url, upstream
    hub.close()


def test_an_agents_sdk_episode_lands_with_steps_outcome_scores_and_in_the_next_sft_dataset(stack, tmp_path):
    hub, env_url, proxy_url, upstream = stack
    assert asyncio.run(play(env_url, proxy_url, "ep-1")) == "Done."
    hub.wait_landed()
    assert hub.tasks[0].split == Split.train
    with Warehouse(tmp_path, read_only=True) as wh:
        [rollout] = wh.load_rollouts()
        scores = wh.sql_df("select layer, count(*) as n from step_scores group by layer order by layer").rows()
    assert rollout.termination == Termination.success and rollout.outcome.success
    assert (rollout.policy_id, rollout.policy_version) == ("harness:stub-model", f"{upstream.base_url}|fp_stub")
    assert [s.tool_call.name for s in rollout.steps] == ["request_authorization", "find_items", "reserve", "submit"]
    assert [s.tool_call.id for s in rollout.steps] == ["call_0", "call_1", "call_2", "call_3"]
    assert all(s.token_ids == TOKEN_IDS and s.logprobs == LOGPROBS for s in rollout.steps)
    assert rollout.cost.tokens == 12 and rollout.cost.tool_calls == 4
    assert rollout.env_info["harness"] == {"episode": "ep-1", "model_calls": 4, "records": 1}
    # what the model saw is the recorded request: the SDK's own system prompt, then the goal
    assert rollout.steps[0].observation.startswith("You reserve stock for orders with the tools you have.\nOrder ")
    assert ("combined", 4) in scores and ("rules", 4) in scores
    audited(tmp_path, ["inventory"])
    sft = assemble_datasets(tmp_path, ["inventory"], kinds=("sft",))["sft"]
    assert sft["rows"] == 1
    with Warehouse(tmp_path, read_only=True) as wh:
        assert wh.sql_df("select rollout_ids from dataset_rows").rows() == [([rollout.rollout_id],)]


def test_an_unknown_tool_or_bad_arguments_is_an_error_result_and_the_episode_goes_on(stack, tmp_path):
    hub, env_url, _, _ = stack

    token = opened(env_url, "clumsy")

    async def session():
        async with MCPServerStreamableHttp(params={"url": f"{env_url}/episodes/clumsy/mcp", "headers": auth(token)}) as mcp:
            unknown = await mcp.call_tool("delete_everything", {})
            bad = await mcp.call_tool("get_stock", {"sku": 5})
            good = await mcp.call_tool("find_items", {"query": "a"})
            return unknown, bad, good

    unknown, bad, good = asyncio.run(session())
    assert unknown.is_error and json.loads(unknown.content[0].text)["error"]["type"] == "unknown_tool"
    assert bad.is_error and json.loads(bad.content[0].text)["error"]["type"] == "invalid_arguments"
    assert not good.is_error and json.loads(good.content[0].text)["ok"] is True
    finished = httpx.post(f"{env_url}/episodes/clumsy/finish", headers=auth(token)).json()
    again = httpx.post(f"{env_url}/episodes/clumsy/finish", headers=auth(token))
    assert again.status_code == 404  # an episode ends once: its name is closed
    hub.wait_landed()
    with Warehouse(tmp_path, read_only=True) as wh:
        [rollout] = wh.load_rollouts()
    assert rollout.rollout_id == finished["rollout_id"]
    assert rollout.termination == Termination.truncated  # the harness stopped before the episode ended: a model outcome
    assert [s.error for s in rollout.steps] == ["unknown_tool", "invalid_arguments", None]
    assert rollout.policy_id == "harness:unrecorded" and all(s.token_ids is None for s in rollout.steps)


def test_a_session_sees_no_state_and_no_hidden_value(stack):
    """Hostile: read every prompt and resource, ask for others, call tools named after internals."""
    hub, env_url, _, _ = stack

    token = opened(env_url, "snoop")

    async def snoop():
        async with MCPServerStreamableHttp(params={"url": f"{env_url}/episodes/snoop/mcp", "headers": auth(token)}) as mcp:
            texts = [json.dumps([t.model_dump(mode="json") for t in await mcp.list_tools()])]
            texts += [json.dumps((await mcp.list_prompts()).model_dump(mode="json")),
                      json.dumps((await mcp.get_prompt("task")).model_dump(mode="json"))]
            session = mcp.session
            texts.append(json.dumps((await session.list_resources()).model_dump(mode="json")))
            texts.append(json.dumps((await session.read_resource("gymfoundry://episode/goal")).model_dump(mode="json")))
            refused = []
            for ask in (lambda: mcp.get_prompt("hidden"), lambda: session.read_resource("gymfoundry://episode/state"),
                        lambda: session.read_resource("file:///etc/passwd")):
                try:
                    await ask()
                except Exception as exc:  # an MCP error, the session goes on
                    refused.append(type(exc).__name__)
            for tool in ("state", "_state", "hidden", "__class__", "tool_state", "verify", "_check_call"):
                result = await mcp.call_tool(tool, {})
                texts.append(result.content[0].text)
                assert result.is_error and json.loads(result.content[0].text)["error"]["type"] == "unknown_tool"
            return texts, refused

    texts, refused = asyncio.run(snoop())
    assert len(refused) == 3
    task = hub.episode("snoop").task
    secrets = [v for v in hidden_values(task)] + [json.dumps(task.hidden.checks, sort_keys=True)]
    assert not [v for v in secrets for text in texts if v in text]
    joined = "\n".join(texts[:5])  # the tools, prompts and resources (an error result names the tool asked for)
    for field in ("initial_state", "reference", "hidden", "checks", task.task_id):
        assert field not in joined


def test_an_episode_is_named_by_a_safe_name_only(stack, tmp_path):
    hub, env_url, proxy_url, _ = stack
    for bad in ("..%2F..%2Fx", "-x", "a" * 65, "a%20b"):
        assert httpx.post(f"{env_url}/episodes/{bad}/mcp", json={}).status_code == 404
        assert httpx.post(f"{proxy_url}/episodes/{bad}/v1/chat/completions", json={"messages": []}).status_code == 404
        assert httpx.post(f"{env_url}/episodes/{bad}/finish").status_code == 404
        assert httpx.post(f"{env_url}/episodes/{bad}/open").status_code == 404
    assert httpx.post(f"{proxy_url}/v1/chat/completions", json={"messages": []}).status_code == 404  # no name at all
    assert sorted(p.name for p in (tmp_path / "harness" / "calls").iterdir() if p.suffix != ".lock") == []
    assert len(hub.rollouts) == 0


def test_an_upstream_answering_500_gives_an_inference_fault_never_a_model_failure(tmp_path):
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with OpenAIStub(respond=always(500)) as upstream, served(build_app(hub)) as env_url, \
            served(build_proxy(upstream.base_url, str(tmp_path), retry_backoff_s=0.01)) as proxy_url:
        with pytest.raises(Exception, match="500"):
            asyncio.run(play(env_url, proxy_url, "down"))
        hub.finish("down")
        finished = hub.reply("down")
    hub.close()
    assert finished["rollout_id"] == hub.rollouts[0].rollout_id
    [rollout] = hub.rollouts
    assert rollout.termination == Termination.inference_fault
    assert "HTTP 500" in rollout.termination_reason and rollout.steps == []
    calls = hub.log.read("down")
    # each request of the harness's was sent 3 times by the proxy (its 2 retries) before it was a fault
    assert 3 * len(calls) == len(upstream.requests) >= 3 and {c.status for c in calls} == {"fault"}


def test_an_upstream_that_cannot_be_reached_is_an_inference_fault(tmp_path):
    from tests.tasks.policy_endpoint import closed_port_url

    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with served(build_app(hub)) as env_url, served(build_proxy(closed_port_url(), str(tmp_path))) as proxy_url:
        token = opened(env_url, "cut")
        reply = httpx.post(f"{proxy_url}/episodes/cut/v1/chat/completions", headers=auth(token),
                           json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 502
        assert httpx.post(f"{env_url}/episodes/cut/finish", headers=auth(token)).status_code == 200
    hub.close()
    assert hub.rollouts[0].termination == Termination.inference_fault
    assert "connection to http://127.0.0.1" in hub.rollouts[0].termination_reason


def test_32_concurrent_harnesses_land_32_rollouts_with_distinct_ids(stack, tmp_path):
    hub, env_url, proxy_url, _ = stack

    async def many():
        return await asyncio.gather(*(play(env_url, proxy_url, f"par-{k}") for k in range(32)))

    assert asyncio.run(many()) == ["Done."] * 32
    hub.wait_landed(300)
    with Warehouse(tmp_path, read_only=True) as wh:
        rows = wh.sql_df("select rollout_id, termination, env_info from rollouts").rows()
    assert len({r[0] for r in rows}) == 32
    assert {r[1] for r in rows} == {"success"}
    assert sorted(json.loads(r[2])["harness"]["episode"] for r in rows) == sorted(f"par-{k}" for k in range(32))


def test_an_episode_split_into_three_records_weighs_as_one_of_one_record(tmp_path):
    """A harness that re-renders its context (summaries) sends 3 conversations for one episode:
    still one rollout, the same steps, cost and dataset weight; each step's observation is what
    the model was sent in that request."""
    from gymfoundry.tasks.stages.assemble import sft_rows
    from gymfoundry.tasks.stages.curriculum import success_rates

    hub = EpisodeHub("inventory", tmp_path, tasks=1, seed=0, land=False)

    def episode(name: str, summarise_at: tuple[int, ...]) -> None:
        hub.open(name)
        history = [{"role": "system", "content": "sys"}, {"role": "user", "content": hub.goal(name)}]
        sent = list(history)
        for n in range(5):
            if n in summarise_at:  # the harness starts a fresh conversation from its own summary
                sent = [{"role": "system", "content": "sys"}, {"role": "user", "content": f"summary {n}"}]
            _, payload = scripted_inventory({"messages": history}, {})
            message = payload["choices"][0]["message"]
            hub.log.append(ModelCall(episode_id=name, index=n, model="m", upstream="u", messages=sent, response=message,
                                     token_ids=[n], logprobs=[-0.5]))
            if not message.get("tool_calls"):
                break
            call = message["tool_calls"][0]
            result, _ = hub.call(name, call["function"]["name"], json.loads(call["function"]["arguments"]))
            tool_message = {"role": "tool", "tool_call_id": call["id"], "content": result}
            history += [message, tool_message]
            sent = sent + [message, tool_message]

    episode("one", ())
    episode("three", (2, 3))
    submit = {"id": "c", "type": "function", "function": {"name": "submit", "arguments": '{"status": "denied"}'}}
    hub.open("gives-up")
    hub.log.append(ModelCall(episode_id="gives-up", index=0,
                             messages=[{"role": "user", "content": hub.goal("gives-up")}],
                             response={"role": "assistant", "content": None, "tool_calls": [submit]}))
    hub.call("gives-up", "submit", {"status": "denied"})
    hub.close()
    gives_up, one, three = sorted(hub.rollouts, key=lambda r: r.env_info["harness"]["episode"])
    assert gives_up.termination == Termination.failure
    assert (one.env_info["harness"]["records"], three.env_info["harness"]["records"]) == (1, 3)
    assert one.termination == three.termination == Termination.success
    assert one.cost.model_dump(exclude={"wall_time_s"}) == three.cost.model_dump(exclude={"wall_time_s"})
    assert [s.token_ids for s in three.steps] == [[0], [1], [2], [3]]
    assert [s.observation for s in three.steps][2:] == ["sys\nsummary 2", "sys\nsummary 3"]
    rows = sft_rows({hub.tasks[0].task_id: hub.tasks[0]}, [one, three], {})
    assert [r.rollout_id for r in rows] == [one.rollout_id, three.rollout_id]
    rates = success_rates([{"task_family": "inventory", "difficulty": hub.tasks[0].difficulty.level,
                            "termination": r.termination.value} for r in (three, gives_up)], prior=0.0)
    assert rates == {f"inventory/{hub.tasks[0].difficulty.level}": 0.5}  # per record it would be 3 of 4


def test_serve_env_over_stdio_plays_one_episode_and_lands_it(tmp_path):
    """The CLI as a harness launches it: `gymfoundry serve-env --transport stdio` is the MCP server."""
    import sys

    from agents.mcp import MCPServerStdio

    command = [sys.executable, "-m", "gymfoundry.flows.cli", "serve-env", "--family", "inventory", "--transport", "stdio",
               "--episode", "stdio-1", "--tasks", "4", "--data-dir", str(tmp_path)]
    token = "launcher-chosen-token"  # the launcher owns the process it starts, and so the episode
    with OpenAIStub(respond=scripted_inventory) as upstream, \
            served(build_proxy(upstream.base_url, str(tmp_path))) as proxy_url:
        async def session():
            params = {"command": command[0], "args": command[1:], "cwd": str(ROOT),
                      "env": {"GYMFOUNDRY_EPISODE_TOKEN": token}}
            async with MCPServerStdio(params=params, client_session_timeout_seconds=120) as mcp:
                return await run_agent(mcp, f"{proxy_url}/episodes/stdio-1/v1", token)

        assert asyncio.run(session()) == "Done."
    deadline, rollouts = time.monotonic() + 60, []
    while not rollouts and time.monotonic() < deadline:  # the server may still be landing (it holds the catalog)
        try:
            with Warehouse(tmp_path, read_only=True) as wh:
                rollouts = wh.load_rollouts()
        except Exception:
            time.sleep(0.2)
    [rollout] = rollouts
    assert rollout.termination == Termination.success and len(rollout.steps) == 4
    assert rollout.env_info["harness"]["episode"] == "stdio-1" and rollout.steps[0].token_ids == TOKEN_IDS


def test_a_hidden_value_in_what_the_model_was_shown_lands_as_a_violation_without_it(tmp_path):
    """The leak scan covers the proxy's records: a harness that shows the model a hidden value is
    said so, loudly, and its episode lands as a constraint violation with the env's own steps only
    (never dropped: text the examinee wrote decides no drop); another episode of the batch lands."""
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0)
    with OpenAIStub(respond=scripted_inventory) as upstream, served(build_app(hub)) as env_url, \
            served(build_proxy(upstream.base_url, str(tmp_path))) as proxy_url:
        token = opened(env_url, "leaky")
        leaky = hub.episode("leaky")
        secret = leaky.task.hidden.secrets[-1]
        body = {"model": "m", "messages": [{"role": "user", "content": f"{hub.goal('leaky')}\n(psst: {secret})"}]}
        assert httpx.post(f"{proxy_url}/episodes/leaky/v1/chat/completions", json=body,
                          headers=auth(token)).status_code == 200
        assert asyncio.run(play(env_url, proxy_url, "clean")) == "Done."
    hub.close()
    assert leaky.landing_error is None and "show hidden values" in leaky.harness_leak and secret[:60] in leaky.harness_leak
    with Warehouse(tmp_path, read_only=True) as wh:
        landed = {r.env_info["harness"]["episode"]: r for r in wh.load_rollouts()}
    assert sorted(landed) == ["clean", "leaky"] and landed["clean"].termination == Termination.success
    assert landed["leaky"].termination == Termination.constraint_violation
    assert secret not in landed["leaky"].model_dump_json()


def test_a_header_names_the_episode_on_the_plain_addresses(stack):
    hub, env_url, proxy_url, _ = stack
    header = {"X-Gymfoundry-Episode": "by-header", **auth(opened(env_url, "by-header"))}
    body = {"model": "m", "messages": [{"role": "user", "content": hub.goal("by-header")}]}
    reply = httpx.post(f"{proxy_url}/v1/chat/completions", json=body, headers=header).json()
    call = reply["choices"][0]["message"]["tool_calls"][0]["function"]

    async def session():
        async with MCPServerStreamableHttp(params={"url": f"{env_url}/mcp", "headers": header}) as mcp:
            return await mcp.call_tool(call["name"], json.loads(call["arguments"]))

    assert not asyncio.run(session()).is_error
    rollout = hub.finish("by-header")
    assert [s.tool_call.name for s in rollout.steps] == [call["name"]]
    assert rollout.steps[0].token_ids == TOKEN_IDS and rollout.steps[0].tool_call.id == "call_0"


def test_an_idle_episode_ends_on_its_own(tmp_path):
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False, idle_timeout_s=0.3)
    hub.open("idle")
    hub.call("idle", "find_items", {"query": "a"})
    for _ in range(100):
        if hub.rollouts:
            break
        time.sleep(0.05)
    assert not hub.log.is_open("idle")  # its token opens nothing any more
    hub.close()
    [rollout] = hub.rollouts
    assert rollout.termination == Termination.truncated and len(rollout.steps) == 1
    assert rollout.termination_reason == "the policy stopped before the episode ended"


@pytest.mark.parametrize("status, payload, termination, reason", [
    (400, {"error": {"message": "too long", "code": "context_length_exceeded"}}, "truncated",
     "the model's context is full"),
    (400, {"error": {"message": "bad role"}}, "truncated",  # the harness's own malformed request: a model outcome
     "the policy stopped before the episode ended; the harness's last model request was refused"),
    (429, {"error": {"message": "slow down"}}, "inference_fault", "inference endpoint failed"),
    (200, {"choices": []}, "inference_fault", "inference endpoint failed: model call 0 through the proxy: unreadable"),
])
def test_where_a_model_call_failed_decides_the_class(tmp_path, status, payload, termination, reason):
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with OpenAIStub(respond=always(status, payload)) as upstream, \
            served(build_proxy(upstream.base_url, str(tmp_path))) as proxy_url:
        token = hub.open("e")
        body = {"model": "m", "messages": [{"role": "user", "content": hub.goal("e")}]}
        reply = httpx.post(f"{proxy_url}/episodes/e/v1/chat/completions", json=body, headers=auth(token))
    assert reply.status_code == (502 if status == 200 else status)  # the harness sees the upstream's answer
    rollout = hub.finish("e")
    hub.close()
    assert rollout.termination.value == termination and rollout.termination_reason.startswith(reason)


def test_the_proxy_retries_a_passing_failure_and_a_failure_after_the_end_is_not_the_episodes(tmp_path):
    """The first request fails once: the proxy sends it again itself (as the factory's endpoint
    policy would), so the harness never sees it. After the submit every request fails: the episode
    ended at the submit, a verified success."""
    def flaky(body, headers):
        if len(upstream.requests) == 1:
            return 503, {"error": {"message": "warming up"}}
        if any(c["function"]["name"] == "submit" for m in body["messages"] for c in m.get("tool_calls") or []):
            return 500, {"error": {"message": "down"}}
        return scripted_inventory(body, headers)

    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with OpenAIStub(respond=flaky) as upstream, served(build_app(hub)) as env_url, \
            served(build_proxy(upstream.base_url, str(tmp_path), retry_backoff_s=0.01)) as proxy_url:
        with pytest.raises(Exception, match="500"):
            asyncio.run(play(env_url, proxy_url, "flaky"))
    hub.close()
    [rollout] = hub.rollouts
    assert rollout.termination == Termination.success and len(rollout.steps) == 4
    statuses = [c.status for c in hub.log.read("flaky")]
    assert statuses[0] == "ok" and statuses[-1] == "fault"  # the cured 503 is no call of the harness's
    assert rollout.env_info["harness"]["model_calls"] == 4  # up to the one that submitted


def test_a_fault_the_proxy_could_not_cure_takes_the_episode_out_even_if_the_harness_retries_to_success(tmp_path):
    """Hostile: a harness that retries an upstream fault while it is doing well, and gives up while it
    is doing badly, would raise its success rate with the fault rate. The first request fails past the
    proxy's retries (3 requests); the Agents SDK client retries it and then plays a perfect episode:
    the episode is an inference fault, in no statistic, however it ended."""
    def down_at_first(body, headers):
        if len(upstream.requests) <= 3:
            return 503, {"error": {"message": "warming up"}}
        return scripted_inventory(body, headers)

    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with OpenAIStub(respond=down_at_first) as upstream, served(build_app(hub)) as env_url, \
            served(build_proxy(upstream.base_url, str(tmp_path), retry_backoff_s=0.01)) as proxy_url:
        asyncio.run(play(env_url, proxy_url, "touched"))
        rollout = hub.finish("touched")
    hub.close()
    assert [c.status for c in hub.log.read("touched")][:2] == ["fault", "ok"]
    assert len(rollout.steps) == 4 and rollout.outcome is not None and rollout.outcome.success
    assert rollout.termination == Termination.inference_fault
    assert rollout.termination_reason.startswith("inference endpoint failed: model call 0 through the proxy: HTTP 503")


def test_a_stateful_client_that_deletes_its_session_ends_its_episode(stack, tmp_path):
    """A client of the 2025 protocol (initialize, an MCP session id, DELETE on close) on the plain
    /mcp address: its session is its episode, and closing it lands the episode."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    hub, env_url, _, _ = stack
    token = opened(env_url, "stateful")

    async def session():
        async with httpx.AsyncClient(headers=auth(token)) as http, \
                streamable_http_client(f"{env_url}/episodes/stateful/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write) as mcp:
                await mcp.initialize()
                goal = (await mcp.get_prompt("task")).messages[0].content.text
                return goal, await mcp.call_tool("find_items", {"query": "a"})

    goal, result = asyncio.run(session())
    assert not result.is_error and goal.startswith("Order ")
    hub.wait_landed()
    with Warehouse(tmp_path, read_only=True) as wh:
        [rollout] = wh.load_rollouts()
    assert rollout.env_info["harness"]["episode"] == "stateful" and not hub.log.is_open("stateful")
    assert [s.tool_call.name for s in rollout.steps] == ["find_items"]
    assert rollout.termination == Termination.truncated


def test_the_commands_serve_a_harness_and_a_stopped_server_lands_its_open_episodes(tmp_path):
    """`gymfoundry serve-env` and `gymfoundry proxy` as a user starts them; SIGTERM ends serve-env,
    which lands the episode still open first."""
    import signal
    import socket
    import subprocess
    import sys

    def free_port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    def ready(url: str, probe: str) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.post(url + probe, timeout=2).status_code == 404:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise AssertionError(f"{url} did not start")

    env_port, proxy_port = free_port(), free_port()
    cli = [sys.executable, "-m", "gymfoundry.flows.cli"]
    with OpenAIStub(respond=scripted_inventory) as upstream:
        server = subprocess.Popen(cli + ["serve-env", "--family", "inventory", "--port", str(env_port), "--tasks", "4",
                                         "--data-dir", str(tmp_path)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        proxy = subprocess.Popen(cli + ["proxy", "--upstream", upstream.base_url, "--port", str(proxy_port),
                                        "--data-dir", str(tmp_path)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        try:
            env_url, proxy_url = f"http://127.0.0.1:{env_port}", f"http://127.0.0.1:{proxy_port}"
            ready(env_url, "/episodes/probe/finish")
            ready(proxy_url, "/v1/chat/completions")
            assert asyncio.run(play(env_url, proxy_url, "cli-1")) == "Done."

            token = opened(env_url, "cli-open")

            async def open_one():
                async with MCPServerStreamableHttp(params={"url": f"{env_url}/episodes/cli-open/mcp",
                                                           "headers": auth(token)}) as mcp:
                    await mcp.call_tool("find_items", {"query": "a"})

            asyncio.run(open_one())
            server.send_signal(signal.SIGTERM)
            _, said = server.communicate(timeout=120)
        finally:
            for process in (server, proxy):
                if process.poll() is None:
                    process.terminate()
                    process.wait(30)
    assert "landed" in said and "rollouts=" in said, said
    with Warehouse(tmp_path, read_only=True) as wh:
        rollouts = {r.env_info["harness"]["episode"]: r for r in wh.load_rollouts()}
    assert rollouts["cli-1"].termination == Termination.success
    assert rollouts["cli-open"].termination == Termination.truncated and len(rollouts["cli-open"].steps) == 1


def test_a_coding_harness_runs_its_commands_in_the_sandbox_and_never_sees_the_grader(tmp_path):
    """The runtime stack over MCP is the factory's: a `coding` episode's commands run in the
    family's sandbox as a non-root user, the folders the family masks are not there, and the
    rollout records the sandbox's guarantees."""
    from gymfoundry.envs.family import family

    hub = EpisodeHub("coding", tmp_path, tasks=1, seed=0, land=False)
    masked = family("coding").masked_dirs()

    async def session(url):
        token = opened(url, "code")
        async with MCPServerStreamableHttp(params={"url": f"{url}/episodes/code/mcp", "headers": auth(token)},
                                           client_session_timeout_seconds=60) as mcp:
            whoami = await mcp.call_tool("run", {"argv": ["id", "-u"]})
            snoop = await mcp.call_tool("run", {"argv": ["ls", *masked]})
            return whoami, snoop

    with served(build_app(hub)) as env_url:
        whoami, snoop = asyncio.run(session(env_url))
    rollout = hub.finish("code")
    hub.close()
    sandbox = rollout.env_info["sandbox"]
    assert sandbox["backend"] in ("bubblewrap", "docker") and sandbox["isolated"] is True
    assert not whoami.is_error and json.loads(whoami.content[0].text)["result"]["exit_code"] == 0
    uid = json.loads(whoami.content[0].text)["result"]["stdout"].strip()
    assert uid != "0" and (sandbox["backend"] == "docker" or uid == str(sandbox["uid"]))
    assert json.loads(snoop.content[0].text)["result"]["exit_code"] != 0  # the grader's folders are not there
    assert [s.tool_call.name for s in rollout.steps] == ["run", "run"]


def test_an_episode_name_used_again_in_a_later_run_is_a_new_rollout_with_only_its_own_calls(tmp_path):
    with OpenAIStub(respond=scripted_inventory) as upstream, \
            served(build_proxy(upstream.base_url, str(tmp_path))) as proxy_url:
        for _ in range(2):
            hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0)
            with served(build_app(hub)) as env_url:
                assert asyncio.run(play(env_url, proxy_url, "again")) == "Done."
            hub.close()
    with Warehouse(tmp_path, read_only=True) as wh:
        rollouts = wh.load_rollouts()
    assert len({r.rollout_id for r in rollouts}) == 2 and {r.task_id for r in rollouts} == {hub.tasks[0].task_id}
    assert [r.env_info["harness"]["model_calls"] for r in rollouts] == [4, 4]
    assert all(r.termination == Termination.success and len(r.steps) == 4 for r in rollouts)
    assert len(hub.log.read("again")) == 10  # both runs' calls stay on record (5 each, "Done." included)


def test_a_harness_cannot_open_more_episodes_at_once_than_the_server_keeps(tmp_path):
    """Hostile: a harness that names a new episode per request would hold an env (a sandbox) each."""
    from gymfoundry.tasks.harness.hub import TooManyEpisodes

    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False, max_open=2)
    hub.open("a"), hub.open("b")
    with served(build_app(hub)) as env_url:
        third = httpx.post(f"{env_url}/episodes/c/open")
        assert third.status_code == 429 and "2 episodes are open" in third.json()["error"]
    with pytest.raises(TooManyEpisodes):
        hub.open("c")
    hub.finish("a")
    hub.open("c")
    assert hub.goal("c").startswith("Order ") and hub.goal("b")  # an ended episode frees its place
    hub.close()


@pytest.mark.parametrize("ask", [False, True])
def test_the_proxy_asks_for_logprobs_and_token_ids_a_harness_never_asks_for(tmp_path, ask):
    def vllm_like(body, headers):
        status, payload = scripted_inventory(body, headers)
        choice = payload["choices"][0]
        if not body.get("logprobs"):
            choice.pop("logprobs")
        if not body.get("return_token_ids"):
            choice.pop("token_ids")
        return status, payload

    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with OpenAIStub(respond=vllm_like) as upstream, served(build_app(hub)) as env_url, \
            served(build_proxy(upstream.base_url, str(tmp_path), request_logprobs=ask,
                               request_token_ids=ask)) as proxy_url:
        assert asyncio.run(play(env_url, proxy_url, "tokens")) == "Done."
    hub.close()
    [rollout] = hub.rollouts
    assert all(bool(r.get("logprobs")) == bool(r.get("return_token_ids")) == ask for r in upstream.requests)
    assert [s.token_ids for s in rollout.steps] == [TOKEN_IDS if ask else None] * 4
    assert [s.logprobs for s in rollout.steps] == [LOGPROBS if ask else None] * 4


async def play_streamed(env_url: str, proxy_url: str, name: str) -> str:
    """The same harness, streaming its model calls (`Runner.run_streamed`)."""
    token = opened(env_url, name)
    async with MCPServerStreamableHttp(params={"url": f"{env_url}/episodes/{name}/mcp", "headers": auth(token)}) as mcp:
        goal = (await mcp.get_prompt("task")).messages[0].content.text
        client = AsyncOpenAI(base_url=f"{proxy_url}/episodes/{name}/v1", api_key=token, max_retries=0)
        agent = Agent(name="inventory-agent", instructions="You reserve stock for orders with the tools you have.",
                      mcp_servers=[mcp], model=OpenAIChatCompletionsModel(model="stub-model", openai_client=client))
        run = Runner.run_streamed(agent, goal, max_turns=20)
        async for _ in run.stream_events():
            pass
        return run.final_output


def test_a_streaming_harness_is_recorded_as_its_chunks_add_up(tmp_path):
    from tests.tasks.harness_stub import streaming_upstream

    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with served(streaming_upstream()) as upstream, served(build_app(hub)) as env_url, \
            served(build_proxy(upstream + "/v1", str(tmp_path))) as proxy_url:
        assert asyncio.run(play_streamed(env_url, proxy_url, "streamed")) == "Done."
    hub.close()
    [rollout] = hub.rollouts
    assert rollout.termination == Termination.success
    assert [s.tool_call.name for s in rollout.steps] == ["request_authorization", "find_items", "reserve", "submit"]
    assert [s.tool_call.id for s in rollout.steps] == ["call_0", "call_1", "call_2", "call_3"]
    assert all(s.token_ids == TOKEN_IDS and s.logprobs == LOGPROBS for s in rollout.steps)
    assert rollout.policy_version == f"{upstream}/v1|fp_stub"


def test_a_stream_the_upstream_cuts_is_an_inference_fault(tmp_path):
    from tests.tasks.harness_stub import streaming_upstream

    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with served(streaming_upstream(cut_after=2)) as upstream, served(build_app(hub)) as env_url, \
            served(build_proxy(upstream + "/v1", str(tmp_path))) as proxy_url:
        with pytest.raises(APIConnectionError):  # the harness's stream breaks where the upstream's did
            asyncio.run(play_streamed(env_url, proxy_url, "cut"))
        rollout = hub.finish("cut")
    hub.close()
    assert rollout.termination == Termination.inference_fault and "stream" in rollout.termination_reason
    assert [c.status for c in hub.log.read("cut")] == ["fault"]


def test_a_stream_adds_up_to_one_completion_and_garbage_adds_up_to_none():
    def chunk(delta, **choice):
        return json.dumps({"model": "m", "choices": [{"index": 0, "delta": delta, **choice}]})

    events = [chunk({"role": "assistant", "content": "Let me "}, token_ids=[1],
                    logprobs={"content": [{"logprob": -1}]}),
              chunk({"content": "look."}, token_ids=[2]),
              chunk({"tool_calls": [{"index": 0, "id": "c0", "function": {"name": "find", "arguments": '{"q"'}}]}),
              chunk({"tool_calls": [{"index": 1, "id": "c1", "function": {"name": "get", "arguments": "{}"}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "a"}'}}]}),
              json.dumps({"model": "m", "choices": [{"index": 1, "delta": {"content": "another choice"}}]})]
    payload = merged(events)
    message = payload["choices"][0]["message"]
    assert message["content"] == "Let me look." and payload["model"] == "m"
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == \
        [("c0", "find", '{"q": "a"}'), ("c1", "get", "{}")]
    assert payload["choices"][0]["token_ids"] == [1, 2]
    assert merged([]) is None and merged(["not json"]) is None
    assert merged([chunk({"content": ["not", "text"]})]) is None
