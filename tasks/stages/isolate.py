"""Stage 3: isolation. Dedupe by content hash, assign splits by `template_id` group so
near-duplicates never straddle splits, lock a holdout set per family, and scan visible text
(goals, observations, dataset rows) for hidden values.

`assign_split` is the one split authority: every path that picks tasks or text for training
or evaluation (isolation, dataset assembly, the base model's tokenizer text, GRPO's tasks, a
dataset handed to `train`) asks it, with the splits the warehouse recorded (`recorded_splits`).
The holdout is locked twice over: a new template's holdout membership is a pure function of
(family, template_id, fraction), and once a template has landed, its split is read back from
the warehouse and never reassigned, whatever the fractions become later."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gymfoundry.envs.leaks import find_leaks, hidden_values  # the rule's owner; re-exported for callers
from gymfoundry.envs.family import family
from gymfoundry.envs.records import HoldoutLock, Rollout, Split, TaskRejection, TaskSpec, TrainingRow
from gymfoundry.tasks.stages.land import land_or_spool
from gymfoundry.warehouse import CATALOG_FILE, Warehouse

SPLIT_FRACTIONS = {Split.train: 0.8, Split.val: 0.1, Split.test: 0.1}
HOLDOUT_FRACTION = 0.1  # of each family's template groups, before the other splits


def _bucket(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def _hashed_split(template_id: str, fractions: dict[Split, float] = SPLIT_FRACTIONS) -> Split:
    """Deterministic split of a template group (uniform hash bucket); only `assign_split` asks."""
    bucket = _bucket(template_id)
    edge = 0.0
    for split, fraction in fractions.items():
        edge += fraction
        if bucket <= edge:
            return split
    return list(fractions)[-1]


def in_holdout(family: str, template_id: str, fraction: float = HOLDOUT_FRACTION) -> bool:
    return _bucket(f"holdout:{family}:{template_id}") < fraction


def assign_split(task: TaskSpec, known: Mapping[str, Split] | None = None,
                 holdout_fraction: float | Mapping[str, float] = HOLDOUT_FRACTION) -> Split:
    """The split of `task`. A task marked holdout stays there; a template the warehouse recorded
    keeps its recorded split (`known`: template_id -> split, see `recorded_splits`); a new
    template goes to the holdout by its hash, else to a hashed split."""
    if task.split == Split.holdout:
        return Split.holdout
    if known and task.template_id in known:
        return Split(known[task.template_id])
    fraction = holdout_fraction if isinstance(holdout_fraction, (int, float)) \
        else holdout_fraction.get(task.family, HOLDOUT_FRACTION)
    if in_holdout(task.family, task.template_id, fraction):
        return Split.holdout
    return _hashed_split(task.template_id)


def tasks_of_split(tasks: Iterable[TaskSpec], split: Split, known: Mapping[str, Split] | None = None,
                   holdout_fraction: float | Mapping[str, float] = HOLDOUT_FRACTION) -> list[TaskSpec]:
    """The tasks `assign_split` puts in `split`, in their order."""
    return [t for t in tasks if assign_split(t, known, holdout_fraction) == Split(split)]


class HoldoutError(ValueError):
    """A training input names a task outside the train split."""


def refuse_non_train(tasks: Iterable[TaskSpec], known: Mapping[str, Split] | None, what: str,
                     holdout_fraction: float | Mapping[str, float] = HOLDOUT_FRACTION) -> None:
    """Raise when any of `tasks` is not a train task: a training input must not carry the holdout
    (nor the val/test tasks evaluation uses)."""
    bad = [(t.task_id, t.template_id, split.value) for t in tasks
           if (split := assign_split(t, known, holdout_fraction)) != Split.train]
    if bad:
        raise HoldoutError(f"{what} holds {len(bad)} task(s) outside the train split, refused "
                           f"(task, template, split): {bad[:5]}")


def isolate_tasks(tasks: list[TaskSpec], known_splits: Mapping[str, Split] | None = None,
                  holdout_fraction: float | Mapping[str, float] = HOLDOUT_FRACTION,
                  ) -> tuple[list[TaskSpec], list[TaskRejection]]:
    """Kept tasks with their split, and the rejections with reasons. `known_splits`
    (template_id -> split) holds the splits already landed (see `landed_splits`)."""
    kept: dict[str, TaskSpec] = {}
    rejected: list[TaskRejection] = []
    for task in tasks:
        if task.task_id in kept:
            rejected.append(TaskRejection(task_id=task.task_id, family=task.family, stage="isolate",
                                          reason="duplicate content hash"))
            continue
        leaks = find_leaks(task, [_first_observation(task)])
        if leaks:
            rejected.append(TaskRejection(task_id=task.task_id, family=task.family, stage="isolate",
                                          reason=f"hidden value visible in the goal: {leaks}"))
            continue
        kept[task.task_id] = task.model_copy(update={"split": assign_split(task, known_splits, holdout_fraction)})
    return list(kept.values()), rejected


# When the tasks of one template were recorded under several splits (a bug, an import), the
# strictest wins: a template ever held out is never trained on.
STRICTNESS = (Split.holdout, Split.test, Split.val, Split.train)


def recorded_splits(wh, families: list[str] | None = None) -> dict[str, Split]:
    """template_id -> split of the tasks an open warehouse holds (the strictest where they differ)."""
    where = "" if families is None else "WHERE task_family IN (SELECT unnest(?))"
    rows = wh.sql(f"SELECT DISTINCT template_id, split FROM tasks {where}",
                  None if families is None else [families]).to_pylist()
    out: dict[str, Split] = {}
    for row in rows:
        split, current = Split(row["split"]), out.get(row["template_id"])
        if current is None or STRICTNESS.index(split) < STRICTNESS.index(current):
            out[row["template_id"]] = split
    return out


def recorded_holdout_fractions(wh) -> dict[str, float]:
    """family -> the holdout fraction of the factory runs that an open warehouse recorded for it (the
    largest, where runs differed). A template not landed yet is held out by this fraction wherever
    training picks tasks or text, so what training saw is never held out by a later run."""
    out: dict[str, float] = {}
    for row in wh.sql("SELECT family, holdout_fraction FROM holdout_locks").to_pylist():
        out[row["family"]] = max(out.get(row["family"], 0.0), row["holdout_fraction"])
    for row in wh.sql("SELECT params FROM runs").to_pylist():  # runs landed before locks were kept
        params = json.loads(row["params"]) if isinstance(row["params"], str) else (row["params"] or {})
        fraction = params.get("holdout_fraction")
        if isinstance(fraction, (int, float)) and not isinstance(fraction, bool):
            for family in params.get("families") or []:
                out[family] = max(out.get(family, 0.0), float(fraction))
    return out


def landed_holdout_fractions(data_dir: str | Path | None) -> dict[str, float]:
    """`recorded_holdout_fractions` of the warehouse under `data_dir` (none if it does not exist yet)."""
    if data_dir is None or not (Path(data_dir) / CATALOG_FILE).exists():
        return {}
    with Warehouse(data_dir, read_only=True) as wh:
        return recorded_holdout_fractions(wh)


def check_holdout_fraction(data_dir: str | Path | None, families: Iterable[str], fraction: float) -> None:
    """A warehouse locks each family's holdout fraction with its first run: another fraction would hold
    out templates that training (the tokenizer text, GRPO's live tasks) already took as train. A
    fraction outside [0, 1] (NaN, negative: no holdout at all, silently) is refused too."""
    if isinstance(fraction, bool) or not (isinstance(fraction, (int, float)) and 0.0 <= fraction <= 1.0):
        raise ValueError(f"holdout fraction {fraction!r} refused: it must be a number in [0, 1]")
    locked = landed_holdout_fractions(data_dir)
    clash = {f: locked[f] for f in families if f in locked and locked[f] != fraction}
    if clash:
        raise ValueError(f"holdout fraction {fraction} refused: the warehouse under {data_dir} locked "
                         f"{', '.join(f'{f}={v}' for f, v in sorted(clash.items()))}; run with that fraction or "
                         "use a new data dir")


def lock_holdout_fraction(data_dir: str | Path, families: Iterable[str], fraction: float) -> None:
    """Check the fraction (`check_holdout_fraction`), then lock it for `families` in the warehouse
    under `data_dir` before anything of the run lands. A catalog held by another process (a notebook)
    is not waited for here: the lock is spooled at once, and the run's first landing (which waits,
    then spools in turn) lands it before the run's own rows."""
    check_holdout_fraction(data_dir, families, fraction)
    locks = [HoldoutLock(family=f, holdout_fraction=fraction) for f in sorted(set(families))]
    land_or_spool(str(data_dir), {"holdout_locks": locks}, lock_timeout_s=0).checked()


def landed_splits(data_dir: str | Path | None, families: list[str] | None = None) -> dict[str, Split]:
    """`recorded_splits` of the warehouse under `data_dir` (none if it does not exist yet)."""
    if data_dir is None or not (Path(data_dir) / CATALOG_FILE).exists():
        return {}
    with Warehouse(data_dir, read_only=True) as wh:
        return recorded_splits(wh, families)


def refuse_non_train_ids(task_ids: Iterable[str], data_dir: str | Path, what: str) -> None:
    """`refuse_non_train` for a training input that names its tasks by id (a dataset file): the
    tasks the warehouse under `data_dir` holds are checked; ids it does not hold cannot be."""
    ids = sorted(set(task_ids))
    if not ids or not (Path(data_dir) / CATALOG_FILE).exists():
        return
    with Warehouse(data_dir, read_only=True) as wh:
        tasks = wh.load_tasks("task_id IN (SELECT unnest(?))", [ids])
        known, fractions = recorded_splits(wh), recorded_holdout_fractions(wh)
    refuse_non_train(tasks, known, what, fractions)


def _first_observation(task: TaskSpec) -> str:
    env = family(task.env_id).make(verified=False)
    try:
        return env.reset(task=task).observation
    finally:
        env.close()


class LeakError(RuntimeError):
    pass


def assert_no_leaks(rollouts: list[Rollout], tasks: dict[str, TaskSpec]) -> None:
    """Every observation the agent saw is scanned; a leak is an environment bug, so it stops the run."""
    for rollout in rollouts:
        texts = [s.observation for s in rollout.steps] + [s.result for s in rollout.steps]
        leaks = find_leaks(tasks[rollout.task_id], texts)
        if leaks:
            raise LeakError(f"rollout {rollout.rollout_id} of task {rollout.task_id} shows hidden values {leaks}")


def row_texts(value: Any) -> Iterable[str]:
    """Every string inside a dataset row (message contents, tool-call arguments, tools)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from row_texts(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from row_texts(v)


def assert_no_leaks_in_rows(rows: list[dict[str, Any]], tasks: Mapping[str, TaskSpec]) -> None:
    """A dataset row showing a hidden value of its task stops the assembly."""
    for row in rows:
        leaks = find_leaks(tasks[row["task_id"]], row_texts(row))
        if leaks:
            raise LeakError(f"dataset row of task {row['task_id']} shows hidden values {leaks}")


def dedupe_rows(rows: list[TrainingRow]) -> tuple[list[TrainingRow], int]:
    """Rows with a new content hash (`row.content_id()`), and how many were dropped. Each kept row
    gets its hash as `row_id`."""
    seen: set[str] = set()
    kept = []
    for row in rows:
        row_id = row.content_id()
        if row_id not in seen:
            seen.add(row_id)
            kept.append(row.model_copy(update={"row_id": row_id}))
    return kept, len(rows) - len(kept)
