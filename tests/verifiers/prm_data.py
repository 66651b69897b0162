"""Test data for the PRM's calibration and re-scoring: a small landed warehouse of scripted
rollouts, and synthetic human labels that are a known monotone distortion of the true progress."""

from __future__ import annotations

import json
import random

import numpy as np
import polars as pl

from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.stages.land import land_batch
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.episodes import collect_rollouts
from gymfoundry.tasks.stages.score import score_steps
from gymfoundry.tasks.stages.validate import validate_tasks
from gymfoundry.verifiers.judge import JudgeSettings


def build_warehouse(data_dir, n_tasks: int = 30, seed: int = 3, mistake_rate: float = 0.35) -> dict:
    """Generate, validate, roll out and land (no Prefect), scored without judge or calibrator."""
    tasks, rejected = validate_tasks(generate_tasks("inventory", n_tasks, seed))
    rollouts = collect_rollouts(tasks, make_policy("scripted", "inventory", mistake_rate=mistake_rate), 2, seed)
    run = score_steps(rollouts, tasks, data_dir, JudgeSettings(), use_calibrators=False)
    land_batch(str(data_dir), tasks, rejected, rollouts, run.scores)
    return {"tasks": tasks, "rollouts": rollouts, "scores": run.scores}


def distorted_label(progress: float) -> int:
    """The labeller's view of a step: a monotone distortion of Φ(s') - Φ(s), read as -1 / 0 / +1.
    Small real progress (an authorisation, 0.2) already counts as a good step."""
    return int(np.clip(np.rint(np.tanh(10 * progress)), -1, 1))


def label_sample(sample: pl.DataFrame, noise: float = 0.1, seed: int = 0, labeller: str = "synthetic-1") -> pl.DataFrame:
    """Fill the `label` and `labeller_id` columns of an exported sample; `noise` of the labels are
    replaced by a random other label."""
    rng = random.Random(seed)
    labels = []
    for components in sample["rules_components"].to_list():
        label = distorted_label(json.loads(components)["progress"])
        if rng.random() < noise:
            label = rng.choice([x for x in (-1, 0, 1) if x != label])
        labels.append(str(label))
    return sample.with_columns(label=pl.Series(labels), labeller_id=pl.lit(labeller))
