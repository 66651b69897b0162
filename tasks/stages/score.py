"""Stage: score every step with the PRM layers (see `verifiers/prm.py`).

Layer 1 (rules) always runs, with each family's profile weights and its verifier's progress
potential; layer 2 (the LLM judge) runs where an endpoint is configured (settings or the
GYMFOUNDRY_JUDGE_* environment) and is otherwise reported "not_configured"; layer 3 applies the
family's current calibrator under `<data_dir>/calibrators/` where one exists. Every step gets
its layer rows plus a `combined` row: the reward the trainer sees.

`latest_step_rewards(warehouse)` gives the newest combined reward per step, for dataset assembly."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import polars as pl

from gymfoundry.envs.profile import DomainProfile
from gymfoundry.envs.records import Rollout, StepScore, TaskSpec
from gymfoundry.envs.family import family as family_of
from gymfoundry.tasks.rollout.collector import frozen_before
from gymfoundry.tasks.stages.generate import family_env_class
from gymfoundry.verifiers.calibration import Calibrator, current_calibrators
from gymfoundry.verifiers.judge import Judge, JudgeCache, JudgeSettings, JudgeStats
from gymfoundry.verifiers.prm import combine
from gymfoundry.verifiers.rules import score_rules

JUDGE_CACHE_FILE = "judge_cache.sqlite"


def family_verifier(family: str):
    return family_of(family).outcome_verifier


def family_profiles(families: list[str], overrides: dict[str, DomainProfile] | None = None) -> dict[str, DomainProfile]:
    overrides = overrides or {}
    return {f: overrides[f] if f in overrides else family_env_class(f).profile for f in families}


def judge_cache(data_dir: str | Path | None) -> JudgeCache:
    return JudgeCache(Path(data_dir) / JUDGE_CACHE_FILE if data_dir else None)


@dataclass
class ScoringRun:
    scores: list[StepScore]                 # what to land: every layer's rows and the combined row
    judge: JudgeStats
    calibrators: dict[str, str] = field(default_factory=dict)   # family -> calibrator version applied
    judge_failed: list[StepScore] = field(default_factory=list)  # not landed: retried by the next re-score


@frozen_before()  # what exists before is out of the garbage collector's sight while it runs
def score_steps(rollouts: list[Rollout], tasks: list[TaskSpec], data_dir: str | Path | None = None,
                judge: JudgeSettings | None = None, profiles: dict[str, DomainProfile] | None = None,
                calibrators: dict[str, Calibrator] | None = None, use_calibrators: bool = True) -> ScoringRun:
    """Score all steps of `rollouts`. `profiles` override the families' built-in profiles (e.g. a
    YAML with other weights); `calibrators` default to each family's current one under
    `data_dir` (none with `use_calibrators=False`)."""
    families = sorted({r.family for r in rollouts})
    profiles = family_profiles(families, profiles)
    by_id = {t.task_id: t for t in tasks}
    potentials = {}
    for family in families:
        verifier = family_verifier(family)
        if verifier is not None and hasattr(verifier, "potentials"):
            potentials[family] = verifier.potentials
    rule_scores = score_rules(rollouts, by_id, profiles, potentials)
    judge_scores, stats = Judge(judge or JudgeSettings.from_env(), judge_cache(data_dir)).score(rollouts, by_id, profiles)
    if calibrators is None:
        calibrators = current_calibrators(data_dir, families) if use_calibrators else {}
    family_of = {r.rollout_id: r.family for r in rollouts}
    combined = combine(rule_scores, judge_scores, profiles, family_of, calibrators)
    landed_judge = [s for s in judge_scores if s.status != "error"]
    return ScoringRun(scores=rule_scores + landed_judge + combined, judge=stats,
                      calibrators={f: c.version for f, c in calibrators.items() if f in families},
                      judge_failed=[s for s in judge_scores if s.status == "error"])


def score_rollouts(rollouts: list[Rollout], tasks: list[TaskSpec], data_dir: str | Path | None = None,
                   judge: JudgeSettings | None = None) -> list[StepScore]:
    return score_steps(rollouts, tasks, data_dir, judge).scores


def newest_scores(warehouse: Any, layers: Sequence[str] = ("rules", "judge", "calibrated", "combined"),
                  where: str | None = None, params: Sequence[Any] | None = None) -> pl.DataFrame:
    """Per step and layer, the row with status ok of the most recently landed scoring run: columns
    rollout_id, step_index, task_family, layer, scorer_id, scorer_version, score, components,
    rationale. `where` filters the step_scores rows (e.g. "task_family = 'inventory'")."""
    files = warehouse.files("step_scores")
    columns = {"rollout_id": pl.String, "step_index": pl.Int64, "task_family": pl.String, "layer": pl.String,
               "scorer_id": pl.String, "scorer_version": pl.String, "score": pl.Float64, "components": pl.String,
               "rationale": pl.String}
    if not files:
        return pl.DataFrame(schema=columns)
    # The manifest lists files in landing order: a file's position ranks its rows.
    paths = "[" + ", ".join("'" + p.as_posix().replace("'", "''") + "'" for p in files) + "]"
    layer_list = ", ".join("'" + layer.replace("'", "''") + "'" for layer in layers)
    frame = warehouse.sql_df(f"""
        select {', '.join(columns)} from read_parquet({paths}, filename = true, hive_partitioning = true,
                                                      hive_types = {{'task_family': VARCHAR}}, union_by_name = true)
        where status = 'ok' and layer in ({layer_list}) {f'and ({where})' if where else ''}
        qualify row_number() over (partition by rollout_id, step_index, layer
                                   order by list_position({paths}, filename) desc, scorer_version desc) = 1
        order by rollout_id, step_index, layer""", params)
    return frame if frame.height else pl.DataFrame(schema=columns)


def latest_step_rewards(warehouse: Any, where: str | None = None,
                        params: Sequence[Any] | None = None) -> dict[str, list[float]]:
    """rollout_id -> the reward of each step in step order: per step the `combined` score of the
    most recently landed scoring run, or the newest `rules` score for steps scored before the
    combined layer existed. `where` filters the step_scores rows (e.g. "task_family = 'inventory'")."""
    scores = newest_scores(warehouse, ("rules", "combined"), where, params)
    if scores.is_empty():
        return {}
    rewards = (scores.sort("rollout_id", "step_index", pl.col("layer") == "combined")
               .group_by("rollout_id", "step_index").agg(pl.col("score").last())
               .sort("rollout_id", "step_index").group_by("rollout_id", maintain_order=True).agg("score"))
    return dict(zip(rewards["rollout_id"].to_list(), rewards["score"].to_list()))
