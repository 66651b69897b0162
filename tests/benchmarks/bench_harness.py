"""Benchmark: what bringing your own harness costs per call, against the direct in-process path.
Not a test (pytest collects test_*.py only).

    .venv/bin/python tests/benchmarks/bench_harness.py --calls 200 [--json out.json]

- tool call: `find_items` on an inventory episode, directly through the factory's runtime stack
  (`standard_stack(...).step`, in process) versus through `serve-env`'s MCP server (streamable
  HTTP on 127.0.0.1, the official MCP client of the OpenAI Agents SDK). Episodes are renewed every
  7 calls (inside the task's budget); the first call of each episode, which opens it, is not timed.
- model call: one chat completion posted to a local OpenAI-protocol stub directly versus through
  the recording proxy (forward, parse, one JSON line appended to the episode's log).

Medians in milliseconds and their ratio. The servers run in this process (threads), as in the
tests: the figures include the client's share of one interpreter.

    .venv/bin/python tests/benchmarks/bench_harness.py --hostile --episodes 200 [--waves 3] [--json out.json]

- hostile load (the issue's Measure): `gymfoundry serve-env` and `gymfoundry proxy` as processes,
  `--episodes` concurrent episodes of which 10% are hostile clients, in three kinds: slowloris
  (connections that never finish their request head, held open), poisoned (an episode whose call
  log gets a record nested 250 deep, as a raw line, and one through the proxy), wrong tokens
  (requests and finishes on other clients' episodes with a guessed token). Every honest episode
  opens, makes one model call through the proxy and 7 tool calls over MCP, and finishes. Reported:
  episodes finished and landed, hostile requests refused, p50/p99 tool-call latency, the server's
  RSS after startup and after each wave (`--waves`: growth that stops is a peak, not a leak).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PER_EPISODE = 7


def direct_tool_calls(n: int, task) -> list[float]:
    from gymfoundry.envs.records import ToolCall
    from gymfoundry.envs.family import family
    from gymfoundry.envs.wrappers import standard_stack

    times: list[float] = []
    while len(times) < n:
        env = standard_stack(family(task.env_id).make())
        env.reset(task=task)
        env.step(ToolCall(name="find_items", arguments={"query": "a"}))
        for _ in range(PER_EPISODE - 1):
            started = time.perf_counter()
            env.step(ToolCall(name="find_items", arguments={"query": "a"}))
            times.append(time.perf_counter() - started)
        env.close()
    return times[:n]


def mcp_tool_calls(n: int, url: str) -> list[float]:
    from agents.mcp import MCPServerStreamableHttp

    times: list[float] = []

    async def run() -> None:
        episode = 0
        while len(times) < n:
            import httpx

            async with httpx.AsyncClient() as client:
                token = (await client.post(f"{url}/episodes/bench-{episode}/open")).json()["token"]
            async with MCPServerStreamableHttp(params={"url": f"{url}/episodes/bench-{episode}/mcp",
                                                       "headers": {"Authorization": f"Bearer {token}"}}) as mcp:
                await mcp.call_tool("find_items", {"query": "a"})
                for _ in range(PER_EPISODE - 1):
                    started = time.perf_counter()
                    result = await mcp.call_tool("find_items", {"query": "a"})
                    times.append(time.perf_counter() - started)
                    assert not result.is_error, result
            episode += 1

    asyncio.run(run())
    return times[:n]


def model_calls(n: int, url: str, headers: dict | None = None) -> list[float]:
    import httpx

    body = {"model": "stub-model", "messages": [{"role": "user", "content": "Order ORD-1 needs 1 x \"red clamp\""}]}
    times = []
    with httpx.Client(headers=headers) as client:
        client.post(url, json=body)
        for _ in range(n):
            started = time.perf_counter()
            reply = client.post(url, json=body)
            times.append(time.perf_counter() - started)
            assert reply.status_code == 200, reply.text
    return times


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def hostile_load(episodes: int, waves: int = 1) -> dict:
    import os
    import signal
    import socket
    import subprocess

    import httpx

    from tests.tasks.harness_stub import scripted_inventory
    from tests.verifiers.openai_stub import OpenAIStub

    root = Path(__file__).resolve().parents[2]
    data_dir = tempfile.mkdtemp(prefix="bench-hostile-")

    def free_port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    def ready(url: str, probe: str) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.post(url + probe, timeout=2).status_code == 404:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise RuntimeError(f"{url} did not start")

    env_port, proxy_port = free_port(), free_port()
    env_url, proxy_url = f"http://127.0.0.1:{env_port}", f"http://127.0.0.1:{proxy_port}"
    cli = [sys.executable, "-m", "gymfoundry.flows.cli"]
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    hostile = max(1, episodes // 10)
    kinds = ["slowloris", "poisoned", "wrong_token"]
    roles = ["honest"] * (episodes - hostile) + [kinds[k % 3] for k in range(hostile)]
    latencies: list[float] = []
    counts = {"finished": 0, "refused_401": 0, "wrong_token_accepted": 0, "slow_cut": 0, "errors": 0}
    names: list[str] = []
    wave = [0]

    async def tool(client, name: str, token: str, query: str):
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"_meta": meta, "name": "find_items", "arguments": {"query": query}}}
        headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28",
                   "mcp-method": "tools/call", "mcp-name": "find_items", "authorization": f"Bearer {token}"}
        return await client.post(f"{env_url}/episodes/{name}/mcp", json=body, headers=headers)

    async def honest(client, k: int, poisoned: bool = False) -> None:
        name = f"{'poisoned' if poisoned else 'ep'}-{wave[0]}-{k}"
        token = (await client.post(f"{env_url}/episodes/{name}/open")).raise_for_status().json()["token"]
        names.append(name)
        goal = {"role": "user", "content": "Order ORD-1 needs 1 x \"red clamp\""}
        reply = await client.post(f"{proxy_url}/episodes/{name}/v1/chat/completions",
                                  json={"model": "stub-model", "messages": [goal]},
                                  headers={"authorization": f"Bearer {token}"})
        if reply.status_code != 200:
            counts["errors"] += 1
        if poisoned:  # what a buggy or hostile client leaves: a record past the reader's depth, as a raw line
            deep: object = "x"
            for _ in range(250):
                deep = [deep]
            line = json.dumps({"episode_id": name, "index": 99, "messages": [{"role": "user", "content": deep}]})
            with open(Path(data_dir) / "harness" / "calls" / f"{name}.jsonl", "a") as fh:
                fh.write(line + "\n")
            deep_body = {"model": "stub-model", "messages": [{"role": "user", "content": deep}]}
            await client.post(f"{proxy_url}/episodes/{name}/v1/chat/completions", json=deep_body,
                              headers={"authorization": f"Bearer {token}"})
        for n in range(PER_EPISODE):
            started = time.perf_counter()
            result = await tool(client, name, token, "abcdefg"[n])
            if not poisoned:
                latencies.append(time.perf_counter() - started)
            if result.status_code != 200:
                counts["errors"] += 1
        finished = await client.post(f"{env_url}/episodes/{name}/finish", headers={"authorization": f"Bearer {token}"})
        counts["finished"] += finished.status_code == 200

    async def slowloris() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", env_port)
        writer.write(b"POST /episodes/slow/open HTTP/1.1\r\nHost: x\r\n")  # never the rest
        await writer.drain()
        try:
            cut = await asyncio.wait_for(reader.read(100), 120) == b""
        except ConnectionError:
            cut = True
        except asyncio.TimeoutError:
            cut = False
        counts["slow_cut"] += cut
        writer.close()

    async def wrong_token(client) -> None:
        for _ in range(20):
            await asyncio.sleep(0.2)
            if not names:
                continue
            victim = names[len(names) // 2]
            for reply in (await tool(client, victim, "guessed", "z"),
                          await client.post(f"{env_url}/episodes/{victim}/finish",
                                            headers={"authorization": "Bearer guessed"}),
                          await client.post(f"{proxy_url}/episodes/{victim}/v1/chat/completions",
                                            json={"model": "m", "messages": []},
                                            headers={"authorization": "Bearer guessed"})):
                if reply.status_code == 401:
                    counts["refused_401"] += 1
                elif reply.status_code < 300:
                    counts["wrong_token_accepted"] += 1

    async def run() -> None:
        limits = httpx.Limits(max_connections=episodes + 50, max_keepalive_connections=episodes + 50)
        async with httpx.AsyncClient(limits=limits, timeout=120) as client:
            jobs = []
            for k, role in enumerate(roles):
                if role == "honest":
                    jobs.append(honest(client, k))
                elif role == "poisoned":
                    jobs.append(honest(client, k, poisoned=True))
                elif role == "slowloris":
                    jobs.append(slowloris())
                else:
                    jobs.append(wrong_token(client))
            for outcome in await asyncio.gather(*jobs, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    counts["errors"] += 1
                    print("client error:", repr(outcome)[:200], file=sys.stderr)

    with OpenAIStub(respond=scripted_inventory) as upstream:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        server = subprocess.Popen(cli + ["serve-env", "--family", "inventory", "--port", str(env_port), "--tasks", "8",
                                         "--read-timeout", "5", "--data-dir", data_dir], cwd=root, env=env,
                                  stderr=subprocess.PIPE, text=True)
        proxy = subprocess.Popen(cli + ["proxy", "--upstream", upstream.base_url, "--port", str(proxy_port),
                                        "--data-dir", data_dir], cwd=root, env=env, stderr=subprocess.DEVNULL)
        try:
            ready(env_url, "/episodes/probe/finish")
            ready(proxy_url, "/v1/chat/completions")
            rss_start, rss_after = rss_mb(server.pid), []
            started = time.perf_counter()
            for wave[0] in range(waves):  # RSS after each: growth that stops is a peak, not a leak
                names.clear()
                asyncio.run(run())
                time.sleep(5)  # the lander lands what the last finishes spooled
                rss_after.append(round(rss_mb(server.pid), 1))
            wall = time.perf_counter() - started - 5 * waves
            server.send_signal(signal.SIGTERM)
            _, said = server.communicate(timeout=600)
        finally:
            for process in (server, proxy):
                if process.poll() is None:
                    process.terminate()
                    process.wait(30)
    from gymfoundry.warehouse import Warehouse

    with Warehouse(data_dir, read_only=True) as wh:
        rows = wh.sql_df("select termination, count(*) from rollouts group by termination order by 1").rows()
    landed = dict(rows)
    ordered = sorted(latencies)
    return {"episodes": episodes, "waves": waves, "hostile": {k: roles.count(k) for k in kinds}, **counts,
            "landed": sum(landed.values()), "landed_by_class": landed,
            "tool_call_p50_ms": round(statistics.median(ordered) * 1000, 2),
            "tool_call_p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1000, 2),
            "tool_calls_timed": len(ordered), "wall_s": round(wall, 1),
            "server_rss_mb_start": round(rss_start, 1), "server_rss_mb_after_each_wave": rss_after,
            "server_said": said.strip().splitlines()[-1] if said.strip() else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--hostile", action="store_true", help="the hostile load instead of the overhead")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--waves", type=int, default=1, help="hostile: run the load this many times")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.hostile:
        result = hostile_load(args.episodes, args.waves)
        print(json.dumps(result, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        return

    from gymfoundry import envs  # noqa: F401
    from gymfoundry.tasks.harness.hub import EpisodeHub
    from gymfoundry.tasks.harness.mcp_server import build_app, served
    from gymfoundry.tasks.harness.proxy import build_proxy
    from tests.tasks.harness_stub import scripted_inventory
    from tests.verifiers.openai_stub import OpenAIStub

    data_dir = tempfile.mkdtemp(prefix="bench-harness-")
    hub = EpisodeHub("inventory", data_dir, tasks=4, land=False)
    rows = []
    with OpenAIStub(respond=scripted_inventory) as upstream, served(build_app(hub)) as env_url, \
            served(build_proxy(upstream.base_url, data_dir)) as proxy_url:
        proxied = proxy_url + "/episodes/bench-model/v1/chat/completions"
        auth = {"Authorization": f"Bearer {hub.open('bench-model')}"}
        pairs = {"tool call (MCP)": (direct_tool_calls(args.calls, hub.tasks[0]), mcp_tool_calls(args.calls, env_url)),
                 "model call (proxy)": (model_calls(args.calls, upstream.base_url + "/chat/completions"),
                                        model_calls(args.calls, proxied, auth))}
    hub.close()
    print(f"{'path':<20} {'direct ms':>10} {'harness ms':>11} {'overhead ms':>12} {'ratio':>7}")
    for name, (direct, harness) in pairs.items():
        d, h = statistics.median(direct) * 1000, statistics.median(harness) * 1000
        rows.append({"path": name, "calls": args.calls, "direct_ms": round(d, 3), "harness_ms": round(h, 3),
                     "overhead_ms": round(h - d, 3), "ratio": round(h / d, 2)})
        print(f"{name:<20} {d:>10.3f} {h:>11.3f} {h - d:>12.3f} {h / d:>7.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
