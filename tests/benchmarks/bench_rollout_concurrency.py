"""Benchmark: episodes per second of the rollout engine (tasks/rollout/engine.py) against a local
OpenAI-protocol server answering every request after a fixed latency, at several concurrencies,
as a ratio of the ideal C / (latency x turns). Not a test (pytest collects test_*.py only).

    .venv/bin/python tests/benchmarks/bench_rollout_concurrency.py --latency 0.1 \
        --concurrency 1 16 64 256 --episodes-per-slot 4 --repeats 3 [--json out.json]

The server is an asyncio HTTP/1.1 server in a process of its own (so it does not take the
client's interpreter lock), answering like tests/tasks/policy_endpoint.py's inventory agent:
look an item up, then submit, so every episode is `turns` = 2 requests. At concurrency C the
engine plays C x `--episodes-per-slot` inventory episodes through `collect_with_retries` (the
factory's batch path: env stack, wrappers, verifier, classification, records). The ideal rate
is C / (latency x turns); the figure is the median of `--repeats` runs. The peak number of
requests in flight the server saw is printed beside it.

The engine's own cost bounds the rate too: episodes run in one interpreter, so at most
1 / (CPU time per episode) of them finish per second however many are in flight. That ceiling
is measured first, serially against a second server answering at once (latency 0), and each
row also gives its rate over min(ideal, ceiling).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def reply(body: dict) -> dict:
    turns = sum(m["role"] == "assistant" for m in body["messages"])
    name, arguments = ("find_items", {"query": "clamp"}) if turns == 0 else ("submit", {"status": "denied"})
    call = {"id": f"call_{turns}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return {"id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "stub",
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                         "logprobs": {"content": [{"token": "x", "logprob": -0.25}]}}]}


def serve(latency: float) -> None:
    """The stub server: prints its port, then serves until killed; GET /stats gives the peak."""
    state = {"now": 0, "peak": 0, "requests": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                length = next((int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length")), 0)
                raw = await reader.readexactly(length) if length else b""
                if lines[0].startswith("GET /stats"):
                    data = json.dumps(state).encode()
                    state.update(peak=0, requests=0)
                else:
                    state["now"] += 1
                    state["requests"] += 1
                    state["peak"] = max(state["peak"], state["now"])
                    await asyncio.sleep(latency)
                    state["now"] -= 1
                    data = json.dumps(reply(json.loads(raw))).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(data)).encode() + b"\r\n\r\n" + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        print(server.sockets[0].getsockname()[1], flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def run(base_url: str, concurrency: int, episodes: int, seed: int) -> float:
    from gymfoundry.envs.records import PolicySpec, RetryPolicy
    from gymfoundry.tasks.stages.generate import generate_tasks
    from gymfoundry.tasks.policies.registry import make_policy
    from gymfoundry.tasks.rollout.retry import collect_with_retries

    tasks = generate_tasks("inventory", episodes, seed=seed)
    spec = PolicySpec(kind="openai", model="stub", base_url=base_url, max_concurrency=concurrency, timeout_s=30,
                      max_retries=0)
    policy = make_policy(spec, "inventory")
    started = time.perf_counter()
    rollouts = collect_with_retries(tasks, policy, 1, seed, RetryPolicy())
    elapsed = time.perf_counter() - started
    bad = [r for r in rollouts if r.termination.value in ("inference_fault", "policy_error")]
    if len(rollouts) != episodes or bad or any(len(r.steps) != 2 for r in rollouts):
        raise SystemExit(f"unexpected episodes: {len(rollouts)} of {episodes}, {bad[:1]}")
    return episodes / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--episodes-per-slot", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.latency)
    import httpx

    from gymfoundry import envs  # noqa: F401

    server = subprocess.Popen([sys.executable, __file__, "--serve", "--latency", str(args.latency)],
                              stdout=subprocess.PIPE, text=True)
    instant = subprocess.Popen([sys.executable, __file__, "--serve", "--latency", "0"], stdout=subprocess.PIPE,
                               text=True)
    try:
        base = f"http://127.0.0.1:{server.stdout.readline().strip()}"
        at_once = f"http://127.0.0.1:{instant.stdout.readline().strip()}/v1"
        ceiling = statistics.median(run(at_once, 1, 200, seed=r) for r in range(args.repeats))
        turns = 2
        results = [{"ceiling_episodes_per_s": round(ceiling, 2)}]
        print(f"{os.cpu_count()} cores; server latency {args.latency} s; {turns} requests per episode; "
              f"CPU-bound ceiling {ceiling:.1f} episodes/s ({1000 / ceiling:.2f} ms per episode)")
        print(f"{'C':>5} {'episodes':>8} {'eps/s (median)':>15} {'ideal':>8} {'ratio':>6} {'vs ceiling':>10} "
              f"{'peak in flight':>15}")
        for c in args.concurrency:
            episodes = c * args.episodes_per_slot
            rates, peaks = [], []
            for r in range(args.repeats):
                rates.append(run(base + "/v1", c, episodes, seed=r))
                peaks.append(httpx.get(base + "/stats").json()["peak"])
            ideal = c / (args.latency * turns)
            median = statistics.median(rates)
            bound = min(ideal, ceiling)
            results.append({"concurrency": c, "episodes": episodes, "episodes_per_s": round(median, 2),
                            "ideal": round(ideal, 2), "ratio": round(median / ideal, 3),
                            "ratio_to_bound": round(median / bound, 3), "peak_in_flight": max(peaks),
                            "runs": [round(x, 2) for x in rates]})
            print(f"{c:>5} {episodes:>8} {median:>15.2f} {ideal:>8.1f} {median / ideal:>6.3f} {median / bound:>10.3f} "
                  f"{max(peaks):>15}")
    finally:
        server.kill()
        instant.kill()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
