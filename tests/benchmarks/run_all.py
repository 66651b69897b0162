"""Every benchmark under tests/benchmarks/ in a quick mode, and one table of their figures
(`make bench`). Not a test; not part of `make test`.

    .venv/bin/python tests/benchmarks/run_all.py [--only rollout factory ...] [--json out.json]

Each benchmark runs as its own process with small sizes and `--json`; its headline figures (and
its side-by-side ratio, where it measures one) become rows of the table. A benchmark that fails
or cannot run here (no sandbox, no data) is a row saying why; the others still run. The sizes
are for a quick look (about 10 minutes on 2 cores): quote a benchmark's own full-size run, not
these, in a closing note. `bench_training` needs a factory data dir: a small `gymfoundry run`
writes one first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
Row = tuple[str, Any, Any]  # figure, value, ratio (None where the figure is not a ratio)


def _rollout(fig: dict) -> list[Row]:
    rows: list[Row] = []
    for stage, label in (("combined", "rollout + scoring"), ("rollout", "rollout, verified"), ("scoring", "PRM scoring")):
        rows += [(f"{label} steps/s (ratio: to {fig['baseline']})", fig[f"current_{stage}_median_steps_per_s"],
                  fig[f"{stage}_median_ratio"]),
                 (f"{label} steps/s, code at {fig['baseline']}", fig[f"baseline_{stage}_median_steps_per_s"], None)]
    return rows


def _families(fig: list) -> list[Row]:
    rows: list[Row] = []
    for f in fig:
        rows += [(f"{f['family']}: env steps/s", f["env_steps_per_s"], None),
                 (f"{f['family']}: verified steps/s", f["verified_steps_per_s"], None),
                 (f"{f['family']}: check-family s", f["check_family_s"], None)]
    return rows


def _factory(fig: dict) -> list[Row]:
    size = f"{fig['tasks']} tasks x {fig['samples']}"
    rows = [(f"flow / plain stage calls, {size}", round(fig["overhead_ratio"], 2), round(fig["overhead_ratio"], 2)),
            (f"flow s, {size} (median)", round(fig["flow_median_s"], 2), None),
            ("flow and plain: same rows and dataset ids", "yes" if fig["same_outputs"] else "NO", None)]
    stages = fig.get("plain_stages_median_s")
    if stages:  # where a plain run's time goes
        rows += [(f"plain run, {name.removesuffix('_s')} s (median)", round(s, 2), None) for name, s in stages.items()]
    if "rollout_sps_median" in fig:
        rows += [("rollout steps/s", round(fig["rollout_sps_median"]), None),
                 ("PRM scoring steps/s", round(fig["score_sps_median"]), None),
                 ("rollout + scoring steps/s", round(fig["combined_sps_median"]), None)]
    return rows


def _warehouse(fig: dict) -> list[Row]:
    ratio = fig["land_over_duckdb_ratio"]  # per batch, the two arms side by side; median
    rows = [("Warehouse.land (gates on) / DuckDB Parquet write", round(ratio, 3), ratio),
            ("ingest steps/s through Warehouse.land, median batch", round(fig["ingest_steps_per_s_median_batch"]), None),
            ("DuckDB writing the same rows, steps/s, median batch", round(fig["reference_steps_per_s_median_batch"]),
             None)]
    if "convert_steps_per_s_median_batch" in fig:  # the ceiling on any landing from these records
        convert = fig["convert_steps_per_s_median_batch"]
        over = convert / fig["reference_steps_per_s_median_batch"]
        rows += [("records to Arrow alone (no gates, no write) / DuckDB", round(over, 3), over),
                 ("records to Arrow alone, steps/s, median batch", round(convert), None)]
    staged = fig.get("staged")
    if staged:
        rows += [(f"staged by {staged['workers']} workers, registered by one / DuckDB", round(staged["over_duckdb"], 3),
                  staged["over_duckdb"]),
                 ("staged landing steps/s, end to end", round(staged["steps_per_s"]), None),
                 ("registering a staged batch: steps/s of the writer", round(staged["register_steps_per_s"]), None)]
    rows += [(f"query {name}: warm median s", q["warm_median_s"], None) for name, q in sorted(fig["queries"].items())]
    return rows


def _rules(fig: dict) -> list[Row]:
    rules = fig["rules"]
    rows = [("rules vectorised / per-step loop", rules["speedup"], rules["speedup"])]
    rows += [(f"judge steps/s at concurrency {j['concurrency']}", j.get("steps_per_s"), j.get("ratio"))
             for j in fig.get("judge", [])]
    return rows


def _concurrency(fig: list) -> list[Row]:
    rows = [("CPU-bound ceiling episodes/s", r["ceiling_episodes_per_s"], None) for r in fig if "concurrency" not in r]
    return rows + [(f"episodes/s at concurrency {r['concurrency']} (of ideal)", r["episodes_per_s"], r["ratio"])
                   for r in fig if "concurrency" in r]


def _hf_batch(fig: dict) -> list[Row]:
    return [("serial / batched seconds", fig["ratio"], fig["ratio"])]


def _sandbox(fig: dict) -> list[Row]:
    rows = [(f"{label}: sandbox overhead ms per command", f["overhead_ms"], None)
            for label, f in fig["overhead"].items() if label != "cgroup"]
    return rows + [("coding grading ms (warm)", fig["grading"]["warm_ms"], None),
                   ("coding episodes/min", fig["coding"]["episodes_per_min"], None)]


def _training(fig: dict) -> list[Row]:
    rows: list[Row] = []
    for kind, f in fig["trainers"].items():
        errors = f["ours"]["errors"] + f["plain"]["errors"]
        value = f["ratio"] if f["ratio"] is not None else f"failed: {errors[0][:40] if errors else '?'}"
        rows.append((f"{kind}: ours / plain TRL s per step", value, f["ratio"]))
    return rows


def _harness(fig: list) -> list[Row]:
    return [(f"{r['path']}: ms added per call", r["overhead_ms"], r["ratio"]) for r in fig]


def _is_ratio(key: Any) -> bool:
    key = str(key)
    return key == "ratio" or key.endswith("_ratio") or key.startswith("ratio_") or key == "speedup"


def _scalars(fig: Any, prefix: str = "", depth: int = 0) -> list[Row]:
    """Every numeric leaf (two levels deep at most): the fallback when a format is unknown."""
    rows: list[Row] = []
    items = fig.items() if isinstance(fig, dict) else enumerate(fig) if isinstance(fig, list) else []
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            rows.append((name, value, value if _is_ratio(key) else None))
        elif depth < 1 and isinstance(value, (dict, list)):
            rows += _scalars(value, f"{name}.", depth + 1)
    return rows


# name, script, quick arguments, figures; `{tmp}` is a scratch dir of the run.
BENCHMARKS: list[tuple[str, str, list[str], Callable[[Any], list[Row]]]] = [
    ("rollout", "bench_rollout.py", ["--tasks", "50", "--repeats", "3"], _rollout),
    ("families", "bench_families.py", ["--families", "inventory", "conversation", "advisory",
                                       "--episodes", "50", "--repeats", "1"], _families),
    ("factory", "bench_factory.py", ["--tasks", "1000", "--samples", "2", "--repeats", "2", "--no-throughput"],
     _factory),
    ("warehouse", "bench_warehouse.py", ["--steps", "200000", "--batch-steps", "50000", "--repeats", "2"],
     _warehouse),
    ("rules", "bench_rules.py", ["--steps", "100000", "--loop-steps", "10000", "--repeats", "2",
                                 "--judge-steps", "32", "--judge-latency", "0.05", "--concurrency", "1", "8"], _rules),
    ("rollout_concurrency", "bench_rollout_concurrency.py", ["--latency", "0.05", "--concurrency", "1", "16",
                                                             "--episodes-per-slot", "2", "--repeats", "1"],
     _concurrency),
    ("hf_batch", "bench_hf_batch.py", ["--episodes", "4", "--repeats", "1", "--steps", "2",
                                       "--max-new-tokens", "16"], _hf_batch),
    ("sandbox", "bench_sandbox.py", ["--commands", "10", "--episodes", "5", "--grades", "3"], _sandbox),
    ("harness", "bench_harness.py", ["--calls", "50"], _harness),
    ("training", "bench_training.py", ["--data-dir", "{tmp}/factory", "--steps", "2", "--grpo-steps", "1",
                                       "--repeats", "1"], _training),
]


def factory_data(tmp: str) -> str | None:
    """A small factory run for bench_training; None, or why it failed."""
    cli = Path(sys.executable).with_name("gymfoundry")
    proc = subprocess.run([str(cli), "run", "--families", "inventory", "--tasks", "12",
                           "--data-dir", f"{tmp}/factory", "--quiet"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    tail = (proc.stderr or proc.stdout).strip().splitlines()
    return f"the factory run for its data failed: {tail[-1] if tail else proc.returncode}"


def run_one(name: str, script: str, args: list[str], tmp: str, timeout_s: float) -> tuple[Any, float, str | None]:
    out = Path(tmp) / f"{name}.json"
    argv = [sys.executable, str(HERE / script), *[a.format(tmp=tmp) for a in args], "--json", str(out)]
    started = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - started, f"over {timeout_s:.0f}s, stopped"
    elapsed = time.perf_counter() - started
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        return None, elapsed, f"exit {proc.returncode}: {tail[-1][:90] if tail else 'no output'}"
    return json.loads(out.read_text()), elapsed, None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", help=f"some of: {' '.join(b[0] for b in BENCHMARKS)}")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per benchmark at most")
    ap.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    args = ap.parse_args(argv)
    chosen = [b for b in BENCHMARKS if not args.only or b[0] in args.only]
    table: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}  # each benchmark's own JSON, kept in --json beside the table
    with tempfile.TemporaryDirectory(prefix="bench-all-") as tmp:
        for name, script, bench_args, figures in chosen:
            print(f"running {name} ...", flush=True)
            why = factory_data(tmp) if name == "training" else None
            fig, elapsed, why = (None, 0.0, why) if why else run_one(name, script, bench_args, tmp, args.timeout)
            if why is None:
                try:
                    rows = figures(fig)
                except (KeyError, TypeError, IndexError) as exc:  # a changed format: show what it has
                    rows = [(f"(format changed: {type(exc).__name__} {exc})", None, None), *_scalars(fig)]
            else:
                rows = [(f"not measured: {why}", None, None)]
            table += [{"benchmark": name, "figure": f, "value": v, "ratio": r, "seconds": round(elapsed, 1)}
                      for f, v, r in rows]
            raw[name] = fig
    print(f"\n{len(chosen)} benchmarks, quick sizes, {os.cpu_count()} CPUs")
    print(f"{'benchmark':<20} {'figure':<52} {'value':>12} {'ratio':>8}")
    for row in table:
        value = row["value"]
        value = "" if value is None else f"{value:,.4g}" if isinstance(value, float) else f"{value:,}" \
            if isinstance(value, int) else str(value)
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        print(f"{row['benchmark']:<20} {row['figure'][:52]:<52} {value:>12} {ratio:>8}")
    if args.json:
        Path(args.json).write_text(json.dumps({"table": table, "benchmarks": raw}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
