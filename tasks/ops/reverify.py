"""Stage: re-verify stored rollouts under the current outcome verifier, without the policy.

Each stored rollout's steps are handed to the CURRENT outcome verifier of its env
(`gymfoundry.envs.family.family(env_id).outcome_verifier`), which replays the stored tool calls from the task's initial
state (a verifier's `verify` without `final_state`); the policy never runs again. The verdict
lands in `outcomes` keyed by (rollout_id, verifier_id, verifier_version), beside the factory's
own verdict (the rollout's `outcome`, landed with it; backfilled here for rollouts landed before
`outcomes` existed), so every version stays queryable side by side.

- Idempotent: a rollout whose verdict at the current verifier version is landed is skipped (the
  factory's own verdict counts: re-verifying under an unchanged version lands nothing).
- The class a verdict implies comes from `gymfoundry.tasks.rollout.classify.classify`, given the episode's end as
  the stored rollout records it (an env fault or bug, a policy error, a time limit or a truncation
  outranks any verdict, as it did when the episode ran) and the new verdict.
- A verifier that raises is the grader's failure: a `verifier_error` verdict with the error,
  never a model failure. An `EnvFault` from the grader (its sandbox could not start) is an
  environment fault: nothing lands for that rollout and the next `reverify` tries it again.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Sequence

from gymfoundry.envs.errors import EnvFault
from gymfoundry.envs.records import Rollout, TaskSpec, Termination, Verdict
from gymfoundry.envs.errors import UnknownEnv
from gymfoundry.envs.family import family
from gymfoundry.envs.secrets import redact
from gymfoundry.envs.timestep import EpisodeEnd
from gymfoundry.tasks.rollout.classify import classify
from gymfoundry.warehouse.catalog import quote_literal

# Classes the episode's own end can decide before any verdict (classify's order): the stored
# rollout says which one, and it is kept whatever a later verifier says.
_BEFORE_VERDICT = frozenset({Termination.env_bug, Termination.env_fault, Termination.policy_error,
                             Termination.inference_fault,
                             Termination.timeout, Termination.truncated})
REASON_CHARS = 2000  # as tasks.rollout.episodes stores a termination reason


@dataclass
class Stored:
    """What re-verification reads from a warehouse: rollouts (steps included), their tasks, and
    the (rollout_id, verifier_id, verifier_version) keys already in `outcomes`."""

    rollouts: list[Rollout]
    tasks: dict[str, TaskSpec]
    landed: set[tuple[str, str, str]]


@dataclass
class Plan:
    backfill: list[Verdict]                 # the factory's own verdicts not yet in `outcomes`
    pending: list[Rollout]                  # to re-verify under their env's current verifier
    already: int = 0                        # rollouts whose verdict at the current version is landed
    unverifiable: Counter = field(default_factory=Counter)  # reason -> rollouts left out


@dataclass
class Reverified:
    verdicts: list[Verdict]                 # to land
    faults: list[str] = field(default_factory=list)   # rollout_id: why (not landed; retried next time)
    seconds: float = 0.0


def rollout_filter(families: Sequence[str] | None, where: str | None) -> str | None:
    """A filter on the rollouts view: the families (quoted here) and `where` (SQL, as given). The
    rescore flow selects its rollouts with it too."""
    parts = []
    if families:
        parts.append("task_family in (" + ", ".join(quote_literal(f) for f in families) + ")")
    if where:
        parts.append(f"({where})")
    return " and ".join(parts) or None


def load_stored(warehouse: Any, families: Sequence[str] | None = None, where: str | None = None) -> Stored:
    """The stored rollouts of `families` (and `where`, a filter on the rollouts view), their tasks
    and the verdict keys landed for them, from an open `Warehouse` (read-only is enough)."""
    condition = rollout_filter(families, where)
    subquery = "select rollout_id from rollouts" + (f" where {condition}" if condition else "")
    rollouts = warehouse.load_rollouts(condition)
    tasks = warehouse.load_tasks(f"task_id in (select task_id from rollouts where rollout_id in ({subquery}))")
    rows = warehouse.sql("select rollout_id, verifier_id, verifier_version from outcomes "
                         f"where rollout_id in ({subquery})").to_pylist()
    landed = {(r["rollout_id"], r["verifier_id"], r["verifier_version"]) for r in rows}
    return Stored(rollouts, {t.task_id: t for t in tasks}, landed)


def current_verifier(env_id: str) -> Any:
    """The env's outcome verifier as registered now, or None (no verifier, or no such env)."""
    try:
        return family(env_id).outcome_verifier
    except UnknownEnv:
        return None


def plan(stored: Stored, verified_at: str | None = None) -> Plan:
    """Which factory verdicts to backfill and which rollouts to re-verify."""
    verified_at = verified_at or utcnow()
    landed = set(stored.landed)
    out = Plan(backfill=[], pending=[])
    for rollout in stored.rollouts:
        original = Verdict.of_rollout(rollout, verified_at)
        if original is not None and key(original) not in landed:
            out.backfill.append(original)
            landed.add(key(original))
        verifier = current_verifier(rollout.env_id)
        if verifier is None:
            out.unverifiable["no outcome verifier registered for its env"] += 1
        elif rollout.task_id not in stored.tasks:
            out.unverifiable["its task is not in the warehouse"] += 1
        elif (rollout.rollout_id, verifier.verifier_id, verifier.version) in landed:
            out.already += 1
        else:
            out.pending.append(rollout)
    return out


def reverify_rollouts(rollouts: Sequence[Rollout], tasks: dict[str, TaskSpec],
                      verified_at: str | None = None) -> Reverified:
    """Re-verify each rollout under its env's current verifier (rollouts whose env has none are
    left out). One verifier crash never stops the others."""
    started = time.perf_counter()
    verified_at = verified_at or utcnow()
    out = Reverified(verdicts=[])
    for rollout in rollouts:
        verifier = current_verifier(rollout.env_id)
        if verifier is None:
            continue
        try:
            out.verdicts.append(reverify_rollout(rollout, tasks[rollout.task_id], verifier, verified_at))
        except EnvFault as exc:
            out.faults.append(f"{rollout.rollout_id}: environment fault {type(exc).__name__}: {exc}")
    out.seconds = time.perf_counter() - started
    return out


def reverify_rollout(rollout: Rollout, task: TaskSpec, verifier: Any, verified_at: str) -> Verdict:
    """The verdict of `verifier` on the stored rollout: its calls replayed, never the policy.
    Raises EnvFault where the grader's environment failed (nothing to record as a verdict)."""
    error = outcome = None
    try:
        outcome = verifier.verify(task, list(rollout.steps))
    except EnvFault:
        raise
    except Exception as exc:  # the grader's own failure, never the model's
        error = redact(f"verifier raised {type(exc).__name__}: {exc}")[:REASON_CHARS]
    end, causes = episode_end(rollout)
    termination, reason = classify(rollout.steps, end, outcome=outcome, verifier_error=error, **causes)
    return Verdict(rollout_id=rollout.rollout_id, task_id=rollout.task_id, family=rollout.family,
                   verifier_id=verifier.verifier_id, verifier_version=str(verifier.version), source="reverify",
                   outcome=outcome, termination=termination, termination_reason=redact(reason)[:REASON_CHARS],
                   error=error, verified_at=verified_at)


def episode_end(rollout: Rollout) -> tuple[EpisodeEnd, dict[str, str]]:
    """classify's inputs about how the episode ended, as far as the stored rollout records them:
    the class it was given before any verdict (an env fault or bug raised by the env, a policy
    error, a time limit, a truncation) with its reason, or a normal end: the end, and the causes
    (classify's keyword arguments). A stored env_fault or timeout that the stored verdict itself
    implied is a normal end (the new verdict decides)."""
    termination, reason = rollout.termination, rollout.termination_reason
    normal = EpisodeEnd(terminated=True)
    if termination not in _BEFORE_VERDICT:
        return normal, {}
    if rollout.outcome is not None:
        implied, implied_reason = classify(rollout.steps, normal, outcome=rollout.outcome)
        if implied == termination and redact(implied_reason)[:REASON_CHARS] == reason:
            return normal, {}
    if termination == Termination.env_bug:
        return normal, {"env_bug": reason}
    if termination == Termination.env_fault:
        return normal, {"env_error": reason}
    if termination == Termination.policy_error:
        return normal, {"policy_error": reason}
    if termination == Termination.inference_fault:
        return normal, {"inference_fault": reason}
    if termination == Termination.timeout:
        return EpisodeEnd(terminated=True, clock=Termination.timeout.value, reason=reason), {}
    return EpisodeEnd(truncated=True, reason=reason), {}


def key(verdict: Verdict) -> tuple[str, str, str]:
    return verdict.rollout_id, verdict.verifier_id, verdict.verifier_version


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def summary(verdicts: Sequence[Verdict]) -> list[dict[str, Any]]:
    """Rows per (verifier, version, source, termination), for reports."""
    counts = Counter((v.verifier_id, v.verifier_version, v.source, v.termination.value) for v in verdicts)
    return [{"verifier_id": vid, "verifier_version": version, "source": source, "termination": t, "rollouts": n}
            for (vid, version, source, t), n in sorted(counts.items())]
