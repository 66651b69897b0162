"""`gymfoundry` command line: run the factory, list envs, query the warehouse."""

from __future__ import annotations

import argparse
import os
import sys

DEFAULT_DATA_DIR = ".gymfoundry"


def _prefect_defaults() -> None:
    # A cold ephemeral Prefect server can need 20 s to start on a small machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def cmd_run(args: argparse.Namespace) -> int:
    _prefect_defaults()
    from flows.factory import factory

    report = factory(families=args.families, tasks_per_family=args.tasks, seed=args.seed, policy=args.policy,
                     mistake_rate=args.mistake_rate, samples_per_task=args.samples, batch_size=args.batch_size,
                     data_dir=args.data_dir, task_runner=args.task_runner)
    print_report(report)
    return 0


def print_report(report: dict) -> None:
    print(f"\nwarehouse: {report['data_dir']}/catalog.duckdb  (lake: {report['data_dir']}/lake)")
    print("landed rows: " + ", ".join(f"{k}={v}" for k, v in sorted(report["landed"].items())))
    for kind, d in report["datasets"].items():
        print(f"{kind} dataset {d['dataset_id']}: {d['rows']} rows  {d['path'] or ''}")
    print("\nrollouts by family and termination:")
    width = max([len(r["termination"]) for r in report["summary"]] + [11])
    for r in report["summary"]:
        print(f"  {r['task_family']:<12} {r['termination']:<{width}} {r['rollouts']:>6}")


def cmd_envs(args: argparse.Namespace) -> int:
    import envs

    for env_id in envs.list_envs():
        env = envs.make(env_id, verified=False)
        tools = ", ".join(f"{t.name}({t.category.value})" for t in env.profile.tools)
        print(f"{env_id}  tools: {tools}")
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    import polars as pl

    from warehouse import Warehouse

    with Warehouse(args.data_dir, read_only=True) as wh:
        table = wh.sql(args.query)
    with pl.Config(tbl_rows=args.max_rows, tbl_cols=-1, fmt_str_lengths=80, tbl_hide_dataframe_shape=False):
        print(pl.from_arrow(table))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gymfoundry", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the factory flow")
    run.add_argument("--families", nargs="+", default=["inventory"])
    run.add_argument("--tasks", type=int, default=50, help="tasks per family")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--policy", default="scripted")
    run.add_argument("--mistake-rate", type=float, default=0.25)
    run.add_argument("--samples", type=int, default=2, help="rollouts per task")
    run.add_argument("--batch-size", type=int, default=25, help="tasks per rollout batch")
    run.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    run.add_argument("--task-runner", default="threads", choices=["threads", "dask", "ray"])
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="run the factory on the embedded default")
    demo.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    demo.set_defaults(func=cmd_run, families=["inventory"], tasks=50, seed=0, policy="scripted",
                      mistake_rate=0.25, samples=2, batch_size=25, task_runner="threads")

    envs_cmd = sub.add_parser("envs", help="list registered environments")
    envs_cmd.set_defaults(func=cmd_envs)

    sql = sub.add_parser("sql", help="run a SQL query on the warehouse")
    sql.add_argument("query")
    sql.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    sql.add_argument("--max-rows", type=int, default=50)
    sql.set_defaults(func=cmd_sql)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except Exception as exc:  # a clear message, not a traceback, for user errors
        if os.environ.get("GYMFOUNDRY_DEBUG"):
            raise
        print(f"gymfoundry {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
