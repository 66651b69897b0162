"""`gymfoundry train`, `gymfoundry evaluate` and `gymfoundry loop`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gymfoundry.flows.cli.options import (UsageError, add_data_dir, add_policy_options, check_families,
                                          existing_warehouse, policy_spec)
from gymfoundry.flows.config import ARMS, EvaluationConfig, TrainingConfig, add_options, from_args
from gymfoundry.flows.defaults import LOOP_DATA_DIR, prefect_defaults
from gymfoundry.flows.progress_bars import progress_bars


def cmd_train(args: argparse.Namespace) -> int:
    try:
        hp = json.loads(args.hyperparameters) if args.hyperparameters else {}
    except json.JSONDecodeError as exc:
        raise UsageError(f"--hyperparameters: not JSON ({exc})") from None
    if not isinstance(hp, dict):
        raise UsageError(f"--hyperparameters: a JSON object is needed, got {args.hyperparameters!r}")
    for key in ("max_steps", "learning_rate", "batch_size", "time_limit_s"):
        if getattr(args, key) is not None:
            hp[key] = getattr(args, key)
    try:
        config = from_args(TrainingConfig, args, lambda: {"hyperparameters": hp})
    except ValueError as exc:
        print(f"gymfoundry train: {exc}", file=sys.stderr)
        return 2
    check_training_inputs(config)
    prefect_defaults(hub_offline=True)
    from gymfoundry.flows.training import train  # local: Prefect loads only for commands that run flows

    with progress_bars():
        run = train(**config.params())
    metrics = run["metrics"]
    print(f"training run {run['run_id']}: {metrics.get('steps')} steps, final loss {metrics.get('final_loss')}, "
          f"{metrics.get('seconds_per_step')} s/step, peak RSS {metrics.get('peak_rss_mb')} MB")
    print(f"checkpoint: {run['checkpoint']}")
    if "heldout" in metrics:
        print(f"held-out success: {100 * metrics['heldout']['success_rate']:.1f}%")
    return 0


def check_training_inputs(config) -> None:
    """What the train flow would refuse only after Prefect started: a missing or damaged dataset, a
    missing base model."""
    from gymfoundry.flows.training import resolve_dataset  # local: Prefect, only for the commands that train
    from gymfoundry.warehouse.store import assert_dataset_intact  # local: duckdb (~0.7 s); --help needs none

    if config.method in ("sft", "dpo") and not config.dataset:
        raise UsageError(f"--method {config.method} trains on a dataset: name one with --dataset (an id under "
                         f"{config.data_dir}/datasets/ or a Parquet file)")
    if config.dataset and config.method != "grpo":
        try:
            _, path = resolve_dataset(config.dataset, config.data_dir)
        except FileNotFoundError as exc:
            raise UsageError(f"--dataset: {exc}") from None
        assert_dataset_intact(path)  # DamagedDataset: one line, exit 1, before Prefect starts
    if config.base_model and not Path(config.base_model).is_dir():
        raise UsageError(f"--base-model {config.base_model}: no such checkpoint directory")


def cmd_evaluate(args: argparse.Namespace) -> int:
    prefect_defaults(hub_offline=True)
    try:
        config = from_args(EvaluationConfig, args, lambda: {"policy": policy_spec(args)})
    except ValueError as exc:  # one line naming each invalid option
        print(f"gymfoundry evaluate: {exc}", file=sys.stderr)
        return 2
    existing_warehouse(config.data_dir)  # the held-out tasks come from it
    spec = config.policy if not isinstance(config.policy, str) else None
    if spec is not None and spec.kind == "hf" and spec.model and not Path(spec.model).is_dir():
        raise UsageError(f"--model {spec.model}: no such checkpoint directory")
    from gymfoundry.flows.evaluation import evaluate  # local: Prefect loads only for commands that run flows

    report = evaluate(**config.params())
    print(f"{report['model'] or report['policy_id']} on {report['episodes']} held-out {report['family']} episodes: "
          f"success {100 * report['success_rate']:.1f}%  by level {report['by_level']}  {report['terminations']}")
    for family, by_k in report["pass_at_k"].items():
        print(f"{family}: " + "  ".join(f"pass@{k} {v['pass@k']:.4f} pass^{k} {v['pass^k']:.4f}"
                                        for k, v in by_k.items()))
    return 0


def cmd_loop(args: argparse.Namespace) -> int:
    check_families([args.family])
    unknown = [arm for arm in args.arms.split(",") if arm not in ARMS]
    if unknown:
        raise UsageError(f"--arms: unknown arm{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                         f"choose from {', '.join(ARMS)}")
    prefect_defaults(hub_offline=True)
    from gymfoundry.flows.loop import closed_loop  # local: Prefect loads only for commands that run flows

    with progress_bars():
        figures = closed_loop(family=args.family, data_dir=args.data_dir, tasks=args.tasks,
                              eval_limit=args.eval_limit, train_seconds=args.train_seconds,
                              arms=args.arms.split(","), grpo_seconds=args.grpo_seconds,
                              eval_concurrency=args.eval_concurrency)
    print(json.dumps(figures, indent=2))
    return 0


def add_training_commands(sub) -> None:
    train = sub.add_parser("train", help="train a model on a factory dataset (SFT / DPO / GRPO)")
    add_options(train, TrainingConfig)
    train.add_argument("--max-steps", type=int)
    train.add_argument("--learning-rate", type=float)
    train.add_argument("--batch-size", type=int)
    train.add_argument("--time-limit-s", type=float)
    train.add_argument("--hyperparameters", help="JSON object of further hyperparameters (see tasks.training.train)")
    train.set_defaults(func=cmd_train)

    evaluate = sub.add_parser("evaluate", help="success rate of a model on held-out tasks")
    add_options(evaluate, EvaluationConfig)
    add_policy_options(evaluate, default="hf")
    evaluate.add_argument("--mistake-rate", type=float, help="the scripted policy's mistake rate")
    evaluate.set_defaults(func=cmd_evaluate)

    loop = sub.add_parser("loop", help="closed loop: factory, tiny model, held-out success before and after each training arm")
    loop.add_argument("--family", default="inventory")
    add_data_dir(loop, LOOP_DATA_DIR)
    loop.add_argument("--tasks", type=int, default=2000)
    loop.add_argument("--eval-limit", type=int, default=150)
    loop.add_argument("--train-seconds", type=float, default=900)
    loop.add_argument("--arms", default="sft,sft_weighted,sft_then_grpo",
                      help="comma-separated: sft (no step weights), sft_weighted, sft_then_grpo; each gets --train-seconds")
    loop.add_argument("--grpo-seconds", type=float, default=180,
                      help="sft_then_grpo: the last N of its --train-seconds are step-level GRPO")
    loop.add_argument("--eval-concurrency", type=int, default=1,
                      help="held-out episodes decoded in one batch by each checkpoint")
    loop.set_defaults(func=cmd_loop)
