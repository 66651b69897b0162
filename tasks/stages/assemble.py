"""Stage: assemble curriculum-weighted training datasets from the warehouse.

- **SFT**: TRL conversational rows (`messages`, `tools` as a JSON string, tool-call arguments
  as JSON strings) of verified successes, with the PRM reward of each assistant turn
  (`step_rewards`) and the assistant turns whose reward is negative (`masked_turns`: a success
  can still over-reserve and then release; those turns stay in the conversation as context and
  are kept out of the loss).
- **DPO**: `prompt` / `chosen` / `rejected` message lists from the same task, each side ending
  on an assistant turn (a trailing tool result would be scored as if the model wrote it).
  Successes are compared by their verdicts alone (`verdict_beats`), never by step rewards: a
  mean step reward favours the shortest success, so a 1-step blind ending outranked every success
  that gathered the evidence. Only the task's best successes (none beats them on the verdict)
  are ever chosen. Trajectory pairs: the task's best success (the first of them by value:
  success + mean step reward) against each model failure whose value is at least `min_margin`
  lower. Verdict pairs: a best success against each other success it beats on the verdict;
  two successes with the same verdict are never paired. Step pairs: a best success and a model
  failure that made the same calls and saw the same results up to step k, then diverged; the
  prompt is that shared prefix, chosen and rejected are their step-k turns (kept when the step
  reward of chosen is at least `min_step_margin` above rejected's).
- **GRPO**: one prompt row per task, with the env id and the generator seed and level that
  recreate the task (`family(env_id).generate(seed, level)`), for online RL.

Only train tasks are used, as the split authority decides (`gymfoundry.tasks.stages.isolate.assign_split` over the
splits the warehouse recorded: never a task of a holdout template); the row builders take
those train tasks and check no split themselves. Every row is scanned
for hidden values and deduplicated by content. Rows carry a sampling `weight` from the
curriculum (tasks/stages/curriculum.py), reduced per rollout. Each dataset is a content-addressed
Parquet file under `<data_dir>/datasets/` plus a `datasets` row (mixture, success rates,
parameters) and `dataset_rows` (lineage to rollouts) in the warehouse, and the file's checksum in
the catalog's `dataset_files` (`warehouse check` verifies it, `rebuild_dataset` restores a damaged
file from the warehouse). `load_dataset` reads one for TRL, refusing a damaged file, with
tool-call arguments as the chat template wants them (docs/datasets.md).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gymfoundry.envs.records import (MODEL_OUTCOMES, DatasetManifest, DatasetRow, DPORow, GRPORow, OutcomeReport,
                          ParallelismReward, Rollout, SFTRow, Split, Step, TaskSpec, Termination,
                          TrainingRow, Verdict, content_hash)
from gymfoundry.envs.family import family
from gymfoundry.tasks.policies.chat import SYSTEM_PROMPT, prompt_messages, step_messages, turn_messages, with_tool_arguments
from gymfoundry.tasks.stages import curriculum
from gymfoundry.tasks.stages.audit import current_versions, require_audited
from gymfoundry.tasks.stages.isolate import _first_observation, assert_no_leaks_in_rows, assign_split, dedupe_rows, recorded_splits
from gymfoundry.tasks.stages.score import latest_step_rewards
from gymfoundry.warehouse import DamagedWarehouse, Warehouse, catalog
from gymfoundry.warehouse.lake import file_sha256
from gymfoundry.warehouse.store import assert_dataset_intact

MODEL_FAILURES = MODEL_OUTCOMES - {Termination.success}
DATASETS_DIR = catalog.DATASETS_DIR
KINDS = ("sft", "dpo", "grpo")
MESSAGE_COLUMNS = ("messages", "prompt", "chosen", "rejected")


def tool_schemas(task: TaskSpec) -> list[dict[str, Any]]:
    return list(_schemas(task.env_id, tuple(task.allowed_tools)))


@lru_cache(maxsize=64)
def _schemas(env_id: str, allowed: tuple[str, ...]) -> tuple[dict[str, Any], ...]:
    return tuple(family(env_id).tool_schemas(allowed))


def _row_base(task: TaskSpec) -> dict[str, Any]:
    return {"tools": json.dumps(tool_schemas(task)), "task_id": task.task_id, "task_family": task.family,
            "difficulty": task.difficulty.level}


def sft_rows(tasks: dict[str, TaskSpec], rollouts: list[Rollout],
             step_rewards: dict[str, list[float]]) -> list[SFTRow]:
    rows = []
    for rollout in rollouts:
        task = tasks[rollout.task_id]
        if rollout.termination != Termination.success:
            continue
        rewards = _rewards(rollout, step_rewards)
        rows.append(SFTRow(messages=prompt_messages(rollout) + turn_messages(rollout), **_row_base(task),
                           step_rewards=rewards, masked_turns=[k for k, r in enumerate(rewards) if r < 0],
                           rollout_id=rollout.rollout_id))
    return rows


def trajectory_value(rollout: Rollout, step_rewards: dict[str, list[float]]) -> float:
    """Outcome first, process second: 1 for a verified success plus the mean step reward."""
    rewards = _rewards(rollout, step_rewards)
    return float(rollout.success) + (sum(rewards) / len(rewards) if rewards else 0.0)


def dpo_rows(tasks: dict[str, TaskSpec], rollouts: list[Rollout], step_rewards: dict[str, list[float]] | None = None,
             min_margin: float = 0.5, min_step_margin: float = 0.0) -> list[DPORow]:
    step_rewards = step_rewards or {}
    by_task: dict[str, list[Rollout]] = {}
    for rollout in rollouts:
        if rollout.steps and rollout.termination in MODEL_OUTCOMES:
            by_task.setdefault(rollout.task_id, []).append(rollout)
    rows = []
    for task_id, group in sorted(by_task.items()):
        task = tasks[task_id]
        value = {r.rollout_id: trajectory_value(r, step_rewards) for r in group}
        successes = sorted((r for r in group if r.success), key=lambda r: (-value[r.rollout_id], len(r.steps),
                                                                          r.rollout_id))
        if not successes:
            continue
        best = [r for r in successes if not any(verdict_beats(o, r) for o in successes)]
        chosen = best[0]
        for other in sorted(group, key=lambda r: r.rollout_id):
            margin = value[chosen.rollout_id] - value[other.rollout_id]
            if other.success or margin < min_margin:
                continue
            good, bad = until_last_assistant(turn_messages(chosen)), until_last_assistant(turn_messages(other))
            if good != bad:
                rows.append(_pair(task, chosen, other, prompt_messages(chosen), good, bad, "trajectory", None, margin))
        kept = {r.rollout_id for r in best}
        for other in sorted(successes, key=lambda r: r.rollout_id):
            if other.rollout_id in kept:
                continue
            winner = next(r for r in best if verdict_beats(r, other))  # the order is transitive
            good, bad = until_last_assistant(turn_messages(winner)), until_last_assistant(turn_messages(other))
            if good != bad:
                margin = float(len(verdict_defects(other.outcome) - verdict_defects(winner.outcome)))
                rows.append(_pair(task, winner, other, prompt_messages(winner), good, bad, "verdict", None, margin))
        failures = [r for r in group if r.termination in MODEL_FAILURES]
        for good in best:
            for bad in sorted(failures, key=lambda r: r.rollout_id):
                k = divergence(good, bad)
                if k is None:
                    continue
                margin = _rewards(good, step_rewards)[k] - _rewards(bad, step_rewards)[k]
                if margin < min_step_margin:
                    continue
                prefix = prompt_messages(good) + [m for s in good.steps[:k] for m in step_messages(s)]
                rows.append(_pair(task, good, bad, prefix, step_messages(good.steps[k])[:1],
                                  step_messages(bad.steps[k])[:1], "step", k, margin))
    return rows


def verdict_defects(outcome: OutcomeReport) -> frozenset[str]:
    """What a verdict holds against an episode, component by component: each failed check (an
    observation check that saw no evidence, say), each side effect, a regression, a constraint
    violation, an unfinished outcome. Free-text reasons are no component: a verifier may also
    note what went right."""
    return frozenset([f"check {name}" for name, check in outcome.checks.items() if not check.passed]
                     + [f"side effect {effect}" for effect in outcome.side_effects]
                     + ["regression"] * outcome.regression + ["constraint violation"] * outcome.constraint_violation
                     + ["not completed"] * (not outcome.completed))


def verdict_beats(a: Rollout, b: Rollout) -> bool:
    """Whether `a`'s verdict is strictly better than `b`'s: the same verifier and version ran the
    same checks, and what it holds against `a` is a proper part of what it holds against `b`.
    Anything else (equal verdicts, each worse somewhere, other verifiers) is no ranking."""
    x, y = a.outcome, b.outcome
    if x is None or y is None or (x.verifier_id, x.verifier_version, set(x.checks)) != (
            y.verifier_id, y.verifier_version, set(y.checks)):
        return False
    return verdict_defects(x) < verdict_defects(y)


def until_last_assistant(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` up to and including the last assistant turn: what follows it (the tool result
    or observation that turn received) is the env's text, not the model's."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    return messages[:last + 1]


def divergence(a: Rollout, b: Rollout) -> int | None:
    """The first step at which `a` and `b` act differently, when every earlier step made the
    same call and saw the same result; None when they never diverge or their prefixes differ."""
    for k in range(min(len(a.steps), len(b.steps))):
        sa, sb = a.steps[k], b.steps[k]
        if _action(sa) != _action(sb):
            return k
        if sa.result != sb.result:
            return None  # same call, different world (an env fault): not a shared prefix
    return None


def _action(step: Step) -> Any:
    return step.tool_call.model_dump(exclude={"id"}) if step.tool_call else step.action_text


def _pair(task: TaskSpec, chosen: Rollout, rejected: Rollout, prompt, chosen_messages, rejected_messages,
          pair_type: str, step_index: int | None, margin: float) -> DPORow:
    return DPORow(prompt=prompt, chosen=chosen_messages, rejected=rejected_messages, **_row_base(task),
                  chosen_rollout_id=chosen.rollout_id, rejected_rollout_id=rejected.rollout_id,
                  pair_type=pair_type, step_index=step_index, margin=round(margin, 6))


def grpo_rows(tasks: dict[str, TaskSpec], parallelism: ParallelismReward | None = None) -> list[GRPORow]:
    """One prompt per task, with what recreates its env: env id, generator seed and level; and the
    auxiliary parallelism reward's schedule when one is offered (the trainer reads it there)."""
    schedule = {} if parallelism is None else {"parallelism_weight": parallelism.weight,
                                               "parallelism_anneal_steps": parallelism.anneal_steps}
    rows = []
    for task in sorted(tasks.values(), key=lambda t: t.task_id):
        prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": _first_observation(task)}]
        rows.append(GRPORow(prompt=prompt, **_row_base(task), env_id=task.env_id, seed=task.source.seed,
                            level=task.difficulty.level, generator=task.source.generator,
                            generator_version=task.source.version, **schedule))
    return rows


def _rewards(rollout: Rollout, step_rewards: dict[str, list[float]]) -> list[float]:
    rewards = [0.0 if r is None else float(r) for r in step_rewards.get(rollout.rollout_id, [])]
    return rewards if len(rewards) == len(rollout.steps) else [0.0] * len(rollout.steps)


def write_dataset(rows: list[TrainingRow], dataset_id: str, out_dir: Path) -> Path | None:
    """Write rows under their content-addressed name (temp file, then an atomic rename). A file
    already there is kept only when its bytes are exactly those the rows make: a damaged one is
    replaced."""
    if not rows:
        return None
    path = out_dir / f"{dataset_id}.parquet"
    temp = _write_temp(rows, path)
    if path.is_file() and file_sha256(path) == file_sha256(temp):
        temp.unlink()
    else:
        os.replace(temp, path)
    return path


def _write_temp(rows: list[TrainingRow], path: Path) -> Path:
    """The rows as a Parquet file beside `path`, under a temp name: their fields, in order, are the columns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.stem}.{os.getpid()}.tmp")
    table = pa.Table.from_pylist([row.model_dump() for row in rows])
    if "masked_turns" in table.column_names:  # all rows without one would infer list<null>
        table = table.set_column(table.schema.get_field_index("masked_turns"), "masked_turns",
                                 table["masked_turns"].cast(pa.list_(pa.int64())))
    pq.write_table(table, temp)
    return temp


def finish(kind: str, rows: list[TrainingRow], tasks: dict[str, TaskSpec], rates: dict[str, float],
           learnability: str | curriculum.Learnability, config: dict[str, Any]
           ) -> tuple[list[TrainingRow], DatasetManifest, list[DatasetRow]]:
    """Scan, dedupe and weight the rows of one dataset; its manifest and lineage rows."""
    assert_no_leaks_in_rows([r.model_dump() for r in rows], tasks)  # the rows as the file will show them
    rows, duplicates = dedupe_rows(rows)
    name, fn = curriculum.learnability_fn(learnability)
    cells = [curriculum.cell(r.task_family, r.difficulty) for r in rows]
    shares = curriculum.mixture(rates, cells, fn)
    weights = curriculum.row_weights(cells, [r.owner for r in rows], shares)
    rows = [row.model_copy(update={"weight": weight}) for row, weight in zip(rows, weights)]
    dataset_id = f"{kind}-" + content_hash([sorted(r.row_id for r in rows), shares, config], 12)
    manifest = DatasetManifest(
        dataset_id=dataset_id, kind=kind, rows=len(rows), families=config["families"],
        policy_id=config["policy_id"], policy_version=config["policy_version"], learnability=name,
        success_rates={c: round(p, 6) for c, p in rates.items()}, mixture={c: round(s, 6) for c, s in shares.items()},
        reward_layer=config["reward_layer"], params=config["params"], dropped={**config["dropped"],
                                                                             "duplicate_rows": duplicates},
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    lineage = [DatasetRow(dataset_id=dataset_id, row_id=r.row_id, row_index=i, family=r.task_family,
                          task_id=r.task_id, difficulty=r.difficulty, rollout_ids=r.rollout_ids,
                          **({"pair_type": r.pair_type, "step_index": r.step_index, "margin": r.margin}
                             if isinstance(r, DPORow) else {}),
                          weight=r.weight)
               for i, r in enumerate(rows)]
    return rows, manifest, lineage


def judged_now(wh: Any, rollouts: list[Rollout]) -> tuple[list[Rollout], int]:
    """The rollouts as the family's current verifier version judges them (the version its audit
    is of): a rollout judged by another version takes the verdict `gymfoundry reverify` landed for
    the current one, or is left out (counted) until there is one. A rollout without a verdict (an
    episode a fault ended) is kept as it is: its class keeps it out of every dataset."""
    current = {f: (v["verifier_id"], v["verifier_version"])
               for f, v in ((f, current_versions(f)) for f in {r.family for r in rollouts})}
    later: dict[str, Verdict] = {}
    for family, (verifier_id, version) in current.items():
        ids = [r.rollout_id for r in rollouts if r.family == family and r.outcome is not None
               and (r.outcome.verifier_id, r.outcome.verifier_version) != (verifier_id, version)]
        if ids:
            later.update((v.rollout_id, v) for v in wh.load(
                "outcomes", "verifier_id = ? AND verifier_version = ? AND rollout_id IN (SELECT unnest(?))",
                [verifier_id, version, ids]))
    kept, stale = [], 0
    for r in rollouts:
        if r.outcome is None or (r.outcome.verifier_id, r.outcome.verifier_version) == current[r.family]:
            kept.append(r)
        elif r.rollout_id in later:
            verdict = later[r.rollout_id]
            kept.append(r.model_copy(update={"outcome": verdict.outcome, "termination": verdict.termination,
                                             "termination_reason": verdict.termination_reason}))
        else:
            stale += 1
    return kept, stale


def assemble_datasets(data_dir: str | Path, families: list[str], *, policy_id: str | None = None,
                      policy_version: str | None = None, learnability: str | curriculum.Learnability = "p(1-p)",
                      prior: float = 1.0, min_margin: float = 0.5, min_step_margin: float = 0.0,
                      kinds: tuple[str, ...] = KINDS,
                      parallelism_reward: ParallelismReward | dict | None = None,
                      audit_override: str | None = None) -> dict[str, dict[str, Any]]:
    """Build, write and register the datasets of `families` from what the warehouse holds.
    Every family's current version must have passed its gameability audit (tasks.stages.audit:
    `AuditRefused` otherwise), unless `audit_override` gives the reason to use it anyway; the
    audit ids, or the override, are recorded in each dataset's config.
    Success rates (hence the curriculum) are measured for `policy_id` / `policy_version`
    (all policies where None) on the train split. `parallelism_reward` offers GRPO an annealed
    auxiliary reward for delegating episodes (envs.records.ParallelismReward), stored with the
    GRPO dataset; SFT and DPO rows never carry one."""
    if isinstance(parallelism_reward, dict):
        parallelism_reward = ParallelismReward.model_validate(parallelism_reward)

    with Warehouse(data_dir) as wh:
        audits = require_audited(wh, families, audit_override)
        in_families = "task_family IN (SELECT unnest(?))"
        all_tasks = {t.task_id: t for t in wh.load_tasks(in_families, [families])}
        known = recorded_splits(wh)  # every family's: a holdout template is locked wherever it appears
        splits = {i: assign_split(t, known) for i, t in all_tasks.items()}
        tasks = {i: t for i, t in all_tasks.items() if splits[i] == Split.train}
        dropped = {"holdout_tasks": sum(s == Split.holdout for s in splits.values()),
                   "other_split_tasks": sum(s in (Split.val, Split.test) for s in splits.values())}
        eligible = "task_id IN (SELECT unnest(?))"
        rollouts, dropped["stale_verdict_rollouts"] = judged_now(wh, wh.load_rollouts(eligible, [sorted(tasks)]))
        step_rewards = latest_step_rewards(wh, "rollout_id IN (SELECT unnest(?))",
                                           [sorted(r.rollout_id for r in rollouts)])
        rates = curriculum.success_rates(
            [{"task_family": r.family, "difficulty": tasks[r.task_id].difficulty.level,
              "termination": r.termination.value} for r in rollouts
             if (policy_id is None or r.policy_id == policy_id)
             and (policy_version is None or r.policy_version == policy_version)], prior)
        config = {"families": sorted(families), "policy_id": policy_id, "policy_version": policy_version,
                  "reward_layer": "combined (newest), else rules", "dropped": dropped,
                  "params": {"min_margin": min_margin, "min_step_margin": min_step_margin, "prior": prior,
                             "split": "train", "audits": audits}}
        builders = {"sft": lambda: sft_rows(tasks, rollouts, step_rewards),
                    "dpo": lambda: dpo_rows(tasks, rollouts, step_rewards, min_margin, min_step_margin),
                    "grpo": lambda: grpo_rows(tasks, parallelism_reward)}
        result, manifests, lineage, written = {}, [], [], []
        out_dir = Path(data_dir) / DATASETS_DIR
        for kind in kinds:
            kind_config = config
            if kind == "grpo" and parallelism_reward is not None:
                kind_config = {**config, "params": {**config["params"],
                                                    "parallelism_reward": parallelism_reward.model_dump()}}
            rows, manifest, kind_lineage = finish(kind, builders[kind](), tasks, rates, learnability, kind_config)
            path = write_dataset(rows, manifest.dataset_id, out_dir)
            if path is not None:
                manifest.path = path.resolve().relative_to(wh.data_dir).as_posix()
                written.append(catalog.DatasetFile(manifest.dataset_id, manifest.path, len(rows), file_sha256(path),
                                                   datetime.now(timezone.utc).replace(tzinfo=None)))
            manifests.append(manifest)
            lineage += kind_lineage
            result[kind] = {"dataset_id": manifest.dataset_id, "rows": len(rows), "path": str(path) if path else None,
                            "mixture": manifest.mixture, "dropped": manifest.dropped}
        for file in written:  # before the landing: a dataset the warehouse holds always has its checksum
            catalog.record_dataset_file(wh.con, file)
        wh.land(datasets=manifests, dataset_rows=lineage).checked()
    return result


def rebuild_dataset(wh: Any, dataset_id: str) -> str | None:
    """Rebuild a dataset's file from the warehouse (`Warehouse.repair`'s rebuilder): the rows of
    its lineage's tasks built again with its recorded parameters, kept and ordered as its
    `dataset_rows` say, with their recorded weights. The file is put in place only when its
    checksum is the one recorded; returns None then, else why the dataset cannot be rebuilt."""
    [recorded] = [f for f in catalog.dataset_files(wh.con) if f.dataset_id == dataset_id]
    try:
        manifests = wh.load("datasets", "dataset_id = ?", [dataset_id])
        lineage = sorted(wh.load("dataset_rows", "dataset_id = ?", [dataset_id]), key=lambda r: r.row_index)
        if not manifests or not lineage:
            return "the warehouse holds no `datasets` row or no lineage for it"
        manifest, params = manifests[0], manifests[0].params
        task_ids = sorted({r.task_id for r in lineage})
        tasks = {t.task_id: t for t in wh.load_tasks("task_id IN (SELECT unnest(?))", [task_ids])}
        rollouts, _ = judged_now(wh, wh.load_rollouts("task_id IN (SELECT unnest(?))", [sorted(tasks)]))
        step_rewards = latest_step_rewards(wh, "rollout_id IN (SELECT unnest(?))",
                                           [sorted(r.rollout_id for r in rollouts)])
    except DamagedWarehouse as exc:
        return f"the tables it is built from are damaged ({exc})"
    parallelism = params.get("parallelism_reward")
    build = {"sft": lambda: sft_rows(tasks, rollouts, step_rewards),
             "dpo": lambda: dpo_rows(tasks, rollouts, step_rewards, params["min_margin"], params["min_step_margin"]),
             "grpo": lambda: grpo_rows(tasks, ParallelismReward.model_validate(parallelism) if parallelism else None)}
    built = {}
    for row in dedupe_rows(build[manifest.kind]())[0]:
        built.setdefault(row.row_id, row)
    lost = [r.row_id for r in lineage if r.row_id not in built]
    if lost:
        return f"{len(lost)} of its {len(lineage)} rows can no longer be built from the warehouse"
    rows = [built[r.row_id].model_copy(update={"weight": r.weight}) for r in lineage]
    path = Path(wh.data_dir) / recorded.path
    temp = _write_temp(rows, path)
    digest = file_sha256(temp)
    if digest != recorded.sha256:
        temp.unlink()
        return f"the rebuilt file's sha256 is {digest}, recorded {recorded.sha256}"
    os.replace(temp, path)
    return None


def load_dataset(path: str | Path, tool_arguments: str | None = None):
    """A dataset file as a `datasets.Dataset`, as TRL's trainers take it.

    `tool_arguments`: None keeps the tool-call arguments as stored (JSON strings); "dict" gives
    them as dicts, for chat templates that `tojson` them (Qwen2.5, Llama 3.x, gpt-oss: a string
    would be encoded twice), stored with `datasets.Json` so that calls of different tools keep
    their own keys; "string" as JSON strings (Qwen3, DeepSeek-V3). Applied to every assistant
    tool call of `messages`, `prompt`, `chosen` and `rejected`. A warehouse's dataset file that is
    not the one it recorded raises `DamagedDataset` (`gymfoundry.warehouse.store.assert_dataset_intact`)."""
    import datasets

    assert_dataset_intact(path)

    if tool_arguments is None:
        return datasets.Dataset.from_parquet(str(path))
    rows = [{k: with_tool_arguments(v, tool_arguments) if k in MESSAGE_COLUMNS else v for k, v in row.items()}
            for row in pq.read_table(path).to_pylist()]
    return datasets.Dataset.from_list(rows, on_mixed_types="use_json")


def summary(data_dir: str, families: list[str]) -> list[dict[str, Any]]:
    with Warehouse(data_dir, read_only=True) as wh:
        return wh.sql("""select task_family, termination, count(*) as rollouts from rollouts
                         where task_family in (select unnest(?)) group by all order by all""",
                      [families]).to_pylist()
