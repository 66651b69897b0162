"""Step-level GRPO against the live environments.

Each update samples a group of episodes of one task with the current model (the local HF
policy, which keeps the sampled token ids and logprobs), scores every step with the PRM, and
turns step rewards into per-step advantages normalised within the group:

    g[i][t] = outcome_i + sum_{k >= t} r[i][k]          (reward to go, step t of rollout i)
    A[i][t] = (g[i][t] - mean) / (std + eps)

where mean and std are group statistics in which every rollout counts once, whatever its
number of steps (per rollout, not per record). A[i][t] is broadcast to the tokens the model
sampled at step t; observation tokens get none (the env mask). So the advantage varies within
one completion, and a group whose outcomes are all equal still learns from its steps — the
sequence-level advantage would be zero there. The loss is GRPO's clipped surrogate."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

EPS = 1e-4


def reward_to_go(step_rewards: list[float], outcome: float) -> list[float]:
    out, running = [], outcome
    for r in reversed(step_rewards):
        running += r
        out.append(running)
    return out[::-1]


def group_step_advantages(group: list[tuple[list[float], float]]) -> list[list[float]]:
    """Per-step advantages for a group of rollouts of one task: (step rewards, outcome) each."""
    returns = [reward_to_go(rewards, outcome) for rewards, outcome in group]
    per_rollout = [rs for rs in returns if rs]
    if not per_rollout:
        return [[] for _ in group]
    mean = sum(sum(rs) / len(rs) for rs in per_rollout) / len(per_rollout)
    var = sum(sum((g - mean) ** 2 for g in rs) / len(rs) for rs in per_rollout) / len(per_rollout)
    std = math.sqrt(var)
    return [[(g - mean) / (std + EPS) for g in rs] for rs in returns]


def token_advantages(length: int, spans: list[tuple[int, int]], advantages: list[float]) -> tuple[list[float], list[int]]:
    """Advantage per token of a context of `length`, and the env mask (1 = sampled by the model)."""
    values, mask = [0.0] * length, [0] * length
    for (a, b), adv in zip(spans, advantages):
        for i in range(a, min(b, length)):
            values[i], mask[i] = adv, 1
    return values, mask


def grpo_loss(model, sequences: list[dict[str, Any]], temperature: float, clip: float = 0.2) -> torch.Tensor:
    """Clipped surrogate over the sampled tokens of each episode (`input_ids`, `advantages`,
    `mask`, `old_logprobs` per token), averaged per episode then over episodes."""
    losses = []
    for seq in sequences:
        ids = torch.tensor([seq["input_ids"]])
        logits = model(input_ids=ids).logits[0, :-1].float() / temperature
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        mask = torch.tensor(seq["mask"][1:], dtype=torch.float32)
        adv = torch.tensor(seq["advantages"][1:])
        old = torch.tensor(seq["old_logprobs"][1:])
        ratio = torch.exp(logprobs - old)
        surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
        losses.append(-(surrogate * mask).sum() / mask.sum().clamp(min=1))
    return torch.stack(losses).mean()


def train_tasks(family: str, n: int, seed: int):
    """Training-split tasks of a family (the split rule of the isolation stage)."""
    from envs.records import Split
    from tasks.generate import generate_tasks
    from tasks.isolate import split_for

    tasks = [t for t in generate_tasks(family, n * 4, seed) if split_for(t.template_id) == Split.train]
    return tasks[:n]


def dataset_tasks(dataset: str, steps: int, seed: int):
    """The tasks of a GRPO dataset, regenerated from their generator, seed and level (and
    checked against the stored task id), in curriculum order following the stored weights."""
    from datasets import Dataset

    from tasks.generate import family_env_class
    from tasks.training.curriculum import curriculum_order, row_weight

    rows = Dataset.from_parquet(str(dataset)).to_list()
    tasks = []
    for row in rows:
        task = family_env_class(row["task_family"]).generate_task(row["seed"], row["level"])
        if task.task_id != row["task_id"]:
            raise ValueError(f"task {row['task_id']} does not regenerate from its seed and level")
        tasks.append(task)
    order = curriculum_order([row_weight(r) for r in rows], [int(r["difficulty"]) for r in rows], steps, seed)
    return [tasks[i] for i in order]


def step_rewards_of(rollouts, tasks) -> dict[str, list[float]]:
    """The PRM's reward per step: the `combined` layer where scored, else the rule layer."""
    from tasks.score import score_rollouts

    by_layer: dict[str, dict[str, dict[int, float]]] = {}
    for s in score_rollouts(rollouts, tasks):
        if s.score is not None:
            by_layer.setdefault(s.layer, {}).setdefault(s.rollout_id, {})[s.step_index] = s.score
    layer = by_layer.get("combined") or by_layer.get("rules") or {}
    return {r.rollout_id: [layer.get(r.rollout_id, {}).get(i, 0.0) for i in range(len(r.steps))] for r in rollouts}


def run_grpo(dataset: str | None, base_model: str, output_dir: str, hp) -> dict[str, Any]:
    """On-policy step-level GRPO: `max_steps` updates, each on `num_generations` episodes of
    one training task (tasks cycled in order). Returns metrics and, under `rollouts`, every
    episode played (with token ids, logprobs and policy version) for landing."""
    from tasks.evaluate import evaluation_budget
    from tasks.hf_policy import HFPolicy, family_tools
    from tasks.rollout import rollout_seed, run_episode
    from tasks.training.base_model import load_model

    model, tokenizer = load_model(base_model)
    tasks = dataset_tasks(dataset, hp.max_steps if hp.max_steps < 10_000 else 1000, hp.seed) if dataset \
        else train_tasks(hp.family, hp.tasks, hp.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=hp.learning_rate)
    tools = family_tools(hp.family)
    started = time.perf_counter()
    history, rollouts, step = [], [], 0
    for step in range(hp.max_steps):
        if hp.time_limit_s and time.perf_counter() - started > hp.time_limit_s:
            break
        task = tasks[step % len(tasks)]
        policy = HFPolicy(base_model, tools, model=model, tokenizer=tokenizer, temperature=hp.temperature,
                          max_new_tokens=hp.max_completion_length, version=f"grpo-step{step}",
                          policy_id=f"grpo:{output_dir.rstrip('/').rsplit('/', 1)[-1]}")
        group, contexts = [], []
        for k in range(hp.num_generations):
            model.eval()
            rollout = run_episode(evaluation_budget(task, hp.slack_steps), policy,
                                  rollout_seed(hp.seed + step, task, k))
            group.append(rollout)
            contexts.append((list(policy.context), list(policy.sampled_spans)))
        rewards = step_rewards_of(group, [task])
        advantages = group_step_advantages([(rewards[r.rollout_id], float(r.success)) for r in group])
        sequences = []
        for rollout, (context, spans), adv in zip(group, contexts, advantages):
            values, mask = token_advantages(len(context), spans, adv)
            old = [0.0] * len(context)
            for (a, _), st in zip(spans, rollout.steps):
                for j, lp in enumerate(st.logprobs or []):
                    old[a + j] = lp
            sequences.append({"input_ids": context, "advantages": values, "mask": mask, "old_logprobs": old})
        model.train()
        loss = grpo_loss(model, sequences, max(hp.temperature, 1e-3))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        rollouts += group
        history.append((step + 1, round(loss.item(), 4), sum(r.success for r in group) / len(group)))
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    train_seconds = time.perf_counter() - started
    return {"steps": len(history), "examples": len(rollouts), "train_seconds": round(train_seconds, 2),
            "final_loss": history[-1][1] if history else None, "loss_history": [h[:2] for h in history],
            "group_success": [h[2] for h in history], "rollouts": rollouts,
            "tasks": list({t.task_id: t for t in tasks}.values())}
