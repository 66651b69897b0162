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
    from envs.records import ToolCall
    from envs.registry import make
    from envs.wrappers import standard_stack

    times: list[float] = []
    while len(times) < n:
        env = standard_stack(make(task.env_id))
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
            async with MCPServerStreamableHttp(params={"url": f"{url}/episodes/bench-{episode}/mcp"}) as mcp:
                await mcp.call_tool("find_items", {"query": "a"})
                for _ in range(PER_EPISODE - 1):
                    started = time.perf_counter()
                    result = await mcp.call_tool("find_items", {"query": "a"})
                    times.append(time.perf_counter() - started)
                    assert not result.is_error, result
            episode += 1

    asyncio.run(run())
    return times[:n]


def model_calls(n: int, url: str) -> list[float]:
    import httpx

    body = {"model": "stub-model", "messages": [{"role": "user", "content": "Order ORD-1 needs 1 x \"red clamp\""}]}
    times = []
    with httpx.Client() as client:
        client.post(url, json=body)
        for _ in range(n):
            started = time.perf_counter()
            reply = client.post(url, json=body)
            times.append(time.perf_counter() - started)
            assert reply.status_code == 200, reply.text
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json")
    args = parser.parse_args()

    import envs  # noqa: F401
    from tasks.harness import EpisodeHub
    from tasks.mcp_server import build_app, served
    from tasks.proxy import build_proxy
    from tests.tasks.harness_stub import scripted_inventory
    from tests.verifiers.openai_stub import OpenAIStub

    data_dir = tempfile.mkdtemp(prefix="bench-harness-")
    hub = EpisodeHub("inventory", data_dir, tasks=4, land=False)
    rows = []
    with OpenAIStub(respond=scripted_inventory) as upstream, served(build_app(hub)) as env_url, \
            served(build_proxy(upstream.base_url, data_dir)) as proxy_url:
        proxied = proxy_url + "/episodes/bench-model/v1/chat/completions"
        pairs = {"tool call (MCP)": (direct_tool_calls(args.calls, hub.tasks[0]), mcp_tool_calls(args.calls, env_url)),
                 "model call (proxy)": (model_calls(args.calls, upstream.base_url + "/chat/completions"),
                                        model_calls(args.calls, proxied))}
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
