"""Stage: train a model on a factory dataset with TRL (SFT, DPO or GRPO).

`train(dataset, method, base_model, output_dir, **hyperparameters)` loads the base model
(any local directory: the embedded default or a Hugging Face checkpoint), trains, saves the
checkpoint with `save_pretrained` and returns the run's metrics."""

from __future__ import annotations

import os
import resource
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from gymfoundry.warehouse.store import assert_dataset_intact

METHODS = ("sft", "dpo", "grpo")


@dataclass
class Hyperparameters:
    max_steps: int = 100
    learning_rate: float = 1e-3
    batch_size: int = 8
    grad_accum: int = 1
    max_length: int = 1024
    overlap_steps: int = 1          # SFT chunking: earlier steps repeated, masked, as context
    weighted: bool = True           # SFT: PRM step weights in the per-token loss
    step_weight_temperature: float = 0.25  # SFT: a step's weight is exp(reward / this), mean-normalised
    curriculum: bool = False        # sample rows by difficulty, easy first, then mixed
    warmup_steps: int = 10
    seed: int = 0
    num_threads: int | None = None
    time_limit_s: float | None = None  # stop training (and save) after this much wall time
    logging_steps: int = 10
    beta: float = 0.1               # DPO / GRPO KL strength
    num_generations: int = 4        # GRPO group size
    max_completion_length: int = 64  # GRPO tokens per turn
    temperature: float = 1.0         # GRPO sampling
    tasks: int = 16                  # GRPO: training tasks per run
    family: str = "inventory"        # GRPO: the env family to act in
    slack_steps: int | None = 4      # GRPO: turns allowed beyond the reference length (as in evaluation)
    loss_type: str = "grpo"          # GRPO: TRL's loss_type ("grpo": mean per episode, then over episodes; "dapo", ...)
    data_dir: str | None = None      # GRPO: the warehouse whose recorded splits choose the train tasks

    def __post_init__(self):
        if self.step_weight_temperature <= 0:
            raise ValueError(f"step_weight_temperature must be positive, not {self.step_weight_temperature}")

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> Hyperparameters:
        known = {f.name for f in fields(cls)}
        unknown = set(values or {}) - known
        if unknown:
            raise ValueError(f"unknown hyperparameters {sorted(unknown)}; known: {sorted(known)}")
        return cls(**(values or {}))


def train(dataset: str | None, method: str, base_model: str, output_dir: str,
          hyperparameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train and save under `output_dir`; returns metrics (loss, steps, seconds per step, peak
    memory). `dataset` is a Parquet file of the factory's datasets (GRPO needs none: it acts
    in the live environments). A warehouse's dataset file that is not the one it recorded (a
    flipped bit, a rewrite) is refused, naming it, before anything is loaded."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; use one of {METHODS}")
    hp = Hyperparameters.from_dict(hyperparameters)
    if dataset is not None:
        assert_dataset_intact(dataset)
    import torch

    torch.set_num_threads(hp.num_threads or max(1, os.cpu_count() or 1))
    torch.manual_seed(hp.seed)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    if method == "sft":
        from gymfoundry.tasks.training.runners import run_sft as runner  # local: torch/transformers/trl, loaded only when a run trains
    elif method == "dpo":
        from gymfoundry.tasks.training.runners import run_dpo as runner  # local: torch/transformers/trl, loaded only when a run trains
    else:
        from gymfoundry.tasks.training.grpo import run_grpo as runner  # local: torch/transformers/trl, loaded only when a run trains
    metrics = runner(dataset, base_model, output_dir, hp)
    seconds = time.perf_counter() - started
    metrics.update(method=method, seconds=round(seconds, 2),
                   peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                   hyperparameters=asdict(hp))
    if metrics.get("steps"):
        metrics["seconds_per_step"] = round(metrics["train_seconds"] / metrics["steps"], 4)
    return metrics


def checkpoint_exists(path: str | Path) -> bool:
    return (Path(path) / "config.json").exists()
