"""Benchmark: warehouse ingest rate (steps/s through `Warehouse.land`, quality gates included)
side by side with DuckDB writing the same rows as hive-partitioned Parquet from Arrow, and the
latency of a family-filtered aggregate over 1M steps. Not a test (pytest collects test_*.py only).

    .venv/bin/python tests/benchmarks/bench_warehouse.py --steps 1000000 [--batch-steps 100000]
        [--families 4] [--no-gates] [--tasks-apart] [--workers 2] [--repeats 7] [--json out.json]

Synthetic records (hand-built rollouts of 10 steps over `--families` families, realistic text
sizes) land in batches of `--batch-steps` steps, each batch one `land(tasks, rollouts)` call:
rows derived from the records, new-key check against the catalog, great-expectations gates,
Parquet write, one registering transaction. Record construction is timed apart.

The physical reference, per batch and right beside its landing (the two arms alternate which goes
first): DuckDB's `COPY ... TO (FORMAT parquet, PARTITION_BY (task_family))` of the same batch's
tasks, rollouts and steps, handed over as Arrow tables (made from the records untimed), into a
scratch directory. The ratio is the median over batches of land rate / reference rate.

Each batch's records are also turned into the tables' Arrow rows alone (`Table.arrow`, what every
landing does first, with the garbage collector paused as `stage` pauses it), timed apart: no landing
from these records in one process can run faster than that conversion. With `--tasks-apart` each
batch's tasks land in a `land` call of their own before the timed one (untimed), and the timed
landing, the conversion and the reference cover the rollouts and steps only (the staged landing
below stages each batch's tasks with its rollouts in any case).

Then the same batches again, the way the factory's workers land ("workers write, one process
registers"): `--workers` processes (default 2) each build their share of the batches' records
(untimed), then, all started together, `gymfoundry.warehouse.stage` them (rows, content ids, gates, Parquet
files in the data dir's incoming folder) and hand each `Staged` over a queue to this process, whose
`Warehouse.land_staged` checks the keys and references against the catalog and registers the files.
Its rate is the batches' steps over the wall time from the start to the last registration; its
ratio is that rate over the median DuckDB rate measured above. `--workers 0` skips it.

Then a fresh read-only connection times aggregates over `steps` filtered to one family (cold =
first query after opening, warm = median of the repeats), against the same aggregate over all
families.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

STEPS_PER_ROLLOUT = 10
FAMILY_NAMES = ["inventory", "coding", "engineering", "advisory", "discussion", "browser", "conversation"]
TOOLS = ["find_items", "get_stock", "request_authorization", "reserve", "release", "submit"]
TERMINATIONS = ["success", "success", "failure", "constraint_violation", "truncated", "env_fault"]


def make_batch(first: int, n_rollouts: int, families: list[str]):
    from gymfoundry.envs.records import (Cost, Difficulty, Hidden, OutcomeReport, Rollout, Source, Step, TaskSpec,
                              Termination, ToolCall)

    tasks, rollouts = [], []
    for k in range(first, first + n_rollouts):
        family = families[k % len(families)]
        task = TaskSpec(family=family, env_id=f"gymfoundry/{family}-v0",
                        source=Source(generator="bench", version="1", seed=k), template_id=f"tpl-{k % 997}",
                        goal=f"Order ORD-{k} needs items reserved. " * 4, initial_state={"seed": k},
                        allowed_tools=TOOLS, difficulty=Difficulty(level=1 + k % 5),
                        hidden=Hidden(reference=[ToolCall(name="submit", arguments={"status": "reserved"})]))
        steps = [Step(index=i, observation=f'{{"ok": true, "result": {{"sku": "SKU-{k % 900}", "n": {i}}}}} ' * 3,
                      action_text=f'{{"name": "{TOOLS[i % 6]}", "arguments": {{"sku": "SKU-{i}"}}}}',
                      thought="Check the stock first.", tool_call=ToolCall(name=TOOLS[i % 6], arguments={"sku": f"SKU-{i}"}),
                      result=f'{{"ok": true, "result": {{"available": {i + k % 7}}}}} ' * 3,
                      error="env_fault" if (k + i) % 53 == 0 else None, reward=(i % 3) / 3,
                      latency_s=0.001 * (i + 1), policy_version="bench-1")
                 for i in range(STEPS_PER_ROLLOUT)]
        termination = Termination(TERMINATIONS[k % len(TERMINATIONS)])
        outcome = OutcomeReport(verifier_id="bench", verifier_version="1", success=termination == "success",
                                completed=True, regression=False, constraint_violation=False)
        tasks.append(task)
        rollouts.append(Rollout(task_id=task.task_id, family=family, env_id=task.env_id, env_version="0",
                                policy_id="bench", policy_version="1", seed=k, steps=steps, termination=termination,
                                outcome=outcome, cost=Cost(steps=len(steps), tool_calls=len(steps), wall_time_s=0.1)))
    return tasks, rollouts


def same_rows(tasks, rollouts) -> dict:
    """The batch's tasks (none when `tasks` is None), rollouts and steps as Arrow tables of the
    warehouse's logical columns, made with the garbage collector paused (as `stage` does)."""
    from gymfoundry.warehouse import TABLES
    from gymfoundry.warehouse.staged import _step_owners

    was_enabled = gc.isenabled()
    gc.disable()
    try:  # as `stage` makes them: the steps' owner columns each rollout's once, repeated by Arrow
        rows = {} if tasks is None else {"tasks": TABLES["tasks"].arrow(tasks)}
        return {**rows, "rollouts": TABLES["rollouts"].arrow(rollouts),
                "steps": TABLES["steps"].arrow([step for r in rollouts for step in r.steps], **_step_owners(rollouts))}
    finally:
        if was_enabled:
            gc.enable()


def write_reference(con, arrow: dict, folder: Path) -> None:
    """DuckDB's own hive-partitioned Parquet write of the tables into `folder` (made here)."""
    folder.mkdir(parents=True)
    for name, table in arrow.items():
        con.register("batch", table)
        con.execute(f"COPY batch TO '{folder / name}' (FORMAT parquet, PARTITION_BY (task_family))")
        con.unregister("batch")


def stage_worker(data_dir: str, firsts: list[int], per_batch: int, n_rollouts: int, families: list[str], gate: bool,
                 ready, go, out) -> None:
    """One staging worker: build the records of its batches, then stage them one by one onto `out`."""
    from gymfoundry.warehouse import quality
    from gymfoundry.warehouse.staged import stage

    if gate:
        quality._batch_definition()
    batches = [make_batch(first, min(per_batch, n_rollouts - first), families) for first in firsts]
    ready.put(os.getpid())
    go.wait()
    for tasks, rollouts in batches:
        started = time.perf_counter()
        staged = stage(data_dir, tasks=tasks, rollouts=rollouts, gate=gate)
        out.put((staged, time.perf_counter() - started))


def staged_landing(data_dir: Path, workers: int, per_batch: int, n_rollouts: int, families: list[str],
                   gate: bool) -> dict:
    """Land every batch through `workers` staging processes and this one registering process."""
    import multiprocessing

    from gymfoundry.warehouse import Warehouse

    ctx = multiprocessing.get_context("spawn")
    firsts = list(range(0, n_rollouts, per_batch))
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=stage_worker, args=(str(data_dir), firsts[w::workers], per_batch, n_rollouts,
                                                    families, gate, ready, go, out)) for w in range(workers)]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get()
    stage_s, register_s, steps = [], [], 0
    with Warehouse(data_dir) as wh:
        started = time.perf_counter()
        go.set()
        for _ in firsts:
            staged, took = out.get()
            t0 = time.perf_counter()
            landing = wh.land_staged(staged)
            register_s.append(time.perf_counter() - t0)
            stage_s.append(took)
            assert landing.ok and landing.counts["steps"], landing.counts
            steps += landing.counts["steps"]
        wall = time.perf_counter() - started
        assert wh.count("steps") == steps
    for proc in procs:
        proc.join(timeout=60)
    return {"workers": workers, "steps": steps, "wall_s": wall, "steps_per_s": steps / wall,
            "stage_s_median": statistics.median(stage_s), "register_s_median": statistics.median(register_s),
            "register_steps_per_s": steps / sum(register_s)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--batch-steps", type=int, default=100_000)
    ap.add_argument("--families", type=int, default=4)
    ap.add_argument("--no-gates", action="store_true", help="land without the quality gates")
    ap.add_argument("--tasks-apart", action="store_true",
                    help="land each batch's tasks before it (untimed); time the rollouts and steps only")
    ap.add_argument("--workers", type=int, default=2, help="staging processes for the second landing (0: none)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--data-dir", help="keep the warehouse here (default: a temp dir, removed)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    command = " ".join(shlex.quote(a) for a in [sys.executable.replace(os.getcwd() + "/", ""), *sys.argv])
    import duckdb

    from gymfoundry.warehouse import Warehouse, quality

    t0 = time.perf_counter()
    if not args.no_gates:
        quality._batch_definition()  # importing great-expectations: once per process, not per batch
    warmup_s = time.perf_counter() - t0
    families = FAMILY_NAMES[: args.families]
    per_batch = max(1, args.batch_steps // STEPS_PER_ROLLOUT)
    n_rollouts = args.steps // STEPS_PER_ROLLOUT
    with tempfile.TemporaryDirectory(prefix="bench-wh-") as tmp:
        data_dir = Path(args.data_dir or tmp)
        build_s, land_s, batch_rates, reference_rates, convert_rates = 0.0, 0.0, [], [], []
        reference = duckdb.connect()
        with Warehouse(data_dir) as wh:
            for first in range(0, n_rollouts, per_batch):
                t0 = time.perf_counter()
                tasks, rollouts = make_batch(first, min(per_batch, n_rollouts - first), families)
                t1 = time.perf_counter()
                if args.tasks_apart:
                    assert wh.land(tasks=tasks, gate=not args.no_gates).ok
                timed_tasks = None if args.tasks_apart else tasks
                t2 = time.perf_counter()
                arrow = same_rows(timed_tasks, rollouts)  # the reference's input, and the conversion alone
                convert_s = time.perf_counter() - t2
                arms = {"land": lambda: wh.land(tasks=timed_tasks, rollouts=rollouts, gate=not args.no_gates),
                        "reference": lambda: write_reference(reference, arrow, Path(tmp) / "reference")}
                timed = {}
                for arm in (["land", "reference"] if len(batch_rates) % 2 == 0 else ["reference", "land"]):
                    started = time.perf_counter()
                    out = arms[arm]()
                    timed[arm] = time.perf_counter() - started
                    if arm == "land":
                        landing = out
                shutil.rmtree(Path(tmp) / "reference")  # each batch's reference writes into a fresh folder
                assert landing.ok, landing.report.summary()
                steps = landing.counts["steps"]
                assert steps == arrow["steps"].num_rows, "the reference writes the rows that landed"
                build_s, land_s = build_s + t1 - t0, land_s + timed["land"]
                batch_rates.append(steps / timed["land"])
                reference_rates.append(steps / timed["reference"])
                convert_rates.append(steps / convert_s)
                print(f"batch {len(batch_rates)}: {steps} steps landed in {timed['land']:.2f}s "
                      f"({batch_rates[-1]:,.0f} steps/s); DuckDB wrote them in {timed['reference']:.2f}s "
                      f"({reference_rates[-1]:,.0f} steps/s); records to Arrow alone {convert_s:.2f}s; "
                      f"records built in {t1 - t0:.2f}s", flush=True)
            total_steps = wh.count("steps")
        staged = None
        if args.workers:
            staged = staged_landing(Path(tmp) / "staged", args.workers, per_batch, n_rollouts, families,
                                    not args.no_gates)
            assert staged["steps"] == total_steps
        lake_mb = sum(p.stat().st_size for p in (data_dir / "lake").rglob("*.parquet")) / 1e6

        family = families[1 % len(families)]
        filtered = ("SELECT tool_name, count(*) AS steps, avg(reward) AS mean_reward, avg(latency_s) AS latency, "
                    "count(*) FILTER (WHERE error = 'env_fault') AS faults FROM steps WHERE task_family = ? "
                    "GROUP BY 1 ORDER BY 1")
        everything = filtered.replace("WHERE task_family = ? ", "")
        joined = ("SELECT t.difficulty_level, count(*) AS steps, avg(s.reward) AS mean_reward FROM steps s "
                  "JOIN rollouts r USING (rollout_id) JOIN tasks t USING (task_id) "
                  "WHERE s.task_family = ? AND r.success GROUP BY 1 ORDER BY 1")
        timings = {}
        with Warehouse(data_dir, read_only=True) as wh:
            for name, sql, params in (("family_filtered", filtered, [family]), ("all_families", everything, None),
                                      ("family_filtered_join", joined, [family])):
                runs = []
                for _ in range(args.repeats + 1):
                    t0 = time.perf_counter()
                    out = wh.sql(sql, params)
                    runs.append(time.perf_counter() - t0)
                timings[name] = {"cold_s": runs[0], "warm_median_s": statistics.median(runs[1:]),
                                 "warm_min_s": min(runs[1:]), "rows": out.num_rows}

    ratios = [land / ref for land, ref in zip(batch_rates, reference_rates)]
    fig = {"command": command, "cpus": os.cpu_count(), "gates": not args.no_gates, "gates_warmup_s": warmup_s,
           "steps": total_steps,
           "families": len(families), "batch_steps": per_batch * STEPS_PER_ROLLOUT, "batches": len(batch_rates),
           "land_s": land_s, "build_records_s": build_s, "ingest_steps_per_s": total_steps / land_s,
           "ingest_steps_per_s_median_batch": statistics.median(batch_rates),
           "reference_steps_per_s_median_batch": statistics.median(reference_rates),
           "tasks_apart": args.tasks_apart,
           # the records turned into the tables' Arrow rows alone: a ceiling on any landing from them
           "convert_steps_per_s_median_batch": statistics.median(convert_rates),
           # land rate / DuckDB's rate for the same rows, per batch (the arms side by side), median
           "land_over_duckdb_ratio": statistics.median(ratios), "lake_mb": lake_mb, "queries": timings,
           "staged": staged}
    if staged:
        staged["over_duckdb"] = staged["steps_per_s"] / fig["reference_steps_per_s_median_batch"]
    print(f"\ncommand: {command}")
    print(f"{total_steps:,} steps in {len(batch_rates)} batches over {len(families)} families, "
          f"{os.cpu_count()} CPUs, gates {'on' if fig['gates'] else 'off'} (loading them: {warmup_s:.1f}s, "
          f"excluded); lake {lake_mb:.0f} MB")
    print(f"ingest: {fig['ingest_steps_per_s']:,.0f} steps/s overall (landing {land_s:.1f}s; "
          f"median batch {fig['ingest_steps_per_s_median_batch']:,.0f} steps/s); "
          f"building the records took {build_s:.1f}s more")
    print(f"DuckDB writing the same rows as hive-partitioned Parquet from Arrow: median batch "
          f"{fig['reference_steps_per_s_median_batch']:,.0f} steps/s; Warehouse.land / DuckDB: median "
          f"{fig['land_over_duckdb_ratio']:.3f} (per batch: {', '.join(f'{r:.3f}' for r in ratios)})")
    print(f"the records turned into Arrow rows alone (Table.arrow, no gates, no write): median batch "
          f"{fig['convert_steps_per_s_median_batch']:,.0f} steps/s, "
          f"{fig['convert_steps_per_s_median_batch'] / fig['reference_steps_per_s_median_batch']:.3f} of DuckDB's rate"
          + ("; each batch's tasks landed apart, untimed" if args.tasks_apart else ""))
    if staged:
        print(f"staged by {staged['workers']} worker processes, registered by one: {staged['steps_per_s']:,.0f} "
              f"steps/s ({staged['steps']:,} steps in {staged['wall_s']:.1f}s; per batch: staging "
              f"{staged['stage_s_median']:.2f}s in a worker, registering {staged['register_s_median']:.2f}s, "
              f"medians); / DuckDB: {staged['over_duckdb']:.3f}; the writer alone registers "
              f"{staged['register_steps_per_s']:,.0f} steps/s")
    for name, t in timings.items():
        print(f"{name:<22} cold {t['cold_s'] * 1000:8.1f} ms   warm median {t['warm_median_s'] * 1000:8.1f} ms"
              f"   (min {t['warm_min_s'] * 1000:.1f} ms, {t['rows']} rows)")
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=2) + "\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
