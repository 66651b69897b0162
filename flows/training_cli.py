"""`gymfoundry train`, `gymfoundry evaluate` and `gymfoundry loop` (hooked into flows.cli)."""

from __future__ import annotations

import argparse
import json
import os
import sys


def _prefect_defaults() -> None:
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def cmd_train(args: argparse.Namespace) -> int:
    from flows.config import TrainingConfig, from_args

    hp = json.loads(args.hyperparameters) if args.hyperparameters else {}
    for key in ("max_steps", "learning_rate", "batch_size", "time_limit_s"):
        if getattr(args, key) is not None:
            hp[key] = getattr(args, key)
    try:
        config = from_args(TrainingConfig, args, lambda: {"hyperparameters": hp})
    except ValueError as exc:
        print(f"gymfoundry train: {exc}", file=sys.stderr)
        return 2
    _prefect_defaults()
    from flows.training import train

    from flows.progress_bars import progress_bars

    with progress_bars():
        run = train(**config.params())
    metrics = run["metrics"]
    print(f"training run {run['run_id']}: {metrics.get('steps')} steps, final loss {metrics.get('final_loss')}, "
          f"{metrics.get('seconds_per_step')} s/step, peak RSS {metrics.get('peak_rss_mb')} MB")
    print(f"checkpoint: {run['checkpoint']}")
    if "heldout" in metrics:
        print(f"held-out success: {100 * metrics['heldout']['success_rate']:.1f}%")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    _prefect_defaults()
    from flows.cli import policy_spec
    from flows.config import EvaluationConfig, from_args

    try:
        config = from_args(EvaluationConfig, args, lambda: {"policy": policy_spec(args)})
    except ValueError as exc:  # one line naming each invalid option
        print(f"gymfoundry evaluate: {exc}", file=sys.stderr)
        return 2
    from flows.evaluation import evaluate

    report = evaluate(**config.params())
    print(f"{report['model'] or report['policy_id']} on {report['episodes']} held-out {report['family']} episodes: "
          f"success {100 * report['success_rate']:.1f}%  by level {report['by_level']}  {report['terminations']}")
    for family, by_k in report["pass_at_k"].items():
        print(f"{family}: " + "  ".join(f"pass@{k} {v['pass@k']:.4f} pass^{k} {v['pass^k']:.4f}"
                                        for k, v in by_k.items()))
    return 0


def cmd_loop(args: argparse.Namespace) -> int:
    _prefect_defaults()
    from flows.progress_bars import progress_bars
    from flows.training import closed_loop

    with progress_bars():
        figures = closed_loop(family=args.family, data_dir=args.data_dir, tasks=args.tasks,
                              eval_limit=args.eval_limit, train_seconds=args.train_seconds,
                              arms=args.arms.split(","), grpo_seconds=args.grpo_seconds,
                              eval_concurrency=args.eval_concurrency)
    print(json.dumps(figures, indent=2))
    return 0


def add_training_commands(sub) -> None:
    train = sub.add_parser("train", help="train a model on a factory dataset (SFT / DPO / GRPO)")
    from flows.config import TrainingConfig, add_options

    add_options(train, TrainingConfig)
    train.add_argument("--max-steps", type=int)
    train.add_argument("--learning-rate", type=float)
    train.add_argument("--batch-size", type=int)
    train.add_argument("--time-limit-s", type=float)
    train.add_argument("--hyperparameters", help="JSON object of further hyperparameters (see tasks.train)")
    train.set_defaults(func=cmd_train)

    evaluate = sub.add_parser("evaluate", help="success rate of a model on held-out tasks")
    from flows.cli import add_policy_options
    from flows.config import EvaluationConfig, add_options

    add_options(evaluate, EvaluationConfig)
    add_policy_options(evaluate, default="hf")
    evaluate.add_argument("--mistake-rate", type=float, help="the scripted policy's mistake rate")
    evaluate.set_defaults(func=cmd_evaluate)

    loop = sub.add_parser("loop", help="closed loop: factory, tiny model, held-out success before and after each training arm")
    loop.add_argument("--family", default="inventory")
    loop.add_argument("--data-dir", default=".gymfoundry-loop")
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
