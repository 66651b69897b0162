"""The factory flow: generate → validate → isolate → rollout → classify → score → land →
assemble. Stage logic lives in `tasks/`; these Prefect tasks are thin wrappers that add
orchestration (retries, concurrency through the task runner, artifacts)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task, unmapped
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

import envs  # noqa: F401  registers the built-in environments
from envs.records import Rollout, StepScore, TaskRejection, TaskSpec
from tasks import assemble as assemble_stage
from tasks.generate import generate_tasks
from tasks.isolate import assert_no_leaks, isolate_tasks
from tasks.land import land_batch
from tasks.policies import make_policy
from tasks.rollout import collect_rollouts
from tasks.score import score_rollouts
from tasks.validate import validate_tasks


@task(name="generate", cache_policy=NO_CACHE)
def generate(family: str, n: int, seed: int) -> list[TaskSpec]:
    return generate_tasks(family, n, seed)


@task(name="validate", cache_policy=NO_CACHE)
def validate(tasks: list[TaskSpec]) -> tuple[list[TaskSpec], list[TaskRejection]]:
    return validate_tasks(tasks)


@task(name="isolate", cache_policy=NO_CACHE)
def isolate(tasks: list[TaskSpec]) -> tuple[list[TaskSpec], list[TaskRejection]]:
    return isolate_tasks(tasks)


@task(name="rollout-batch", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=1)
def rollout_batch(tasks: list[TaskSpec], policy: str, policy_kwargs: dict[str, Any], samples_per_task: int,
                  seed: int) -> list[Rollout]:
    agent = make_policy(policy, tasks[0].family, **policy_kwargs)
    return collect_rollouts(tasks, agent, samples_per_task, seed)


@task(name="score", cache_policy=NO_CACHE)
def score(rollouts: list[Rollout], tasks: list[TaskSpec]) -> list[StepScore]:
    assert_no_leaks(rollouts, {t.task_id: t for t in tasks})
    return score_rollouts(rollouts, tasks)


@task(name="land", cache_policy=NO_CACHE)
def land(data_dir: str, tasks: list[TaskSpec], rejections: list[TaskRejection], rollouts: list[Rollout],
         scores: list[StepScore]) -> dict[str, int]:
    return land_batch(data_dir, tasks, rejections, rollouts, scores)


@task(name="assemble", cache_policy=NO_CACHE)
def assemble(data_dir: str, families: list[str]) -> dict[str, Any]:
    return assemble_stage.assemble_datasets(data_dir, families)


@flow(name="factory-family")
def family_pipeline(family: str, tasks_per_family: int, seed: int, policy: str, policy_kwargs: dict[str, Any],
                    samples_per_task: int, batch_size: int) -> dict[str, Any]:
    """One family, from task specs to scored rollouts (not yet landed)."""
    generated = generate(family, tasks_per_family, seed)
    valid, invalid = validate(generated)
    isolated, leaked = isolate(valid)
    batches = [isolated[i:i + batch_size] for i in range(0, len(isolated), batch_size)]
    futures = rollout_batch.map(batches, unmapped(policy), unmapped(policy_kwargs),
                                   unmapped(samples_per_task), unmapped(seed)) if batches else []
    rollouts = [r for future in futures for r in future.result()]
    scores = score(rollouts, isolated) if rollouts else []
    return {"tasks": isolated, "rejections": invalid + leaked, "rollouts": rollouts, "scores": scores}


def make_task_runner(name: str, max_workers: int | None = None):
    """`threads` (default, one machine), `dask` or `ray` (many machines; needs the extra)."""
    if name == "threads":
        return ThreadPoolTaskRunner(max_workers=max_workers)
    extras = {"dask": ("prefect_dask", "DaskTaskRunner"), "ray": ("prefect_ray", "RayTaskRunner")}
    if name not in extras:
        raise ValueError(f"unknown task runner {name!r}; use threads, dask or ray")
    module, cls = extras[name]
    try:
        return getattr(importlib.import_module(module), cls)()
    except ImportError:
        raise ValueError(f"task runner {name!r} needs {module.replace('_', '-')}: "
                         f"pip install -e '.[{name}]'") from None


@flow(name="factory", log_prints=True)
def factory(families: list[str] = ["inventory"], tasks_per_family: int = 50, seed: int = 0,  # noqa: B006
            policy: str = "scripted", mistake_rate: float = 0.25, samples_per_task: int = 2,
            batch_size: int = 25, data_dir: str = ".gymfoundry", task_runner: str = "threads") -> dict[str, Any]:
    """Run the whole factory and land everything in the warehouse under `data_dir`.

    Re-running with the same parameters lands nothing new (ids are content hashes).
    `task_runner` spreads the rollout batches: threads, dask or ray."""
    logger = get_run_logger()
    policy_kwargs = {"mistake_rate": mistake_rate} if policy == "scripted" else {}
    pipeline = family_pipeline.with_options(task_runner=make_task_runner(task_runner))
    landed: dict[str, int] = {}
    for family in families:
        out = pipeline(family, tasks_per_family, seed, policy, policy_kwargs, samples_per_task, batch_size)
        counts = land(data_dir, out["tasks"], out["rejections"], out["rollouts"], out["scores"])
        for table, n in counts.items():
            landed[table] = landed.get(table, 0) + n
        logger.info("%s: %d tasks kept, %d rejected, %d rollouts", family, len(out["tasks"]),
                    len(out["rejections"]), len(out["rollouts"]))
    datasets = assemble(data_dir, families)
    report = {"data_dir": str(Path(data_dir).resolve()), "landed": landed, "datasets": datasets,
              "summary": assemble_stage.summary(data_dir, families)}
    create_markdown_artifact(key="factory-report", markdown=render_report(report),
                             description="Factory run: landed rows, datasets and outcomes")
    return report


def render_report(report: dict[str, Any]) -> str:
    lines = [f"# Factory run\n\nData: `{report['data_dir']}`\n", "| family | termination | rollouts |",
             "|---|---|---|"]
    lines += [f"| {r['task_family']} | {r['termination']} | {r['rollouts']} |" for r in report["summary"]]
    lines += ["", "Landed: " + ", ".join(f"{k}={v}" for k, v in report["landed"].items())]
    lines += [f"Dataset `{d['dataset_id']}`: {d['rows']} rows at `{d['path']}`" for d in report["datasets"].values()]
    return "\n".join(lines)
