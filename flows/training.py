"""Training as a downstream flow.

`train` reads a factory dataset (by id or path), trains the base model (the embedded default
when none is given, or any local Hugging Face checkpoint) with TRL, writes the checkpoint and
lands a `training_runs` row with the dataset lineage and metrics. The flows that run the factory
and then train (`factory_then_train`, `closed_loop`) are `flows/loop.py`'s."""

from __future__ import annotations

import json
import shutil
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

from gymfoundry.envs.records import TrainingRun, content_hash
from gymfoundry.flows.config import TrainingConfig, flow_parameters
from gymfoundry.flows.evaluation import evaluate, land_evaluation
from gymfoundry.flows.report import publish_training_artifacts
from gymfoundry.tasks.rollout import progress
from gymfoundry.tasks.policies.hf import checkpoint_version
from gymfoundry.tasks.stages.isolate import landed_holdout_fractions, landed_splits, refuse_non_train_ids
from gymfoundry.tasks.stages.land import land_or_spool
from gymfoundry.tasks.rollout.progress import PERMILLE, TRAINING
from gymfoundry.tasks.training.train import checkpoint_exists
from gymfoundry.tasks.training.train import train as run_trainer
from gymfoundry.tasks.policies.checkpoint import load_model
from gymfoundry.tasks.training import base_model as base_models  # a module: tests replace its builder
from gymfoundry.tasks.training.copy_pretraining import pretrain_copying
from gymfoundry.warehouse.store import assert_dataset_intact

# copy_steps: copy pretraining of the random base before it sees factory data (tasks/training/copy_pretraining.py)
DEFAULT_BASE = dict(vocab_size=1024, hidden_size=128, layers=2, heads=4, copy_steps=2400)


def _now() -> str:
    return datetime.now(timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds")


def resolve_dataset(dataset: str, data_dir: str) -> tuple[str | None, Path]:
    """(dataset id, file) for a dataset id under `<data_dir>/datasets/` or a Parquet path."""
    path = Path(dataset)
    if path.suffix == ".parquet" and path.exists():
        return path.stem, path
    candidate = Path(data_dir) / "datasets" / f"{dataset}.parquet"
    if candidate.exists():
        return dataset, candidate
    raise FileNotFoundError(f"no dataset {dataset!r}: neither a Parquet file nor {candidate}")


def default_base_model(data_dir: str, family: str = "inventory", **overrides: Any) -> str:
    """The embedded default under `<data_dir>/models/`, built once per configuration and per set
    of tasks its tokenizer text comes from: those the split authority puts in train with the
    splits recorded in `data_dir`. A template recorded later as held out changes that set, so a
    base whose tokenizer saw it is never reused."""
    config = {**DEFAULT_BASE, **overrides}
    known, fractions = landed_splits(data_dir), landed_holdout_fractions(data_dir)
    texts_from = [t.task_id for _, t in base_models.text_tasks(family, known=known, holdout_fraction=fractions)]
    out = Path(data_dir) / "models" / f"base-{family}-{content_hash([config, texts_from], 8)}"
    if not checkpoint_exists(out):  # built under a temporary name: a crash never leaves a half-built base
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        build_base(str(partial), family, known, fractions, {**config, "copy_steps": 0})
        if config.get("copy_steps"):
            copy_pretraining(str(partial), config["copy_steps"], config.get("seed", 0))
        partial.rename(out)
    return str(out)


@task(name="build-base", task_run_name="build-base", cache_policy=NO_CACHE)
def build_base(out: str, family: str, known: dict[str, Any], fractions: Any, config: dict[str, Any]) -> str:
    """The embedded default's tokenizer and randomly initialised model, saved under `out`."""
    return str(base_models.build_base_model(Path(out), family=family, known_splits=known, holdout_fraction=fractions, **config))


@task(name="copy-pretraining", task_run_name="copy-pretraining", cache_policy=NO_CACHE)
def copy_pretraining(path: str, steps: int, seed: int = 0) -> dict[str, Any]:
    """`steps` of copy pretraining of the model under `path`, saved in place (its metrics in
    `copy_pretraining.json`)."""
    model, tokenizer = load_model(path)
    metrics = pretrain_copying(model, tokenizer, str(Path(path) / "copy-pretraining"), steps, seed=seed)
    (Path(path) / "copy_pretraining.json").write_text(json.dumps(metrics))
    model.save_pretrained(path)
    get_run_logger().info("copy pretraining: %d steps, final loss %s", metrics.get("steps", steps),
                          metrics.get("final_loss"))
    return metrics


@task(name="train-model", task_run_name="train-model", cache_policy=NO_CACHE)
def train_model(dataset_path: str | None, method: str, base_model: str, output_dir: str,
                hyperparameters: dict[str, Any]) -> dict[str, Any]:
    """The trainer's losses go to this task run's log, and its progress (in thousandths of its
    budget of steps or time) to a progress artifact, updated at most every 2 s."""
    logger, here = get_run_logger(), threading.get_ident()
    meter = create_progress_artifact(0.0, key="training-progress", description=f"{method} training (%)")
    state = {"done": 0, "shown": 0.0}

    def on(event: str, label: str, n: int, detail: str | None) -> None:
        if threading.get_ident() != here or label != TRAINING:
            return  # another run's trainer in this process
        if event == "note":
            logger.info("%s", detail)
        elif event == "advance":
            state["done"] += n
            if time.monotonic() - state["shown"] > 2:
                update_progress_artifact(meter, 100.0 * state["done"] / PERMILLE)
                state["shown"] = time.monotonic()

    stop = progress.listen(on)
    try:
        metrics = run_trainer(dataset_path, method, base_model, output_dir, hyperparameters)
    finally:
        stop()
    update_progress_artifact(meter, 100.0)
    return metrics


@task(name="land-training-run", task_run_name="land-training-run", cache_policy=NO_CACHE)
def land_run(data_dir: str, run: TrainingRun) -> dict[str, int]:
    """Waited for and spooled like every writer's ({} when spooled: the next landing lands it)."""
    return land_or_spool(data_dir, {"training_runs": [run]}).checked()


@flow(name="train")
@flow_parameters(TrainingConfig)
def train(**params: Any) -> dict[str, Any]:
    """Train and land a `training_runs` row. With `evaluate_family`, the checkpoint is also
    evaluated on that family's held-out tasks (`eval_concurrency` episodes decoded in one batch)
    and the success rate joins the run's metrics. The parameters are
    `flows.config.TrainingConfig`'s."""
    config = TrainingConfig(**params)
    dataset, method, base_model, data_dir = config.dataset, config.method, config.base_model, config.data_dir
    output_dir, hyperparameters, evaluate_family = config.output_dir, config.hyperparameters, config.evaluate_family
    eval_limit, eval_concurrency = config.eval_limit, config.eval_concurrency
    dataset_id, dataset_path = resolve_dataset(dataset, data_dir) if dataset else (None, None)
    if dataset_path:  # before anything reads it: its row count, its task ids and families
        assert_dataset_intact(dataset_path)
    if config.min_rows and dataset:
        rows = dataset_rows(dataset, data_dir)
        if rows < config.min_rows:
            get_run_logger().info("dataset %s has %d rows, fewer than min_rows=%d: not training", dataset, rows,
                                  config.min_rows)
            return {"skipped": f"{rows} rows < min_rows {config.min_rows}", "dataset": dataset, "rows": rows}
    logger = get_run_logger()
    hyperparameters = dict(hyperparameters or {})
    if dataset_path:
        refuse_holdout_rows(dataset_path, data_dir)
    if method == "grpo":  # its live tasks follow the splits recorded here
        hyperparameters.setdefault("data_dir", str(data_dir))
    families = _families(dataset_path) if dataset_path else [hyperparameters.get("family", "inventory")]
    base = base_model or default_base_model(data_dir, families[0], **(config.base_config or {}))
    run = TrainingRun(method=method, base_model=base, base_model_version=checkpoint_version(base),
                      dataset_id=dataset_id, dataset_path=str(dataset_path) if dataset_path else None,
                      families=families, hyperparameters=hyperparameters, started_at=_now())
    out = output_dir or str(Path(data_dir) / "checkpoints" / run.run_id)
    metrics = train_model(str(dataset_path) if dataset_path else None, method, base, out, hyperparameters)
    played, played_tasks = metrics.pop("rollouts", None), metrics.pop("tasks", None)
    if played:  # GRPO's episodes, with their token ids, logprobs and policy versions
        metrics["landed_rollouts"] = land_evaluation(data_dir, played, played_tasks)
    if evaluate_family:
        report = evaluate(model=out, family=evaluate_family, data_dir=data_dir, limit=eval_limit,
                          concurrency=eval_concurrency)
        metrics["heldout"] = {k: report[k] for k in ("success_rate", "by_level", "episodes", "terminations")}
    run = run.model_copy(update={"checkpoint": out, "checkpoint_version": checkpoint_version(out),
                                 "metrics": _jsonable(metrics), "finished_at": _now()})
    landed = land_run(data_dir, run)
    publish_training_artifacts(data_dir, run.run_id)
    logger.info("%s run %s: %s steps, final loss %s, checkpoint %s", method, run.run_id, metrics.get("steps"),
                metrics.get("final_loss"), out)
    return {**run.model_dump(mode="json"), "landed": landed}


def dataset_rows(dataset: str, data_dir: str) -> int:
    """The row count of a dataset (id or path), from its Parquet footer."""
    _, path = resolve_dataset(dataset, data_dir)
    return pq.ParquetFile(path).metadata.num_rows


def refuse_holdout_rows(path: Path, data_dir: str) -> None:
    """A dataset file (from this data dir or elsewhere) naming a task that the warehouse holds
    outside the train split is refused before any training step."""
    if "task_id" in pq.read_schema(path).names:
        ids = pq.read_table(path, columns=["task_id"]).column("task_id").to_pylist()
        refuse_non_train_ids(ids, data_dir, f"dataset {path}")


def _families(path: Path) -> list[str]:
    schema = pq.read_schema(path)
    if "task_family" not in schema.names:
        return []
    return sorted(set(pq.read_table(path, columns=["task_family"]).column("task_family").to_pylist()))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and value != value:
        return None
    return value
