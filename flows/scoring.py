"""PRM flows: `rescore` stored rollouts under the current rules / judge / calibrator without
re-running them, and `calibrate` the PRM on imported human labels.

Scores are keyed by (rollout, step, layer, scorer, version), so a re-score under a new version
lands beside the old scores and one under an unchanged version lands nothing."""

from __future__ import annotations

from collections import Counter
from typing import Any

from prefect import flow, get_run_logger, task, unmapped
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from gymfoundry.envs.profile import DomainProfile
from gymfoundry.envs.records import Rollout, TaskSpec
from gymfoundry.flows.defaults import DEFAULT_DATA_DIR
from gymfoundry.tasks.ops.calibrate import fit_calibrators, render_agreement
from gymfoundry.tasks.stages.land import land_or_spool
from gymfoundry.tasks.ops.reverify import rollout_filter
from gymfoundry.tasks.stages.score import ScoringRun, score_steps
from gymfoundry.verifiers.judge import JudgeSettings
from gymfoundry.warehouse import Warehouse


@task(name="score-batch", cache_policy=NO_CACHE)
def score_batch(rollouts: list[Rollout], tasks: list[TaskSpec], data_dir: str, judge_base_url: str | None,
                judge_model: str | None, profiles: dict[str, DomainProfile], use_calibrators: bool) -> ScoringRun:
    # The judge's API key comes from the environment of the process that scores, never a parameter.
    judge = JudgeSettings.from_env(base_url=judge_base_url, model=judge_model)
    return score_steps(rollouts, tasks, data_dir, judge, profiles=profiles, use_calibrators=use_calibrators)


@flow(name="rescore")
def rescore(data_dir: str = DEFAULT_DATA_DIR, families: list[str] | None = None, where: str | None = None,
            profile_paths: list[str] | None = None, judge_base_url: str | None = None, judge_model: str | None = None,
            use_calibrators: bool = True, batch_size: int = 200) -> dict[str, Any]:
    """Re-score the stored rollouts of `families` (and `where`, a filter on the rollouts view)
    with the current rule layer, the judge (GYMFOUNDRY_JUDGE_* or the given URL and model), and
    each family's current calibrator; `profile_paths` are DomainProfile YAML files that replace
    their family's built-in profile (other weights, rubric, undo rules)."""
    logger = get_run_logger()
    condition = rollout_filter(families, where)
    with Warehouse(data_dir, read_only=True) as wh:
        rollouts = wh.load_rollouts(condition)
        tasks = wh.load_tasks("task_id in (select task_id from rollouts"
                              + (f" where {condition})" if condition else ")"))
    profiles = {p.name: p for p in (DomainProfile.from_yaml(path) for path in profile_paths or [])}
    by_task = {t.task_id: t for t in tasks}
    batches = [rollouts[i:i + batch_size] for i in range(0, len(rollouts), batch_size)]
    futures = score_batch.map(batches, [[by_task[r.task_id] for r in b if r.task_id in by_task] for b in batches],
                              unmapped(data_dir), unmapped(judge_base_url), unmapped(judge_model),
                              unmapped(profiles), unmapped(use_calibrators)) if batches else []
    runs = [f.result() for f in futures]
    scores = [s for run in runs for s in run.scores]
    landed = {"step_scores": 0}
    if scores:
        # waited for and spooled like every writer's ({} when spooled: the next landing lands them)
        landed = land_or_spool(data_dir, {"scores": scores},
                               {"family_of": {r.rollout_id: r.family for r in rollouts}}).checked()
    versions = Counter((s.layer, s.scorer_id, s.scorer_version) for s in scores)
    report = {
        "data_dir": data_dir, "rollouts": len(rollouts), "steps": sum(len(r.steps) for r in rollouts),
        "scores": len(scores), "landed": landed,
        "versions": [{"layer": layer, "scorer_id": sid, "scorer_version": version, "rows": n}
                     for (layer, sid, version), n in sorted(versions.items())],
        "calibrators": {f: v for run in runs for f, v in run.calibrators.items()},
        "judge": {"requests": sum(r.judge.requests for r in runs), "cache_hits": sum(r.judge.cache_hits for r in runs),
                  "errors": sum(r.judge.errors for r in runs),
                  "first_errors": [e for r in runs for e in r.judge.first_errors][:5]},
    }
    if report["judge"]["errors"]:
        logger.warning("the judge failed on %d steps (not landed; a later rescore retries them): %s",
                       report["judge"]["errors"], report["judge"]["first_errors"])
    logger.info("re-scored %d rollouts (%d steps): %d new score rows", len(rollouts), report["steps"],
                landed.get("step_scores", 0))
    create_markdown_artifact(key="rescore-report", markdown=render_rescore(report),
                             description="Re-scored rollouts: versions and rows landed")
    return report


def render_rescore(report: dict[str, Any]) -> str:
    lines = [f"# Re-score\n\n{report['rollouts']} rollouts, {report['steps']} steps; "
             f"{report['landed'].get('step_scores', 0)} new score rows.\n",
             "| layer | scorer | version | rows |", "|---|---|---|---|"]
    lines += [f"| {v['layer']} | {v['scorer_id']} | `{v['scorer_version']}` | {v['rows']} |" for v in report["versions"]]
    judge = report["judge"]
    lines.append(f"\nJudge: {judge['requests']} requests, {judge['cache_hits']} cached, {judge['errors']} failed.")
    return "\n".join(lines)


@task(name="fit-calibrators", cache_policy=NO_CACHE)
def fit(data_dir: str, families: list[str] | None, kind: str, holdout: float, seed: int, min_labels: int,
        judge_base_url: str | None, judge_model: str | None) -> dict[str, dict[str, Any]]:
    judge = JudgeSettings.from_env(base_url=judge_base_url, model=judge_model)
    return fit_calibrators(data_dir, families, kind, holdout, seed, judge, min_labels)


@flow(name="calibrate")
def calibrate(data_dir: str = DEFAULT_DATA_DIR, families: list[str] | None = None, kind: str = "isotonic",
              holdout: float = 0.3, seed: int = 0, min_labels: int = 20, judge_base_url: str | None = None,
              judge_model: str | None = None) -> dict[str, dict[str, Any]]:
    """Fit each labelled family's calibrator (isotonic or logistic), report agreement with the
    held-out labels before and after, and make it the family's current calibrator: later scoring
    runs (the factory, `rescore`) apply it."""
    reports = fit(data_dir, families, kind, holdout, seed, min_labels, judge_base_url, judge_model)
    if not reports:
        get_run_logger().warning("no labels under %s/labels: import some with `gymfoundry labels import`", data_dir)
    create_markdown_artifact(key="calibration-report", markdown="# Calibration\n\n" + render_agreement(reports),
                             description="PRM calibrators: agreement with held-out human labels")
    return reports
