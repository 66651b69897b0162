"""`gymfoundry run` and `gymfoundry demo`: the factory flow (and, with `--train-after`, training
after it) from the command line."""

from __future__ import annotations

import argparse
import sys

from gymfoundry.envs.records import FaultConfig, RetryPolicy
from gymfoundry.flows.cli.options import add_data_dir, add_policy_options, policy_spec
from gymfoundry.flows.config import FactoryConfig, add_options, from_args
from gymfoundry.flows.defaults import DEFAULT_DATA_DIR, prefect_defaults
from gymfoundry.flows.progress_bars import progress_bars


def cmd_run(args: argparse.Namespace) -> int:
    """Validate the whole run configuration first (in well under a second, before Prefect is
    imported), then check the warehouse, then run the factory flow with rich progress bars."""
    get = lambda name, default=None: getattr(args, name, default)  # noqa: E731

    def values() -> dict:
        retry = {"max_retries": get("max_retries"), "backoff_s": get("retry_backoff"), "on_exhausted": get("on_exhausted")}
        return {"policy": policy_spec(args), "retry": RetryPolicy(**{k: v for k, v in retry.items() if v is not None}),
                "faults": FaultConfig(rate=args.fault_rate, seed=get("seed", 0)) if get("fault_rate") else None,
                "train_hyperparameters": {"time_limit_s": get("train_seconds", 900)} if get("train_after") else None}

    try:
        config = from_args(FactoryConfig, args, values)
    except ValueError as exc:  # one line naming each invalid option
        print(f"gymfoundry run: {exc}", file=sys.stderr)
        return 2
    from gymfoundry.warehouse import assert_intact  # local: the warehouse loads duckdb (~0.7 s); --help needs none

    assert_intact(config.data_dir)  # damaged storage fails here, before any episode runs, naming the files
    prefect_defaults()
    from gymfoundry.flows.factory import factory  # local: Prefect loads only for commands that run flows
    from gymfoundry.flows.loop import factory_then_train  # local: Prefect, as above

    with progress_bars(enabled=not get("quiet", False)):  # the factory alone, or the factory then training
        report = (factory_then_train if config.train_after else factory)(**config.params())
    print_report(report)
    if "training" in report:
        training = report["training"]
        print(f"\ntrained {training['method']} run {training['run_id']}: checkpoint {training['checkpoint']}")
    return 2 if report["quarantined"] else 0


def print_report(report: dict) -> None:
    print(f"\nwarehouse: {report['data_dir']}/catalog.duckdb  (lake: {report['data_dir']}/lake)")
    print("landed rows: " + ", ".join(f"{k}={v}" for k, v in sorted(report["landed"].items())))
    for kind, d in report["datasets"].items():
        print(f"{kind} dataset {d['dataset_id']}: {d['rows']} rows  {d['path'] or ''}")
    print("\nrollouts by family and termination:")
    width = max([len(r["termination"]) for r in report["summary"]] + [11])
    for r in report["summary"]:
        print(f"  {r['task_family']:<12} {r['termination']:<{width}} {r['rollouts']:>6}")
    run = report["run"]
    print(f"\nrun {run['run_id']}: {run['attempted']} rollouts attempted, {run['retries']} retries, "
          f"{run['skips']} skipped; " + ", ".join(f"{k}={v}" for k, v in run["by_class"].items()))
    for path in report["quarantined"]:
        print(f"QUARANTINED: a batch failed the quality gates; rows and report in {path}", file=sys.stderr)


RUN_EXAMPLES = f"""examples:
  gymfoundry run --families inventory coding --tasks 200 --samples 4
  gymfoundry run --policy openai --model Qwen/Qwen2.5-7B-Instruct --base-url http://127.0.0.1:8000/v1 \\
                 --api-key-env OPENAI_API_KEY --concurrency 128 --temperature 0.7
  gymfoundry run --policy hf --model {DEFAULT_DATA_DIR}/checkpoints/<run> --concurrency 16
  gymfoundry run --fault-rate 0.05 --max-retries 3 --on-exhausted fail"""


def add_run_commands(sub) -> None:
    run = sub.add_parser("run", help="run the factory flow", formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog=RUN_EXAMPLES)
    add_options(run, FactoryConfig)
    add_policy_options(run)
    retry = RetryPolicy.model_fields
    run.add_argument("--max-retries", type=int, help=f"retries of an env- or inference-faulted episode (default: "
                                                     f"{retry['max_retries'].default})")
    run.add_argument("--retry-backoff", type=float, help=f"seconds before the first retry, doubling (default: "
                                                         f"{retry['backoff_s'].default})")
    run.add_argument("--on-exhausted", choices=["skip", "fail"], help="when an episode's retries run out (default: skip)")
    run.add_argument("--fault-rate", type=float, help="inject env faults into this share of tool calls (default: none)")
    run.add_argument("--train-seconds", type=float, default=900, help="time budget of --train-after (default: 900)")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="run the factory on the embedded default (50 inventory tasks, scripted)")
    add_data_dir(demo)
    demo.add_argument("--quiet", action="store_true", help="no progress bars")
    demo.set_defaults(func=cmd_run, policy="scripted")
