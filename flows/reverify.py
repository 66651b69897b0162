"""The `reverify` flow: stored rollouts judged again by the current outcome verifier of their
env, without re-running the policy (tasks/ops/reverify.py), landed beside the older verdicts.

Verdicts are keyed by (rollout, verifier, version) in `outcomes`, so a re-verification under a
new verifier version lands beside the factory's verdict and one under an unchanged version
lands nothing, as `rescore` does for step scores."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from gymfoundry.envs.records import Rollout, TaskSpec
from gymfoundry.flows.defaults import DEFAULT_DATA_DIR
from gymfoundry.tasks.stages.land import land_or_spool
from gymfoundry.tasks.ops.reverify import Reverified, load_stored, plan, reverify_rollouts, summary, utcnow
from gymfoundry.warehouse import Warehouse


@task(name="reverify-batch", cache_policy=NO_CACHE)
def reverify_batch(rollouts: list[Rollout], tasks: dict[str, TaskSpec], verified_at: str) -> Reverified:
    return reverify_rollouts(rollouts, tasks, verified_at)


@flow(name="reverify")
def reverify(data_dir: str = DEFAULT_DATA_DIR, families: list[str] | None = None, where: str | None = None,
             batch_size: int = 100) -> dict[str, Any]:
    """Re-verify the stored rollouts of `families` (and `where`, a filter on the rollouts view)
    under each env's current outcome verifier, replaying their calls; land the verdicts whose
    (verifier, version) is new, and the factory's own verdict of rollouts that lack it."""
    logger = get_run_logger()
    verified_at = utcnow()
    with Warehouse(data_dir, read_only=True) as wh:
        stored = load_stored(wh, families, where)
    todo = plan(stored, verified_at)
    batches = [todo.pending[i:i + batch_size] for i in range(0, len(todo.pending), batch_size)]
    started = time.perf_counter()
    futures = [reverify_batch.submit(quote(batch), quote({r.task_id: stored.tasks[r.task_id] for r in batch}),
                                     verified_at) for batch in batches]
    runs = [f.result() for f in futures]
    wall_s = time.perf_counter() - started
    verdicts = [v for run in runs for v in run.verdicts]
    faults = [f for run in runs for f in run.faults]
    landed = {"outcomes": 0}
    if todo.backfill or verdicts:
        # waited for and spooled like every writer's ({} when spooled: the next landing lands them)
        landed = land_or_spool(data_dir, {"outcomes": todo.backfill + verdicts}).checked()
    errors = [v for v in verdicts if v.error]
    report = {
        "data_dir": data_dir, "rollouts": len(stored.rollouts), "already_verified": todo.already,
        "backfilled": len(todo.backfill), "reverified": len(verdicts), "landed": landed,
        "changed": changed(stored.rollouts, verdicts),
        "verifier_errors": len(errors), "first_verifier_errors": [f"{v.rollout_id}: {v.error}" for v in errors][:5],
        "faults": len(faults), "first_faults": faults[:5],
        "unverifiable": dict(todo.unverifiable),
        "verify_seconds": round(wall_s, 3),  # wall time of the batches (they run concurrently)
        "rollouts_per_s": round(len(verdicts) / wall_s, 1) if verdicts and wall_s > 0 else None,
        "versions": summary(todo.backfill + verdicts),
    }
    if errors:
        logger.warning("the verifier raised on %d rollouts (landed as verifier_error): %s", len(errors),
                       report["first_verifier_errors"])
    if faults:
        logger.warning("the grader's environment failed on %d rollouts (not landed; the next reverify retries "
                       "them): %s", len(faults), faults[:5])
    logger.info("re-verified %d of %d rollouts (%d already verified at the current version): %d new outcome rows",
                len(verdicts), len(stored.rollouts), todo.already, landed.get("outcomes", 0))
    create_markdown_artifact(key="reverify-report", markdown=render_reverify(report),
                             description="Re-verified rollouts: verdicts per verifier version")
    return report


def changed(rollouts: list[Rollout], verdicts: list) -> int:
    """Re-verified rollouts whose class differs from the one they were stored with."""
    stored = {r.rollout_id: r.termination for r in rollouts}
    return sum(stored.get(v.rollout_id) != v.termination for v in verdicts)


def render_reverify(report: dict[str, Any]) -> str:
    lines = [f"# Re-verify\n\n{report['rollouts']} rollouts: {report['reverified']} re-verified, "
             f"{report['already_verified']} already verified at the current version, {report['backfilled']} "
             f"factory verdicts backfilled; {report['landed'].get('outcomes', 0)} new outcome rows; "
             f"{report['changed']} changed class; {report['verifier_errors']} verifier errors.\n",
             "| verifier | version | source | termination | rollouts |", "|---|---|---|---|---|"]
    lines += [f"| {v['verifier_id']} | `{v['verifier_version']}` | {v['source']} | {v['termination']} | "
              f"{v['rollouts']} |" for v in report["versions"]]
    return "\n".join(lines)

