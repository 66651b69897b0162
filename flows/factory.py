"""The factory flow: generate → validate → isolate → rollout → classify → score → land →
assemble. Stage logic lives in `tasks/`; these Prefect tasks are thin wrappers that add
orchestration (retries, concurrency through the task runner, artifacts).

Kept cheap at thousands of tasks: one task run per stage and per rollout batch (never per
rollout), bulky arguments `quote()`d (Prefect would otherwise walk every field of every record
of them, twice per task run), no result persisted and no cache key computed. Only the rollout
batches go through the task runner, so on Dask or Ray only they run in other processes: they
return records, and this process alone writes the catalog."""

from __future__ import annotations

import contextvars
import importlib
import math
import os
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager, nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, tags, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext, TagsContext
from prefect.events import emit_event
from prefect.futures import as_completed
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from gymfoundry.envs.records import (FaultConfig, ParallelismReward, PolicySpec, RetryPolicy, Rollout, Run, StepScore,
                          TaskRejection, TaskSpec)
from gymfoundry.envs.secrets import redact
from gymfoundry.flows.config import FactoryConfig, flow_parameters
from gymfoundry.flows.report import publishing_run_artifacts
from gymfoundry.tasks.stages import assemble as assemble_stage
from gymfoundry.tasks.rollout import progress
from gymfoundry.tasks.stages.audit import ensure_audited
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.stages.isolate import HOLDOUT_FRACTION, assert_no_leaks, isolate_tasks, landed_splits, lock_holdout_fraction
from gymfoundry.tasks.stages.land import land_records, land_run, stage_records
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.retry import RetryExhausted, collect_with_retries, run_counts
from gymfoundry.tasks.stages.score import score_rollouts
from gymfoundry.tasks.stages.validate import validate_tasks
from gymfoundry.warehouse import CATALOG_FILE, CatalogLocked, Staged, Warehouse


@task(name="generate", task_run_name="generate", cache_policy=NO_CACHE, persist_result=False)
def generate(family: str, n: int, seed: int) -> quote:
    """The family's task specs, `quote()`d (Prefect links every item of a returned list to the task
    run's state, one entry per record)."""
    return quote(generate_tasks(family, n, seed))


@task(name="validate", task_run_name="validate", cache_policy=NO_CACHE, persist_result=False)
def validate(tasks: list[TaskSpec], retry: RetryPolicy | None = None) -> tuple[list[TaskSpec], list[TaskRejection]]:
    """An environment fault while checking a task is retried under the run's retry policy, as rollouts are."""
    return validate_tasks(tasks, retry)


@task(name="isolate", task_run_name="isolate", cache_policy=NO_CACHE, persist_result=False)
def isolate(tasks: list[TaskSpec], data_dir: str | None = None,
            holdout_fraction: float = HOLDOUT_FRACTION) -> tuple[list[TaskSpec], list[TaskRejection]]:
    """Templates already in the warehouse keep their split (the holdout stays locked)."""
    known = landed_splits(data_dir) if data_dir else {}
    return isolate_tasks(tasks, known, holdout_fraction)


def _crashed_not_exhausted(task, task_run, state) -> bool:
    """Prefect retries a crashed batch once, but not one that used up the run's retry policy."""
    try:
        state.result()
    except RetryExhausted:
        return False
    except Exception:
        return True
    return False


class Batch:
    """A rollout batch's task specs as one value Prefect does not walk (a plain object: it walks
    lists and pydantic models field by field, about 2 ms per task spec, twice per task run) and a
    Dask worker receives as it was sent. `quote()` is not walked either, but Dask rebuilds it (a
    tuple subclass) wrongly on the way to a worker."""

    __slots__ = ("tasks",)

    def __init__(self, tasks: list[TaskSpec]):
        self.tasks = tasks


@task(name="rollout-batch", task_run_name="rollout-batch", cache_policy=NO_CACHE, persist_result=False, retries=1,
      retry_delay_seconds=1,
      retry_condition_fn=_crashed_not_exhausted)
def rollout_batch(batch: Batch, policy: PolicySpec | str, policy_kwargs: dict[str, Any] | None,
                  samples_per_task: int, seed: int, retry: RetryPolicy | None = None,
                  faults: FaultConfig | None = None, subagent: PolicySpec | None = None) -> list[Rollout]:
    """`policy`: a PolicySpec (`policy_kwargs` then empty), or a policy name and its keywords.
    `subagent`: the frozen policy of delegated sub-tasks (None: each sub-task family's scripted one)."""
    tasks = batch.tasks
    agent = make_policy(policy, tasks[0].family, **(policy_kwargs or {}))
    return collect_with_retries(tasks, agent, samples_per_task, seed, retry or RetryPolicy(), faults,
                                subagent=subagent)


@task(name="score", task_run_name="score", cache_policy=NO_CACHE, persist_result=False)
def score(rollouts: list[Rollout], tasks: list[TaskSpec], data_dir: str | None = None) -> quote:
    """All PRM layers: rules, the judge where GYMFOUNDRY_JUDGE_* configures one, and the family's
    current calibrator under `data_dir`; `quote()`d, as `generate`'s (one score per step and layer:
    tens of thousands of records, about 0.2 s of Prefect's linking at 1,000 tasks)."""
    assert_no_leaks(rollouts, {t.task_id: t for t in tasks})
    return quote(score_rollouts(rollouts, tasks, data_dir))


@task(name="stage", task_run_name="stage", cache_policy=NO_CACHE, persist_result=False)
def stage(data_dir: str, tasks: list[TaskSpec], rejections: list[TaskRejection], rollouts: list[Rollout],
          scores: list[StepScore], run_id: str | None = None, flow_run_id: str | None = None) -> quote:
    """The family's rows, gated and written under `incoming/`, not yet visible (`land` registers them)."""
    return quote(stage_records(data_dir, tasks, rejections, rollouts, scores, run_id=run_id, flow_run_id=flow_run_id))


@task(name="land", task_run_name="land", cache_policy=NO_CACHE, persist_result=False)
def land(data_dir: str, tasks: list[TaskSpec], rejections: list[TaskRejection], rollouts: list[Rollout],
         scores: list[StepScore], run_id: str | None = None, flow_run_id: str | None = None,
         staged: Staged | None = None) -> dict[str, Any]:
    """One transaction after the quality gates; a failing batch goes to quarantine, loudly. The
    rollouts carry the run's id and its Prefect flow run id. A batch the catalog's lock kept out
    (a reader holding it) is spooled, loudly, and lands first in the next landing. `staged`: these
    records as `stage` staged them (then only registered)."""
    landing = land_records(data_dir, tasks, rejections, rollouts, scores, run_id=run_id, flow_run_id=flow_run_id,
                           staged=staged)
    if landing.drained:
        get_run_logger().info("landed %d spooled batch(es) of earlier runs first", len(landing.drained))
    if landing.spooled:
        get_run_logger().error("SPOOLED: the catalog stayed locked by another process; a batch of %d rollouts is "
                               "kept in %s and lands with the next run", len(rollouts), landing.spooled)
        create_markdown_artifact(
            key="spooled-batch", description="The catalog was locked: a batch waits in the spool",
            markdown="# Spooled batch\n\nThe catalog stayed locked by another process (see the log). "
                     f"{len(rollouts)} rollouts wait in `{landing.spooled}` and land with the next run.")
    if not landing.ok:
        report = landing.report.summary() if landing.report else ""
        get_run_logger().error("QUARANTINED: a batch of %d tasks, %d rollouts and %d step scores failed the quality "
                               "gates and did not land: %s. Rows and validation report: %s", len(tasks),
                               len(rollouts), len(scores), report, landing.quarantine)
        create_markdown_artifact(
            key="quarantined-batch", description="A batch failed the quality gates and went to quarantine",
            markdown=f"# Quarantined batch\n\nNothing of it landed. Rows and report: `{landing.quarantine}`\n\n"
                     + "\n".join(f"- {line}" for line in report.split("; ")))
    if landing.refused:
        get_run_logger().error("QUARANTINED: rollouts holding values no column can store did not land (the rest "
                               "did); rows and reasons: %s", landing.refused)
    return {"counts": landing.counts, "quarantine": str(landing.quarantine) if landing.quarantine else None,
            "refused": str(landing.refused) if landing.refused else None,
            "spooled": str(landing.spooled) if landing.spooled else None}


@task(name="audit", task_run_name="audit", cache_policy=NO_CACHE, persist_result=False)
def audit(data_dir: str, families: list[str], episodes: int = 1) -> dict[str, Any]:
    """Each family's gameability audit of its current versions, run and landed where there is none
    yet (the run's `gameability-audits` artifact shows it); assembly then refuses a failed one."""
    logger = get_run_logger()
    with Warehouse(data_dir) as wh:
        audits = ensure_audited(wh, families, episodes, progress=logger.info)
    for family, rows in audits.items():
        failing = [f"{r.adversary} at level {r.level}: {'; '.join(r.reasons)}" for r in rows if not r.passed]
        if failing:
            logger.error("gameability audit %s of %s FAILED: %s", rows[0].audit_id, family, " | ".join(failing))
    return {f: {"audit_id": rows[0].audit_id, "passed": all(r.passed for r in rows)} for f, rows in audits.items()}


@task(name="assemble", task_run_name="assemble", cache_policy=NO_CACHE, persist_result=False)
def assemble(data_dir: str, families: list[str], policy_version: str | None = None, learnability: str = "p(1-p)",
             min_margin: float = 0.5, policy_id: str | None = None,
             parallelism_reward: ParallelismReward | None = None, audit_override: str | None = None) -> dict[str, Any]:
    return assemble_stage.assemble_datasets(data_dir, families, policy_id=policy_id, policy_version=policy_version,
                                            learnability=learnability, min_margin=min_margin,
                                            parallelism_reward=parallelism_reward, audit_override=audit_override)


@task(name="record-run", task_run_name="record-run", cache_policy=NO_CACHE, persist_result=False)
def record_run(data_dir: str, run: Run, spooled: list[str] | None = None) -> dict[str, int]:
    """The run's row; behind its own `spooled` batches where the spool holds them (landed with them)."""
    return land_run(data_dir, run, spooled=[Path(p) for p in spooled or []])


@flow(name="factory-family", flow_run_name="{family}", persist_result=False)
def family_pipeline(family: str, tasks_per_family: int, seed: int, policy: PolicySpec | str,
                    policy_kwargs: dict[str, Any] | None,
                    samples_per_task: int, batch_size: int | None = None, data_dir: str | None = None,
                    holdout_fraction: float = HOLDOUT_FRACTION, retry: RetryPolicy | None = None,
                    faults: FaultConfig | None = None, subagent: PolicySpec | None = None) -> quote:
    """One family, from task specs to scored rollouts (not yet landed), `quote()`d. Its task runs
    are named `<family> · <stage>`, the rollout batches `<family> · rollout i/n`; `batch_size`
    None: chosen from the work (`batch_size_for`). The episodes' seeds come from the task and
    sample, never the batch, so any batch size collects the same rollouts."""
    # The subflow run carries the family's tag (_run_families), its task runs do not: Prefect asks
    # its server for a concurrency slot for every tagged task run (about 3 s per 1,000-task run on
    # a loaded 2-core machine, tests/benchmarks/bench_factory.py).
    with TagsContext(current_tags=TagsContext.get().current_tags - {f"family:{family}"}):
        named = lambda t, stage: t.with_options(task_run_name=f"{family} · {stage}")  # noqa: E731
        generated = named(generate, "generate")(family, tasks_per_family, seed).unquote()
        valid, invalid = named(validate, "validate")(quote(generated), retry)
        isolated, leaked = named(isolate, "isolate")(quote(valid), data_dir, holdout_fraction)
        size = batch_size_for(len(isolated), runner_workers(), batch_size)
        batches = [isolated[i:i + size] for i in range(0, len(isolated), size)]
        progress.start(family, len(isolated) * samples_per_task)
        futures = [named(rollout_batch, f"rollout {i}/{len(batches)}").submit(
            Batch(batch), policy, policy_kwargs, samples_per_task, seed, retry, faults, subagent)
            for i, batch in enumerate(batches, 1)]
        meter = create_progress_artifact(0.0, key=f"{family.replace('_', '-')}-rollouts",
                                         description=f"{family}: rollout batches done (%)") if batches else None
        rollouts, error = batch_rollouts(
            futures, lambda done: update_progress_artifact(meter, 100.0 * done / len(batches)))
        progress.finish(family)
        scores = named(score, "score")(quote(rollouts), quote(isolated), data_dir).unquote() if rollouts else []
        out = {"tasks": isolated, "rejections": invalid + leaked, "rollouts": rollouts, "scores": scores,
               "error": error}
        _hand_over(out)
        # quote(): Prefect would walk every record of the returned value looking for futures
        return quote(out)


# Where a family subflow run by the factory puts its output as soon as it has it: Prefect then
# closes the subflow run, joining its heartbeat thread (up to a second), while the factory stages
# the family's rows (it registers them once every subflow run has ended well).
_handoff: contextvars.ContextVar[Future | None] = contextvars.ContextVar("family_handoff", default=None)


def _hand_over(out: dict[str, Any]) -> None:
    # a function, not inline in the flow: Dask pickles the flow by value, and a ContextVar does not pickle
    handoff = _handoff.get()
    if handoff is not None and not handoff.done():
        handoff.set_result(out)


def batch_rollouts(futures, on_done=None) -> tuple[list[Rollout], str | None]:
    """Every batch's rollouts, in batch order (`on_done(n)` after each of the n batches that
    finish, in the order they finish). A batch that used up the retry policy under
    `on_exhausted="fail"` gives those it collected up to the failure, and the first such error is
    returned, so the factory lands what completed before it fails the run. Any other failure
    propagates."""
    outs: dict[int, Any] = {}
    index = {id(f): i for i, f in enumerate(futures)}
    for done, future in enumerate(as_completed(futures), 1):
        outs[index[id(future)]] = future.result(raise_on_failure=False)
        if on_done is not None:
            on_done(done)
    rollouts: list[Rollout] = []
    error = None
    for i in range(len(futures)):
        out = outs[i]
        if isinstance(out, RetryExhausted):
            rollouts += out.rollouts
            error = error or str(out)
        elif isinstance(out, BaseException):
            raise out
        else:
            rollouts += out
    return rollouts, error


# Set by flows.loop.factory_then_train, the flow that acts on `train_after`: the factory alone never
# trains, so it refuses `train_after` rather than record it and hold back the run's artifacts for nothing.
TRAINING_AFTER: contextvars.ContextVar[bool] = contextvars.ContextVar("gymfoundry_training_after", default=False)
BATCHES_PER_WORKER = 2  # a worker that finishes early takes another batch; the progress artifact moves
MAX_BATCH = 500         # a crashed batch is retried whole: bound what one retry repeats


def batch_size_for(tasks: int, workers: int, given: int | None = None) -> int:
    """Tasks per rollout batch: `given`, else enough batches for every worker to take two and
    none over MAX_BATCH tasks (1,000 tasks on 2 workers: 4 batches of 250). Few batches keep
    Prefect's cost per task run out of the figures; the engine keeps a batch's episodes in flight."""
    if given is not None:
        return given
    batches = max(BATCHES_PER_WORKER * max(workers, 1), math.ceil(tasks / MAX_BATCH))
    return max(1, math.ceil(tasks / batches))


def runner_workers() -> int:
    """Batches the current flow's task runner runs at once: a Dask cluster's worker threads, else
    (threads, Ray) this machine's cores; `--batch-size` overrides what it leads to."""
    runner = FlowRunContext.get().task_runner
    client = getattr(runner, "client", None)  # DaskTaskRunner's, connected when the runner starts
    if client is not None and hasattr(client, "nthreads"):
        return max(1, sum(client.nthreads().values()))
    return os.cpu_count() or 1


def make_task_runner(name: str, max_workers: int | None = None, address: str | None = None):
    """`threads` (default, one machine), `dask` or `ray` (many machines; needs the extra): a local
    cluster of their own, or the existing one at `address` (Dask `tcp://host:8786`, Ray
    `ray://host:10001`)."""
    if name == "threads":
        if address:
            raise ValueError("the threads task runner takes no cluster address")
        return ThreadPoolTaskRunner(max_workers=max_workers)
    extras = {"dask": ("prefect_dask", "DaskTaskRunner"), "ray": ("prefect_ray", "RayTaskRunner")}
    if name not in extras:
        raise ValueError(f"unknown task runner {name!r}; use threads, dask or ray")
    module, cls = extras[name]
    try:
        runner = getattr(importlib.import_module(module), cls)
    except ImportError:
        raise ValueError(f"task runner {name!r} needs {module.replace('_', '-')}: "
                         f"pip install -e '.[{name}]'") from None
    return runner(address=address) if address else runner()


@flow(name="factory", persist_result=False)
@flow_parameters(FactoryConfig)
def factory(**params: Any) -> dict[str, Any]:
    """Run the whole factory and land everything in the warehouse under `data_dir`.

    The parameters are `flows.config.FactoryConfig`'s; the whole validated configuration is
    stored in `runs.params`. `policy` is a `PolicySpec` (scripted, a local checkpoint, an
    OpenAI-compatible endpoint, a registered custom kind; with its sampling knobs and
    `max_concurrency`), or a plain kind name; `mistake_rate` fills a scripted spec that sets none.
    Re-running with the same parameters lands nothing new (ids are content hashes). The families
    run concurrently, each a subflow named after it and tagged `family:<name>`. The retry policy is
    fixed for the run and stored with it; when it says fail, what completed lands, the run is
    recorded with status "failed" and its error, and the flow fails; so is a run any other stage
    fails (generation, validation, landing, assembly). Writers wait for a catalog another process
    holds and spool when the wait runs out (`gymfoundry.tasks.stages.land.land_or_spool`).

    Every dataset with rows that the warehouse did not hold before emits a `gymfoundry.dataset.ready`
    event (a run whose batch was spooled assembles none: the run that lands the spool does), which the
    `train-on-new-dataset` deployment is triggered by under a Prefect server. The factory never
    trains: `train_after` is recorded with the run, and `flows.loop.factory_then_train` (which runs
    this flow, then the training flow; `gymfoundry run --train-after`) acts on it."""
    config = FactoryConfig(**params)
    if config.train_after and not TRAINING_AFTER.get():
        raise ValueError(f"factory does not train: train_after={config.train_after!r} is for the factory-then-train "
                         "flow (flows/loop.py:factory_then_train, or `gymfoundry run --train-after`)")
    data_dir, families = config.data_dir, config.families
    # The warehouse does not record where it lives (a moved or copied data dir is the same data),
    # nor which cluster played it.
    params = config.model_dump(mode="json", exclude={"data_dir", "cluster_address"})
    # Refused inputs (a fraction the warehouse did not lock) start no run; from here on one is recorded.
    lock_holdout_fraction(data_dir, families, config.holdout_fraction)  # before any episode or landing
    logger = get_run_logger()
    record = RunRecord(data_dir, Run(params=params, retry_policy=config.retry, faults=config.faults,
                                     started_at=datetime.now(timezone.utc).isoformat(timespec="seconds")))
    try:
        return _factory(config, params, record, logger)
    except Exception as exc:  # whatever stage failed, the run is recorded, with why
        if not record.recorded:
            record.failed(exc)
        raise


class RunRecord:
    """A factory run's `runs` row, landed once whatever happens: `run` is the run as far as it got,
    `stamped` once its id is on rollouts, `spooled` the run's own batches the spool holds (the row
    then waits behind them, `gymfoundry.tasks.stages.land.land_run`)."""

    def __init__(self, data_dir: str, run: Run):
        self.data_dir, self.run, self.spooled, self.recorded, self.stamped = data_dir, run, [], False, False

    def land(self, run: Run) -> None:
        self.run = run
        self.run.finished_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        record_run(self.data_dir, self.run, [str(p) for p in self.spooled])
        self.recorded = True

    def failed(self, exc: BaseException) -> None:
        error = redact(f"{type(exc).__name__}: {exc}")
        if self.stamped:  # the row keeps the id its landed rollouts carry
            failed = self.run.model_copy(update={"status": "failed", "error": error})
        else:  # a failed run's own id: a later completed run of this configuration is recorded beside it
            failed = Run(**{**self.run.model_dump(exclude={"run_id"}), "status": "failed", "error": error})
        try:
            self.land(failed)
        except Exception as also:  # the run's own error is what the caller sees
            get_run_logger().error("could not record the failed run %s: %s", self.run.run_id, also)


def _factory(config: FactoryConfig, params: dict[str, Any], record: RunRecord, logger) -> dict[str, Any]:
    data_dir, families = config.data_dir, config.families
    spec = config.collecting_policy()
    pipeline = family_pipeline.with_options(task_runner=make_task_runner(config.task_runner,
                                                                         address=config.cluster_address))
    staged: list[Staged] = []
    try:
        with _family_runs(pipeline, families, data_dir, dict(
                tasks_per_family=config.tasks_per_family, seed=config.seed, policy=spec, policy_kwargs=None,
                samples_per_task=config.samples_per_task, batch_size=config.batch_size,
                holdout_fraction=config.holdout_fraction, retry=config.retry, faults=config.faults,
                subagent=config.subagent)) as outs:
            errors = [f"{family}: {out['error']}" for family, out in zip(families, outs) if out["error"]]
            error = errors[0] if errors else None
            # the run's id, which its rollouts carry (a failed run's differs from the completed one's)
            record.run = Run(params=params, retry_policy=config.retry, faults=config.faults,
                             started_at=record.run.started_at, status="failed" if error else "completed",
                             error=error)
            run_id, record.stamped = record.run.run_id, True
            # the costly, invisible part of landing, while Prefect closes the subflow runs
            staged = _stage_families(data_dir, families, outs, run_id, flow_run.id)
        # every subflow run ended well: only now does anything land
        landed, rollouts, quarantined = _land_families(data_dir, families, outs, run_id, flow_run.id, staged,
                                                       record.spooled)
    finally:
        for batch in staged:  # landed already, or never to land
            batch.discard()
    run = record.run.model_copy(update={"landed": landed, "quarantined": quarantined,
                                        **run_counts(rollouts, config.retry)})
    if error:
        record.land(run)
        raise RetryExhausted(f"run {run.run_id} failed: {error}. What completed landed "
                             f"({', '.join(f'{k}={v}' for k, v in sorted(landed.items()))}) and the failed run "
                             f"is recorded in `runs`; no dataset was assembled")
    record.run = run
    audits, datasets, announced = {}, {}, []
    if record.spooled:
        # Assembling now would build the warehouse's datasets without this run's rows (the ones an
        # earlier run built and announced): the run that lands the spool assembles and announces them.
        logger.error("DEFERRED: %d batch(es) of this run wait in the spool; no dataset is assembled or announced "
                     "by this run (the run that lands them does)", len(record.spooled))
    else:
        audits, datasets, announced = _assemble(data_dir, families, config, rollouts)
    record.land(run)
    if quarantined:
        logger.error("QUARANTINED: %d batch(es) failed the quality gates: %s", len(quarantined), quarantined)
    for kind in announced:
        announce_dataset(kind, datasets[kind], data_dir, run.run_id)
    dataset_ids = [d["dataset_id"] for d in datasets.values()]
    # Recorded and announced whatever the report does next. Its artifacts read the warehouse now and
    # are drawn and created while the summary and the markdown report are made; they exist before the
    # run ends, and a failure to publish them fails it. A run that trains (train_after) leaves them
    # to the flow that trains (flows.loop.factory_then_train): its training-runs table lists the run.
    with nullcontext() if config.train_after else publishing_run_artifacts(data_dir, families, run.run_id,
                                                                             dataset_ids):
        report = {"data_dir": str(Path(data_dir).resolve()), "landed": landed, "datasets": datasets, "audits": audits,
                  "summary": assemble_stage.summary(data_dir, families), "run": run.model_dump(mode="json"),
                  "quarantined": quarantined, "spooled": [str(p) for p in record.spooled], "announced": announced}
        create_markdown_artifact(key="factory-report", markdown=render_report(report),
                                 description="Factory run: landed rows, datasets and outcomes")
    return report


def _assemble(data_dir: str, families: list[str], config: FactoryConfig,
              rollouts: list[Rollout]) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(audits, datasets, the kinds to announce: those with rows whose dataset is new in the warehouse).
    A catalog another process holds past the writers' wait defers the datasets to the next run (they
    are built from what the warehouse holds then); AuditRefused fails the run (what landed stays)."""
    # The curriculum measures this run's policy (a checkpoint: its weights' fingerprint).
    policies = {(r.policy_id, r.policy_version) for r in rollouts}
    policy_id, policy_version = policies.pop() if len(policies) == 1 else (None, None)
    try:
        before = landed_dataset_ids(data_dir)
        audits = audit(data_dir, families, config.audit_episodes)
        datasets = assemble(data_dir, families, policy_version, config.learnability, config.min_margin, policy_id,
                            config.parallelism_reward, config.audit_override)
    except CatalogLocked as exc:
        get_run_logger().error("DEFERRED: no dataset assembled (%s); the next run assembles what landed", exc)
        return {}, {}, []
    return audits, datasets, [k for k, d in datasets.items() if d["rows"] and d["dataset_id"] not in before]


def landed_dataset_ids(data_dir: str) -> set[str]:
    """The datasets the warehouse holds: assembling what it already held builds the same ids, announced before."""
    if not (Path(data_dir) / CATALOG_FILE).exists():
        return set()
    with Warehouse(data_dir, read_only=True) as wh:
        return {r["dataset_id"] for r in wh.sql("SELECT dataset_id FROM datasets").to_pylist()}


@contextmanager
def _family_runs(pipeline, families: list[str], data_dir: str, options: dict[str, Any]):
    """Every family's subflow (`pipeline(family, data_dir=..., **options)`), run concurrently,
    each in a thread and tagged `family:<name>`; yields their outputs in the order of `families`
    as soon as every subflow has handed its output over (`_handoff`), so the body overlaps the
    subflow runs' closing. On exit it waits for those runs to end and raises what any raised."""
    handoffs = [Future() for _ in families]

    def one(family: str, handoff: Future) -> dict[str, Any]:
        _handoff.set(handoff)
        with tags(f"family:{family}"):
            return pipeline(family, data_dir=data_dir, **options).unquote()

    # Each thread runs in a copy of this flow's context (taken here, in the flow's thread), so each
    # family's subflow is a child of this run, against the same API and settings.
    contexts = [contextvars.copy_context() for _ in families]
    with ThreadPoolExecutor(max_workers=len(families), thread_name_prefix="family") as pool:
        runs = [pool.submit(context.run, one, family, handoff)
                for context, family, handoff in zip(contexts, families, handoffs)]
        outs = []
        for handoff, run in zip(handoffs, runs):
            wait((handoff, run), return_when=FIRST_COMPLETED)
            outs.append(handoff.result() if handoff.done() else run.result())
        yield outs
        for run in runs:
            run.result()


def _stage_families(data_dir: str, families: list[str], outs: list[dict[str, Any]], run_id: str,
                    flow_run_id: str | None) -> list[Staged]:
    return [stage.with_options(task_run_name=f"{family} · stage")(
        data_dir, quote(out["tasks"]), quote(out["rejections"]), quote(out["rollouts"]), quote(out["scores"]),
        run_id, str(flow_run_id) if flow_run_id else None).unquote() for family, out in zip(families, outs)]


def _land_families(data_dir: str, families: list[str], outs: list[dict[str, Any]], run_id: str,
                   flow_run_id: str | None, staged: list[Staged],
                   spooled: list[Path]) -> tuple[dict[str, int], list[Rollout], list[str]]:
    """Each family's records (`staged` by `_stage_families`) landed in turn by this one process (a
    family whose retry policy said fail lands what it completed): (rows landed per table,
    rollouts, quarantined batches); the batches the spool took are added to `spooled`."""
    logger = get_run_logger()
    landed: dict[str, int] = {}
    rollouts: list[Rollout] = []
    quarantined: list[str] = []
    for family, out, batch in zip(families, outs, staged):
        landing = land.with_options(task_run_name=f"{family} · land")(
            data_dir, quote(out["tasks"]), quote(out["rejections"]), quote(out["rollouts"]), quote(out["scores"]),
            run_id, str(flow_run_id) if flow_run_id else None, quote(batch))
        for table, n in landing["counts"].items():
            landed[table] = landed.get(table, 0) + n
        quarantined += [q for q in (landing["quarantine"], landing["refused"]) if q]
        if landing["spooled"]:
            spooled.append(Path(landing["spooled"]))
        rollouts += out["rollouts"]
        logger.info("%s: %d tasks kept, %d rejected, %d rollouts", family, len(out["tasks"]),
                    len(out["rejections"]), len(out["rollouts"]))
    return landed, rollouts, quarantined


DATASET_READY = "gymfoundry.dataset.ready"


def announce_dataset(kind: str, dataset: dict[str, Any], data_dir: str, run_id: str):
    """The event a downstream training deployment is triggered by (deployments/prefect.yaml)."""
    return emit_event(
        event=DATASET_READY,
        resource={"prefect.resource.id": f"gymfoundry.dataset.{dataset['dataset_id']}",
                  "gymfoundry.dataset.kind": kind},
        payload={"dataset_id": dataset["dataset_id"], "kind": kind, "rows": dataset["rows"],
                 "path": dataset["path"], "data_dir": str(Path(data_dir).resolve()), "run_id": run_id})


def describe_retry(policy: dict[str, Any]) -> str:
    """A retry policy as a sentence (the run report's)."""
    return (f"{', '.join(policy['retry_on'])} retried up to {policy['max_retries']} times (backoff "
            f"{policy['backoff_s']:g} s × {policy['backoff_factor']:g}, at most {policy['max_backoff_s']:g} s), "
            f"then {policy['on_exhausted']}")


def render_report(report: dict[str, Any]) -> str:
    lines = [f"# Factory run\n\nData: `{report['data_dir']}`\n", "| family | termination | rollouts |",
             "|---|---|---|"]
    lines += [f"| {r['task_family']} | {r['termination']} | {r['rollouts']} |" for r in report["summary"]]
    lines += ["", "Landed: " + ", ".join(f"{k}={v}" for k, v in report["landed"].items())]
    lines += [f"Dataset `{d['dataset_id']}`: {d['rows']} rows at `{d['path']}`" for d in report["datasets"].values()]
    run = report["run"]
    lines += ["", f"Run `{run['run_id']}`: {run['attempted']} rollouts attempted, {run['retries']} retries, "
                  f"{run['skips']} skipped; by class: " + ", ".join(f"{k}={v}" for k, v in run["by_class"].items()),
              "Retry policy: " + describe_retry(run["retry_policy"])]
    lines += [f"**QUARANTINED** batch: `{q}`" for q in report["quarantined"]]
    return "\n".join(lines)
