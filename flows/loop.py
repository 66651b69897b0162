"""The loop: the flows that compose the factory and training, above both (the factory never
trains; training reads what the factory assembled).

`factory_then_train` runs the factory, then, with `train_after`, the training flow on the run's
dataset of that kind (`gymfoundry run --train-after`). `closed_loop` runs factory → base model →
held-out evaluation → SFT / step-weighted SFT / SFT then GRPO at equal training time → held-out
evaluation of each, and reports the figures (`gymfoundry loop`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from gymfoundry.envs.records import PolicySpec
from gymfoundry.flows.config import ARMS, FactoryConfig, flow_parameters
from gymfoundry.flows.defaults import LOOP_DATA_DIR
from gymfoundry.flows.evaluation import evaluate
from gymfoundry.flows.factory import TRAINING_AFTER, factory
from gymfoundry.flows.report import publish_run_artifacts
from gymfoundry.flows.training import default_base_model, train


@flow(name="factory-then-train", persist_result=False)
@flow_parameters(FactoryConfig)
def factory_then_train(**params: Any) -> dict[str, Any]:
    """The factory flow (a subflow, given every parameter: `train_after` is recorded with the run),
    then, with `train_after="sft"` (or dpo / grpo), the training flow on the dataset of that kind
    the run assembled, with `train_hyperparameters`; its run joins the report as `training`. The
    factory leaves a run that trains without its run artifacts: they are published here, after
    training, so that their training-runs table lists the run it trained. The parameters are
    `flows.config.FactoryConfig`'s."""
    config = FactoryConfig(**params)
    composing = TRAINING_AFTER.set(True)
    try:
        report = factory(**config.params())
    finally:
        TRAINING_AFTER.reset(composing)
    if not config.train_after:
        return report
    datasets = report["datasets"]
    if not datasets:
        get_run_logger().error("not training: this run assembled no dataset (see above)")
        return report
    method = config.train_after
    dataset_id = datasets[method]["dataset_id"] if method in datasets else None
    report["training"] = train(dataset=dataset_id, method=method, data_dir=config.data_dir,
                               hyperparameters=config.train_hyperparameters)
    publish_run_artifacts(config.data_dir, config.families, report["run"]["run_id"],
                          [d["dataset_id"] for d in datasets.values()])
    return report


@flow(name="closed-loop")
def closed_loop(family: str = "inventory", data_dir: str = LOOP_DATA_DIR, tasks: int = 2000, seed: int = 1,
                mistake_rate: float = 0.1, samples_per_task: int = 2, eval_limit: int = 150,
                train_seconds: float = 900, arms: list[str] | None = None, grpo_seconds: float = 180,
                hyperparameters: dict[str, Any] | None = None, grpo_hyperparameters: dict[str, Any] | None = None,
                base: dict[str, Any] | None = None, policy: PolicySpec | str = "scripted",
                eval_concurrency: int = 1) -> dict[str, Any]:
    """Factory (collecting with `policy`, a PolicySpec or kind name as `factory` takes it) →
    tiny base model → held-out success before → each arm trained from the same base
    for the same `train_seconds` of wall time → held-out success after. Arms: `sft` (no step
    weights), `sft_weighted` (PRM step weights), `sft_then_grpo` (weighted SFT for
    `train_seconds - grpo_seconds`, then step-level GRPO in the live envs for `grpo_seconds`).
    Returns the figures (also a markdown artifact)."""
    arms = list(arms or ARMS)
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}; choose from {ARMS}")
    if "sft_then_grpo" in arms and not 0 < grpo_seconds < train_seconds:
        raise ValueError("sft_then_grpo needs 0 < grpo_seconds < train_seconds")
    started = time.perf_counter()
    report = factory(families=[family], tasks_per_family=tasks, seed=seed, policy=policy, mistake_rate=mistake_rate,
                     samples_per_task=samples_per_task, data_dir=data_dir)
    sft = report["datasets"]["sft"]
    base_started = time.perf_counter()
    base_model = default_base_model(data_dir, family, **(base or {}))
    base_seconds = round(time.perf_counter() - base_started, 1)
    before = evaluate(model=base_model, family=family, data_dir=data_dir, limit=eval_limit,
                      concurrency=eval_concurrency)
    # A gentle learning rate keeps the base's copying circuits (3e-3 wipes them in 100 steps).
    hp = {"max_steps": 100000, "batch_size": 4, "learning_rate": 1e-3, "warmup_steps": 50,
          "time_limit_s": train_seconds, "logging_steps": 25, **(hyperparameters or {})}

    def sft_run(weighted: bool, seconds: float, evaluate_after: bool = True) -> dict[str, Any]:
        return train(dataset=sft["path"], method="sft", base_model=base_model, data_dir=data_dir,
                     hyperparameters={**hp, "weighted": weighted, "time_limit_s": seconds},
                     evaluate_family=family if evaluate_after else None, eval_limit=eval_limit,
                     eval_concurrency=eval_concurrency)

    runs, stages = {}, {}
    if "sft" in arms:
        runs["sft"] = sft_run(False, train_seconds)
    if "sft_weighted" in arms:
        runs["sft_weighted"] = sft_run(True, train_seconds)
    if "sft_then_grpo" in arms:
        first = sft_run(True, train_seconds - grpo_seconds, evaluate_after=False)
        runs["sft_then_grpo"] = train(method="grpo", base_model=first["checkpoint"], data_dir=data_dir,
                                      hyperparameters={"max_steps": 100000, "family": family, "learning_rate": 1e-4,
                                                       "tasks": 64, "num_generations": 4, "max_completion_length": 96,
                                                       **(grpo_hyperparameters or {}), "time_limit_s": grpo_seconds},
                                      evaluate_family=family, eval_limit=eval_limit,
                                      eval_concurrency=eval_concurrency)
        stages["sft_then_grpo"] = first
    figures = {"family": family, "data_dir": str(Path(data_dir).resolve()), "sft_rows": sft["rows"],
               "base_model": base_model, "base_build_seconds": base_seconds,
               "copy_pretraining": _copy_pretraining(base_model), "heldout_before": before["success_rate"],
               "heldout_episodes": before["episodes"], "train_seconds": train_seconds,
               "runs": {name: _arm_figures(r, stages.get(name)) for name, r in runs.items()},
               "wall_seconds": round(time.perf_counter() - started, 1)}
    create_markdown_artifact(key="closed-loop", markdown=_render_loop(figures),
                             description="Closed loop: held-out success before and after training")
    return figures


def _copy_pretraining(base_model: str) -> dict[str, Any] | None:
    path = Path(base_model) / "copy_pretraining.json"
    if not path.exists():
        return None
    metrics = json.loads(path.read_text())
    return {k: metrics[k] for k in ("steps", "train_seconds", "final_loss")}


def _arm_figures(run: dict[str, Any], first_stage: dict[str, Any] | None) -> dict[str, Any]:
    """One arm's figures; an arm of two stages adds up its steps and training seconds."""
    stages = [s for s in (first_stage, run) if s]
    heldout = run["metrics"].get("heldout", {})
    return {"success_rate": heldout.get("success_rate"), "by_level": heldout.get("by_level"),
            "steps": [s["metrics"]["steps"] for s in stages],
            "train_seconds": round(sum(s["metrics"]["train_seconds"] for s in stages), 1),
            "final_loss": run["metrics"]["final_loss"], "checkpoint": run["checkpoint"],
            "run_ids": [s["run_id"] for s in stages]}


def _render_loop(f: dict[str, Any]) -> str:
    lines = [f"# Closed loop on {f['family']}", "", f"SFT rows: {f['sft_rows']}, held-out episodes: "
             f"{f['heldout_episodes']}", "", "| model | held-out success | steps | train s |", "|---|---|---|---|",
             "| base (untrained) | " + (f"{100 * f['heldout_before']:.1f}%" if f["heldout_before"] is not None else "-")
             + " | 0 | 0 |"]
    lines += [f"| {name} | " + (f"{100 * r['success_rate']:.1f}%" if r["success_rate"] is not None else "-")
              + f" | {' + '.join(map(str, r['steps']))} | {r['train_seconds']} |" for name, r in f["runs"].items()]
    return "\n".join(lines)
