"""Benchmark: the factory flow under Prefect against the same stages as plain Python calls,
and rollout / rule-scoring throughput. Not a test (pytest collects test_*.py only).

    .venv/bin/python tests/benchmarks/bench_factory.py --tasks 1000 --samples 2 --repeats 3 [--json out.json]

One ephemeral Prefect API serves every repeat (its start-up is reported on its own line).
After one unmeasured warm-up of each arm, the arms alternate (flow, plain, plain, flow, ...) into
fresh temp data dirs so both share the machine's noise; figures are medians. Both arms run the
same stage functions of `tasks/` with the same configuration (`FactoryConfig`), so they must
land the same rows and assemble the same datasets: every run's landed counts and dataset ids are
checked against the first flow run's, and a mismatch fails the benchmark. The plain arm does not
publish the run's Prefect artifacts (report tables and charts): that is part of what the flow
costs. Each plain run also times its stages (the generation's with the holdout lock and the
validation, the rollouts' with the leak check): their medians say where a run's time goes.
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

from gymfoundry.flows.defaults import prefect_defaults

prefect_defaults(hub_offline=True)
# Keep run logs off the terminal (they still go to the API, as in production); set to 0 to see them.
os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FAMILY, MISTAKE_RATE = "inventory", 0.25
# Per plain run, the seconds of each of its stages: where a run's time goes.
PLAIN_STAGES: list[dict[str, float]] = []


def config(data_dir: str, n: int, samples: int, seed: int, batch_size: int | None):
    from gymfoundry.flows.config import FactoryConfig

    return FactoryConfig(families=[FAMILY], tasks_per_family=n, seed=seed, policy="scripted", mistake_rate=MISTAKE_RATE,
                         samples_per_task=samples, data_dir=data_dir, batch_size=batch_size)


def outcome(landed: dict[str, int], datasets: dict[str, dict]) -> dict:
    return {"landed": dict(sorted(landed.items())),
            "datasets": {kind: d["dataset_id"] for kind, d in sorted(datasets.items())}}


def run_flow(cfg) -> dict:
    from gymfoundry.flows.factory import factory

    report = factory(**cfg.params())
    return outcome(report["landed"], report["datasets"])


def run_plain(cfg) -> dict:
    """The flow's stages in the flow's order, as plain calls: no task runs, no subflow, no artifacts."""
    from gymfoundry.envs.records import Run
    from gymfoundry.tasks.stages.assemble import assemble_datasets
    from gymfoundry.tasks.stages.audit import ensure_audited
    from gymfoundry.tasks.stages.generate import generate_tasks
    from gymfoundry.tasks.stages.isolate import assert_no_leaks, isolate_tasks, landed_splits, lock_holdout_fraction
    from gymfoundry.tasks.stages.land import land_records, land_run
    from gymfoundry.tasks.policies.registry import make_policy
    from gymfoundry.tasks.rollout.retry import collect_with_retries, run_counts
    from gymfoundry.tasks.stages.score import score_rollouts
    from gymfoundry.tasks.stages.validate import validate_tasks
    from gymfoundry.warehouse import Warehouse

    data_dir, family = cfg.data_dir, cfg.families[0]
    stages: dict[str, float] = {}
    clock = [time.perf_counter()]

    def lap(stage: str) -> None:  # the seconds since the last lap are this stage's
        now = time.perf_counter()
        stages[stage] = stages.get(stage, 0.0) + now - clock[0]
        clock[0] = now

    lock_holdout_fraction(data_dir, cfg.families, cfg.holdout_fraction)
    valid, invalid = validate_tasks(generate_tasks(family, cfg.tasks_per_family, cfg.seed))
    lap("generate_s")
    isolated, leaked = isolate_tasks(valid, landed_splits(data_dir), cfg.holdout_fraction)
    lap("isolate_s")
    spec = cfg.collecting_policy()
    rollouts = collect_with_retries(isolated, make_policy(spec, family), cfg.samples_per_task, cfg.seed, cfg.retry,
                                    cfg.faults, subagent=cfg.subagent)
    assert_no_leaks(rollouts, {t.task_id: t for t in isolated})
    lap("rollout_s")
    scores = score_rollouts(rollouts, isolated, data_dir)
    lap("score_s")
    params = cfg.model_dump(mode="json", exclude={"data_dir", "cluster_address"})
    run = Run(params=params, retry_policy=cfg.retry, faults=cfg.faults)
    landed = land_records(data_dir, isolated, invalid + leaked, rollouts, scores, run_id=run.run_id).checked()
    lap("land_s")
    (policy_id, policy_version), = {(r.policy_id, r.policy_version) for r in rollouts}
    with Warehouse(data_dir) as wh:  # what the flow's audit stage does
        ensure_audited(wh, cfg.families, cfg.audit_episodes)
    lap("audit_s")
    datasets = assemble_datasets(data_dir, cfg.families, policy_id=policy_id, policy_version=policy_version,
                                 learnability=cfg.learnability, min_margin=cfg.min_margin)
    lap("assemble_s")
    land_run(data_dir, Run(params=params, retry_policy=cfg.retry, faults=cfg.faults, landed=landed,
                           **run_counts(rollouts, cfg.retry)))
    lap("land_run_s")
    PLAIN_STAGES.append(stages)
    return outcome(landed, datasets)


def timed(fn, *args) -> tuple[float, object]:
    started = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - started, out


def throughput(n: int, samples: int, seed: int) -> dict[str, float]:
    from gymfoundry.tasks.stages.generate import generate_tasks
    from gymfoundry.tasks.stages.isolate import isolate_tasks
    from gymfoundry.tasks.policies.registry import make_policy
    from gymfoundry.tasks.rollout.episodes import collect_rollouts
    from gymfoundry.tasks.stages.score import score_rollouts
    from gymfoundry.tasks.stages.validate import validate_tasks

    tasks, _ = isolate_tasks(validate_tasks(generate_tasks(FAMILY, n, seed))[0])
    policy = make_policy("scripted", FAMILY, mistake_rate=MISTAKE_RATE)
    t_roll, rollouts = timed(collect_rollouts, tasks, policy, samples, seed)
    t_score, scores = timed(score_rollouts, rollouts, tasks)
    steps = sum(len(r.steps) for r in rollouts)
    rule_scores = [s for s in scores if s.layer == "rules"]
    assert len(rule_scores) == steps, (len(rule_scores), steps)  # one score per step and layer
    return {"steps": steps, "rollouts": len(rollouts), "rollout_s": t_roll, "score_s": t_score,
            "rollout_sps": steps / t_roll, "score_sps": steps / t_score, "combined_sps": steps / (t_roll + t_score)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Factory flow vs plain stage calls; rollout/scoring steps/s.")
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=2, help="rollouts per task")
    ap.add_argument("--repeats", type=int, default=3, help="measured runs of each arm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=None, help="the flow's batch size (default: chosen from the work)")
    ap.add_argument("--no-throughput", action="store_true", help="skip the rollout / scoring steps/s figures")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    command = " ".join(shlex.quote(a) for a in [sys.executable.replace(os.getcwd() + "/", ""), *sys.argv])

    t0 = time.perf_counter()
    import gymfoundry.flows.factory  # noqa: F401  Prefect, polars, duckdb, the envs
    import_s = time.perf_counter() - t0
    from prefect.testing.utilities import prefect_test_harness

    runs = {"flow": run_flow, "plain": run_plain}
    times: dict[str, list[float]] = {"flow": [], "plain": []}
    tp: list[dict[str, float]] = []
    mismatches: list[str] = []
    t0 = time.perf_counter()
    with prefect_test_harness(server_startup_timeout=120), tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        server_s = time.perf_counter() - t0
        cfg = lambda name: config(f"{tmp}/{name}", args.tasks, args.samples, args.seed, args.batch_size)  # noqa: E731
        warm_flow, reference = timed(run_flow, cfg("warm-flow"))
        warm_plain, out = timed(run_plain, cfg("warm-plain"))
        if out != reference:
            mismatches.append(f"plain warm-up: {out} != flow's {reference}")
        # ABBA order: neither arm always runs first after the other's garbage
        order = [arm for i in range(args.repeats) for arm in (("flow", "plain") if i % 2 == 0 else ("plain", "flow"))]
        for i, arm in enumerate(order):
            elapsed, out = timed(runs[arm], cfg(f"{arm}-{i}"))
            times[arm].append(elapsed)
            if out != reference:
                mismatches.append(f"{arm} run {i}: {out} != {reference}")
            print(f"{arm:<5} {elapsed:7.2f}s", flush=True)
        if not args.no_throughput:
            tp = [throughput(args.tasks, args.samples, args.seed) for _ in range(args.repeats)]

    med = statistics.median
    flow_s, plain_s = times["flow"], times["plain"]
    fig = {
        "command": command, "tasks": args.tasks, "samples": args.samples, "repeats": args.repeats, "seed": args.seed,
        "batch_size": args.batch_size, "cpus": os.cpu_count(), "import_s": import_s, "server_startup_s": server_s,
        "warmup_flow_s": warm_flow, "warmup_plain_s": warm_plain, "landed": reference["landed"],
        "datasets": reference["datasets"], "same_outputs": not mismatches, "mismatches": mismatches,
        "flow_s": flow_s, "plain_s": plain_s, "flow_median_s": med(flow_s), "plain_median_s": med(plain_s),
        "overhead_ratio": med(flow_s) / med(plain_s), "overhead_s": med(flow_s) - med(plain_s),
    }
    measured = PLAIN_STAGES[1:]  # less the warm-up
    fig["plain_stages_median_s"] = {k: med(s[k] for s in measured) for k in measured[0]}
    if tp:
        fig.update({"steps": tp[0]["steps"], "rollouts": tp[0]["rollouts"],
                    **{f"{k}_median": med(t[k] for t in tp)
                       for k in ("rollout_s", "score_s", "rollout_sps", "score_sps", "combined_sps")}})
    print(f"\ncommand: {command}")
    print(f"{args.tasks} tasks x {args.samples} samples, family {FAMILY}, mistake_rate {MISTAKE_RATE}, seed {args.seed}, "
          f"{args.repeats} repeats, {os.cpu_count()} CPUs; landed {reference['landed']}")
    print(f"datasets {reference['datasets']}: "
          + ("the same in every run of both arms" if not mismatches else f"MISMATCH in {len(mismatches)} run(s)"))
    print(f"imports {import_s:.2f}s, Prefect server start-up {server_s:.2f}s (excluded), "
          f"warm-up: flow {warm_flow:.2f}s, plain {warm_plain:.2f}s (excluded)")
    print(f"{'measure':<34}{'median':>12}{'min':>10}{'max':>10}")
    rows = [("factory flow (Prefect), s", flow_s), ("plain stage calls, s", plain_s)]
    if tp:
        rows += [(f"{label}, steps/s", [t[k] for t in tp]) for label, k in
                 (("rollout", "rollout_sps"), ("PRM scoring (all layers)", "score_sps"),
                  ("rollout + scoring", "combined_sps"))]
    for label, xs in rows:
        print(f"{label:<34}{med(xs):>12.2f}{min(xs):>10.2f}{max(xs):>10.2f}")
    print(f"{'flow / plain (Prefect overhead)':<34}{fig['overhead_ratio']:>11.2f}x"
          f"   ({fig['overhead_s']:+.2f}s per run)")
    share = fig["plain_stages_median_s"]
    print("a plain run's stages, medians: " + ", ".join(f"{k.removesuffix('_s')} {v:.2f}s" for k, v in share.items())
          + f" (landing: {share['land_s'] / fig['plain_median_s']:.1%} of the run)")
    if tp:
        print(f"throughput over {fig['steps']} steps in {fig['rollouts']} rollouts; "
              f"medians: rollout {fig['rollout_s_median']:.3f}s, scoring {fig['score_s_median']:.3f}s")
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=2) + "\n")
        print(f"figures written to {args.json}")
    for line in mismatches:
        print(f"MISMATCH: {line}", file=sys.stderr)
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
