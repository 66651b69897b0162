"""Stage: assemble training datasets from the warehouse's records.

SFT rows are TRL conversational rows (`messages`, `tools` as a JSON string, tool-call
arguments as JSON strings) with the PRM's per-step rewards aligned to the assistant turns.
DPO rows pair a verified success with a model failure of the same task
(`prompt` / `chosen` / `rejected`). Only train-split tasks are used."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from envs.records import Rollout, Split, TaskSpec, Termination, content_hash
from envs.registry import make

SYSTEM_PROMPT = ("You are an agent that completes the user's task by calling tools. Call exactly one tool per "
                 "turn; the tool's result comes back as the next message.")

# Failures that are the model's doing; environment faults, timeouts and policy errors are not.
MODEL_FAILURES = {Termination.failure, Termination.constraint_violation, Termination.truncated}


def tool_schemas(task: TaskSpec) -> list[dict[str, Any]]:
    return list(_schemas(task.env_id, tuple(task.allowed_tools)))


@lru_cache(maxsize=64)
def _schemas(env_id: str, allowed: tuple[str, ...]) -> tuple[dict[str, Any], ...]:
    return tuple(make(env_id, verified=False).profile.function_schemas(list(allowed)))


def prompt_messages(rollout: Rollout) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": rollout.steps[0].observation if rollout.steps else ""}]


def turn_messages(rollout: Rollout) -> list[dict[str, Any]]:
    """Assistant turns and the observations they received, in order."""
    messages: list[dict[str, Any]] = []
    for step in rollout.steps:
        call = step.tool_call
        if call is None:
            messages.append({"role": "assistant", "content": step.action_text or ""})
            messages.append({"role": "user", "content": step.result})
            continue
        call_id = call.id or f"call_{step.index}"
        messages.append({"role": "assistant", "content": step.thought or "",
                         "tool_calls": [{"id": call_id, "type": "function",
                                         "function": {"name": call.name,
                                                      "arguments": json.dumps(call.arguments, sort_keys=True)}}]})
        messages.append({"role": "tool", "name": call.name, "tool_call_id": call_id, "content": step.result})
    return messages


def sft_rows(tasks: dict[str, TaskSpec], rollouts: list[Rollout],
             step_rewards: dict[str, list[float]]) -> list[dict[str, Any]]:
    rows = []
    for rollout in rollouts:
        task = tasks[rollout.task_id]
        if task.split != Split.train or rollout.termination != Termination.success:
            continue
        rows.append({"messages": prompt_messages(rollout) + turn_messages(rollout),
                     "tools": json.dumps(tool_schemas(task)),
                     "step_rewards": step_rewards.get(rollout.rollout_id, [0.0] * len(rollout.steps)),
                     "rollout_id": rollout.rollout_id, "task_id": task.task_id, "task_family": task.family,
                     "difficulty": task.difficulty.level})
    return rows


def dpo_rows(tasks: dict[str, TaskSpec], rollouts: list[Rollout]) -> list[dict[str, Any]]:
    """One pair per model failure: the task's shortest verified success against it."""
    by_task: dict[str, list[Rollout]] = {}
    for rollout in rollouts:
        if tasks[rollout.task_id].split == Split.train and rollout.steps:
            by_task.setdefault(rollout.task_id, []).append(rollout)
    rows = []
    for task_id, group in sorted(by_task.items()):
        successes = sorted((r for r in group if r.termination == Termination.success),
                           key=lambda r: (len(r.steps), r.rollout_id))
        failures = sorted((r for r in group if r.termination in MODEL_FAILURES), key=lambda r: r.rollout_id)
        if not successes:
            continue
        chosen = successes[0]
        for rejected in failures:
            task = tasks[task_id]
            rows.append({"prompt": prompt_messages(chosen), "chosen": turn_messages(chosen),
                         "rejected": turn_messages(rejected), "tools": json.dumps(tool_schemas(task)),
                         "chosen_rollout_id": chosen.rollout_id, "rejected_rollout_id": rejected.rollout_id,
                         "task_id": task_id, "task_family": task.family, "difficulty": task.difficulty.level})
    return rows


def write_dataset(rows: list[dict[str, Any]], kind: str, out_dir: Path) -> tuple[str, Path | None]:
    """Write rows once under a content-addressed name; the same rows give the same file."""
    ids = sorted(r.get("rollout_id") or f"{r['chosen_rollout_id']}>{r['rejected_rollout_id']}" for r in rows)
    dataset_id = f"{kind}-{content_hash(ids, 12)}"
    if not rows:
        return dataset_id, None
    path = out_dir / f"{dataset_id}.parquet"
    if not path.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        tmp.replace(path)
    return dataset_id, path


def assemble_datasets(data_dir: str, families: list[str]) -> dict[str, dict[str, Any]]:
    """Build the SFT and DPO datasets of `families` from what the warehouse holds."""
    from warehouse import Warehouse

    with Warehouse(data_dir, read_only=True) as wh:
        family_list = ", ".join(f"'{f}'" for f in families)
        where = f"task_family in ({family_list})"
        tasks = {t.task_id: t for t in wh.load_tasks(where)}
        rollouts = wh.load_rollouts(where)
        rewards = wh.sql(f"""
            select rollout_id, list(score order by step_index) as rewards from step_scores
            where {where} and layer = 'rules' group by rollout_id""").to_pylist()
    step_rewards = {r["rollout_id"]: r["rewards"] for r in rewards}
    out_dir = Path(data_dir) / "datasets"
    result = {}
    for kind, rows in (("sft", sft_rows(tasks, rollouts, step_rewards)), ("dpo", dpo_rows(tasks, rollouts))):
        dataset_id, path = write_dataset(rows, kind, out_dir)
        result[kind] = {"dataset_id": dataset_id, "rows": len(rows), "path": str(path) if path else None}
    return result


def summary(data_dir: str, families: list[str]) -> list[dict[str, Any]]:
    from warehouse import Warehouse

    family_list = ", ".join(f"'{f}'" for f in families)
    with Warehouse(data_dir, read_only=True) as wh:
        return wh.sql(f"""select task_family, termination, count(*) as rollouts from rollouts
                          where task_family in ({family_list}) group by all order by all""").to_pylist()
