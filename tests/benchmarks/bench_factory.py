"""Benchmark: the factory flow under Prefect against the same stages as plain Python calls,
and rollout / rule-scoring throughput. Not a test (pytest collects test_*.py only).

    .venv/bin/python tests/benchmarks/bench_factory.py --tasks 50 --repeats 5 [--json out.json]

One ephemeral Prefect API serves every repeat (its start-up is reported on its own line).
Each repeat runs flow then plain (A, B, A, B ...) into fresh temp data dirs to share the
machine's noise, after one unmeasured warm-up of each. Figures are medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Keep run logs off the terminal (they still go to the API, as in production); set to 0 to see them.
os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FAMILY, MISTAKE_RATE, SAMPLES = "inventory", 0.25, 2


def run_flow(data_dir: str, n: int, seed: int) -> dict[str, int]:
    from flows.factory import factory

    report = factory(families=[FAMILY], tasks_per_family=n, seed=seed, policy="scripted",
                     mistake_rate=MISTAKE_RATE, samples_per_task=SAMPLES, data_dir=data_dir)
    return report["landed"]


def run_plain(data_dir: str, n: int, seed: int) -> dict[str, int]:
    from tasks.assemble import assemble_datasets
    from tasks.generate import generate_tasks
    from tasks.isolate import assert_no_leaks, isolate_tasks
    from tasks.land import land_batch
    from tasks.policies import make_policy
    from tasks.rollout import collect_rollouts
    from tasks.score import score_rollouts
    from tasks.validate import validate_tasks

    valid, invalid = validate_tasks(generate_tasks(FAMILY, n, seed))
    isolated, leaked = isolate_tasks(valid)
    rollouts = collect_rollouts(isolated, make_policy("scripted", FAMILY, mistake_rate=MISTAKE_RATE), SAMPLES, seed)
    assert_no_leaks(rollouts, {t.task_id: t for t in isolated})
    scores = score_rollouts(rollouts, isolated)
    landed = land_batch(data_dir, isolated, invalid + leaked, rollouts, scores)
    assemble_datasets(data_dir, [FAMILY])
    return landed


def timed(fn, *args) -> tuple[float, object]:
    started = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - started, out


def throughput(n: int, seed: int) -> dict[str, float]:
    from tasks.generate import generate_tasks
    from tasks.isolate import isolate_tasks
    from tasks.policies import make_policy
    from tasks.rollout import collect_rollouts
    from tasks.score import score_rollouts
    from tasks.validate import validate_tasks

    tasks, _ = isolate_tasks(validate_tasks(generate_tasks(FAMILY, n, seed))[0])
    policy = make_policy("scripted", FAMILY, mistake_rate=MISTAKE_RATE)
    t_roll, rollouts = timed(collect_rollouts, tasks, policy, SAMPLES, seed)
    t_score, scores = timed(score_rollouts, rollouts, tasks)
    steps = sum(len(r.steps) for r in rollouts)
    rule_scores = [s for s in scores if s.layer == "rules"]
    assert len(rule_scores) == steps, (len(rule_scores), steps)  # one score per step and layer
    return {"steps": steps, "rollouts": len(rollouts), "rollout_s": t_roll, "score_s": t_score,
            "rollout_sps": steps / t_roll, "score_sps": steps / t_score, "combined_sps": steps / (t_roll + t_score)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Factory flow vs plain stage calls; rollout/scoring steps/s.")
    ap.add_argument("--tasks", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    command = " ".join(shlex.quote(a) for a in [sys.executable.replace(os.getcwd() + "/", ""), *sys.argv])

    t0 = time.perf_counter()
    import flows.factory  # noqa: F401  Prefect, polars, duckdb, the envs
    import_s = time.perf_counter() - t0
    from prefect.testing.utilities import prefect_test_harness
    flow_s: list[float] = []
    plain_s: list[float] = []
    tp: list[dict[str, float]] = []
    t0 = time.perf_counter()
    with prefect_test_harness(server_startup_timeout=120), tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        server_s = time.perf_counter() - t0
        warm_flow, landed_flow = timed(run_flow, f"{tmp}/warm-flow", args.tasks, args.seed)
        warm_plain, landed_plain = timed(run_plain, f"{tmp}/warm-plain", args.tasks, args.seed)
        if landed_flow != landed_plain:
            print(f"WARNING: flow and plain landed different rows: {landed_flow} vs {landed_plain}")
        for i in range(args.repeats):
            flow_s.append(timed(run_flow, f"{tmp}/flow-{i}", args.tasks, args.seed)[0])
            plain_s.append(timed(run_plain, f"{tmp}/plain-{i}", args.tasks, args.seed)[0])
            tp.append(throughput(args.tasks, args.seed))
            print(f"repeat {i + 1}/{args.repeats}: flow {flow_s[-1]:.2f}s  plain {plain_s[-1]:.2f}s  "
                  f"rollout {tp[-1]['rollout_sps']:.0f} steps/s  score {tp[-1]['score_sps']:.0f} steps/s",
                  flush=True)

    med = statistics.median
    fig = {
        "command": command, "tasks": args.tasks, "repeats": args.repeats, "seed": args.seed,
        "cpus": os.cpu_count(), "import_s": import_s, "server_startup_s": server_s,
        "warmup_flow_s": warm_flow, "warmup_plain_s": warm_plain, "landed": landed_plain,
        "flow_s": flow_s, "plain_s": plain_s, "flow_median_s": med(flow_s), "plain_median_s": med(plain_s),
        "overhead_ratio": med(flow_s) / med(plain_s), "overhead_s": med(flow_s) - med(plain_s),
        "steps": tp[0]["steps"], "rollouts": tp[0]["rollouts"],
        **{f"{k}_median": med(t[k] for t in tp)
           for k in ("rollout_s", "score_s", "rollout_sps", "score_sps", "combined_sps")},
    }
    print(f"\ncommand: {command}")
    print(f"{args.tasks} tasks x {SAMPLES} samples, family {FAMILY}, mistake_rate {MISTAKE_RATE}, seed {args.seed}, "
          f"{args.repeats} repeats, {os.cpu_count()} CPUs; landed {landed_plain}")
    print(f"imports {import_s:.2f}s, Prefect server start-up {server_s:.2f}s (excluded), "
          f"warm-up: flow {warm_flow:.2f}s, plain {warm_plain:.2f}s (excluded)")
    print(f"{'measure':<34}{'median':>12}{'min':>10}{'max':>10}")
    rows = [("factory flow (Prefect), s", flow_s), ("plain stage calls, s", plain_s)]
    rows += [(f"{label}, steps/s", [t[k] for t in tp]) for label, k in
             (("rollout", "rollout_sps"), ("PRM scoring (all layers)", "score_sps"), ("rollout + scoring", "combined_sps"))]
    for label, xs in rows:
        print(f"{label:<34}{med(xs):>12.2f}{min(xs):>10.2f}{max(xs):>10.2f}")
    print(f"{'flow / plain (Prefect overhead)':<34}{fig['overhead_ratio']:>11.2f}x"
          f"   (+{fig['overhead_s']:.2f}s per run)")
    print(f"throughput over {fig['steps']} steps in {fig['rollouts']} rollouts; "
          f"medians: rollout {fig['rollout_s_median']:.3f}s, scoring {fig['score_s_median']:.3f}s")
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=2) + "\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
