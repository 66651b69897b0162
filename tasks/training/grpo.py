"""Step-level GRPO against the live environments, on TRL's `GRPOTrainer`.

TRL's `rollout_func` hook plays each group of `num_generations` episodes of one task in the
live env with the model being trained (the local HF policy, which keeps the sampled token ids
and logprobs). A completion is the whole multi-turn continuation after the first observation;
its `env_mask` marks the tokens the model sampled (1) apart from the tool results the env
appended (0), so observation tokens carry no loss. The PRM scores every step, and each step
gets its own advantage, normalised within the group:

    g[i][t] = outcome_i + sum_{k >= t} r[i][k]          (reward to go, step t of rollout i)
    A[i][t] = (g[i][t] - mean) / (std + eps)

where mean and std are group statistics in which every rollout counts once, whatever its
number of steps (per rollout, not per record). A[i][t] is broadcast to the tokens the model
sampled at step t. So the advantage varies within one completion, and a group whose outcomes
are all equal still learns from its steps — the sequence-level advantage would be zero there.
The loss is TRL's (clipped surrogate, its `loss_type`, beta/KL against the starting model)."""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import torch
from trl import GRPOTrainer

from gymfoundry.envs.delegation import parallelism_gain
from gymfoundry.envs.records import GRPORow, ParallelismReward, Split
from gymfoundry.tasks.ops.evaluate import evaluation_budget
from gymfoundry.tasks.policies.checkpoint import load_model
from gymfoundry.tasks.policies.hf import HFPolicy, family_tools
from gymfoundry.tasks.rollout.episodes import rollout_seed, run_episode
from gymfoundry.tasks.stages.generate import family_env_class, generate_tasks
from gymfoundry.tasks.stages.isolate import (HOLDOUT_FRACTION, landed_holdout_fractions, landed_splits,
                                             refuse_non_train, tasks_of_split)
from gymfoundry.tasks.stages.score import score_rollouts
from gymfoundry.tasks.training.curriculum import curriculum_order
from gymfoundry.tasks.training.progress import ReportProgress
from gymfoundry.tasks.training.runners import TimeLimit, load_rows, template_metrics

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


def train_tasks(family: str, n: int, seed: int, known=None, holdout_fraction=None):
    """`n` train tasks of a family, as the split authority decides with the splits and holdout
    fractions a warehouse recorded (`known`, template_id -> split; `holdout_fraction`, family ->
    fraction): never a holdout, val or test task."""

    fraction = HOLDOUT_FRACTION if holdout_fraction is None else holdout_fraction
    return tasks_of_split(generate_tasks(family, n * 4, seed), Split.train, known, fraction)[:n]


def dataset_tasks(dataset: str, steps: int, seed: int, known=None, holdout_fraction=None):
    """The tasks of a GRPO dataset, regenerated from their generator, seed and level (and
    checked against the stored task id), in curriculum order following the stored weights.
    A dataset naming a task the split authority puts outside train (with `known`, the splits a
    warehouse recorded) is refused whole."""
    rows = load_rows(dataset, GRPORow)
    tasks = []
    for row in rows:
        task = family_env_class(row.task_family).generate_task(row.seed, row.level)
        if task.task_id != row.task_id:
            raise ValueError(f"task {row.task_id} does not regenerate from its seed and level")
        tasks.append(task)
    refuse_non_train(tasks, known, f"GRPO dataset {dataset}",
                     HOLDOUT_FRACTION if holdout_fraction is None else holdout_fraction)
    order = curriculum_order([r.weight for r in rows], [r.difficulty for r in rows], steps, seed)
    return [tasks[i] for i in order]


def step_rewards_of(rollouts, tasks) -> dict[str, list[float]]:
    """The PRM's reward per step: the `combined` layer where scored, else the rule layer."""
    by_layer: dict[str, dict[str, dict[int, float]]] = {}
    for s in score_rollouts(rollouts, tasks):
        if s.score is not None:
            by_layer.setdefault(s.layer, {}).setdefault(s.rollout_id, {})[s.step_index] = s.score
    layer = by_layer.get("combined") or by_layer.get("rules") or {}
    return {r.rollout_id: [layer.get(r.rollout_id, {}).get(i, 0.0) for i in range(len(r.steps))] for r in rollouts}


def completion_advantages(rows: list[dict[str, Any]], num_generations: int, shape: tuple[int, int]) -> torch.Tensor:
    """(B, T) advantages for a batch of completions, `num_generations` consecutive rows per task
    (as TRL's sampler lays them out): each step's group-normalised reward to go on the tokens
    sampled at that step, 0 on env tokens and padding. Each row carries `step_rewards`,
    `outcome` and `step_spans` (where each step's sampled tokens sit in the completion)."""
    out = torch.zeros(shape)
    for first in range(0, len(rows), num_generations):
        group = rows[first:first + num_generations]
        advantages = group_step_advantages([(row["step_rewards"], row["outcome"]) for row in group])
        for i, (row, adv) in enumerate(zip(group, advantages)):
            values, _ = token_advantages(shape[1], row["step_spans"], adv)
            out[first + i] = torch.tensor(values)
    return out


class StepGRPOTrainer(GRPOTrainer):
    """TRL's GRPO with step-level advantages.

    TRL gives every token of a completion its sequence's advantage; a multi-turn episode needs
    one per step. TRL's `_compute_loss` already accepts (B, T) advantages, so only the end of
    `_generate_and_score_completions` changes: after TRL has played the episodes (through the
    `rollout_func`), scored them and taken reference logprobs, its (B,) advantages are replaced
    by `completion_advantages`. The loss (clipped surrogate, `loss_type`, beta/KL) and the env
    mask over observation tokens stay TRL's."""

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        # TRL has merged the rollout_func's extra fields into `inputs` (for the reward functions).
        advantages = completion_advantages(inputs, self.num_generations, tuple(output["completion_ids"].shape))
        output["advantages"] = advantages.to(output["completion_ids"].device)
        return output


def verified_outcome(completions, outcome, **_) -> list[float]:
    """The reward TRL logs: the verifier's outcome of each episode."""
    return list(outcome)


class LiveEpisodes:
    """TRL's `rollout_func`: one episode in the live env per prompt (a task id; TRL's sampler
    repeats each `num_generations` times), played by `HFPolicy` on the model being trained.
    Prompt ids are the rendered first observation; the completion is everything after it:
    the sampled actions (env mask 1, with their sampled logprobs) and the tool results and
    errors the env appended (env mask 0). Keeps every episode played, for landing."""

    def __init__(self, tasks, base_model: str, hp, policy_id: str, parallelism=None):
        self.parallelism = parallelism  # envs.records.ParallelismReward from the dataset, or None
        self.tasks = {t.task_id: t for t in tasks}
        self.base_model, self.hp, self.policy_id = base_model, hp, policy_id
        self.tools = family_tools(hp.family)
        self.rollouts, self.group_success = [], []

    def __call__(self, prompts: list[str], trainer) -> dict[str, list]:
        hp, step, n = self.hp, trainer.state.global_step, trainer.num_generations
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        policy = HFPolicy(self.base_model, self.tools, model=model, tokenizer=trainer.processing_class,
                          temperature=hp.temperature, max_new_tokens=hp.max_completion_length,
                          version=f"grpo-step{step}", policy_id=self.policy_id)
        played, contexts = [], []
        for i, task_id in enumerate(prompts):
            task = self.tasks[task_id]
            played.append(run_episode(task, policy, rollout_seed(hp.seed + step, task, i % n),
                                      limits=evaluation_budget(task, hp.slack_steps)))
            contexts.append((list(policy.context), list(policy.sampled_spans)))
        model.train(was_training)
        rewards = step_rewards_of(played, [self.tasks[task_id] for task_id in set(prompts)])
        self.rollouts += played
        self.group_success.append(sum(r.success for r in played) / len(played))
        out = {key: [] for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "step_spans",
                                   "step_rewards", "outcome")}
        eos = trainer.processing_class.eos_token_id
        for rollout, (context, spans) in zip(played, contexts):
            start = spans[0][0] if spans else len(context)
            completion = context[start:] or [eos]  # an episode that never acted still needs a token
            spans = [(a - start, b - start) for a, b in spans]
            logprobs, env_mask = [0.0] * len(completion), [0] * len(completion)
            for (a, _), st in zip(spans, rollout.steps):
                for j, lp in enumerate(st.logprobs or []):
                    logprobs[a + j], env_mask[a + j] = lp, 1
            out["prompt_ids"].append(context[:start] or [eos])
            out["completion_ids"].append(completion)
            out["logprobs"].append(logprobs)
            out["env_mask"].append(env_mask)
            out["step_spans"].append(spans)
            out["step_rewards"].append(rewards[rollout.rollout_id])
            out["outcome"].append(episode_reward(rollout, self.parallelism, step))
        return out


def episode_reward(rollout, parallelism, step: int) -> float:
    """The episode's outcome (1 for a verified success), plus the dataset's annealed parallelism
    reward where it offers one: its weight at `step` x the episode's parallelism gain."""
    bonus = 0.0 if parallelism is None else parallelism.at(step) * parallelism_gain(rollout)
    return float(rollout.success) + bonus


def dataset_parallelism(dataset: str) -> ParallelismReward | None:
    """The parallelism reward a GRPO dataset file offers (its rows carry the schedule), or None."""
    import pyarrow.parquet as pq

    table = pq.read_table(str(dataset))
    return GRPORow.model_validate(table.slice(0, 1).to_pylist()[0]).parallelism if table.num_rows else None


def run_grpo(dataset: str | None, base_model: str, output_dir: str, hp, *,
             trainer_class: type[GRPOTrainer] = StepGRPOTrainer) -> dict[str, Any]:
    """On-policy step-level GRPO with TRL: `max_steps` updates, each on `num_generations`
    episodes of one training task (tasks in order). Returns metrics and, under `rollouts`, every
    episode played (with token ids, logprobs and policy version) for landing. `trainer_class=GRPOTrainer`
    gives plain TRL GRPO (sequence-level advantages) on the same episodes, for comparison.
    The tasks (the dataset's, else `train_tasks`) pass the split authority with the splits
    recorded under `hp.data_dir`."""
    from datasets import Dataset
    from trl import GRPOConfig


    model, tokenizer = load_model(base_model)
    known = landed_splits(hp.data_dir)  # the splits recorded where the factory landed its tasks
    fractions = landed_holdout_fractions(hp.data_dir)  # and the holdout fractions its runs locked
    tasks = dataset_tasks(dataset, hp.max_steps if hp.max_steps < 10_000 else 1000, hp.seed, known, fractions) \
        if dataset else train_tasks(hp.family, hp.tasks, hp.seed, known, fractions)
    episodes = LiveEpisodes(tasks, base_model, hp, policy_id=f"grpo:{output_dir.rstrip('/').rsplit('/', 1)[-1]}",
                            parallelism=dataset_parallelism(dataset) if dataset else None)
    args = GRPOConfig(output_dir=output_dir, max_steps=hp.max_steps, learning_rate=hp.learning_rate,
                      lr_scheduler_type="constant", per_device_train_batch_size=hp.num_generations,
                      gradient_accumulation_steps=1, num_generations=hp.num_generations,
                      max_completion_length=hp.max_completion_length, temperature=max(hp.temperature, 1e-3),
                      beta=hp.beta, loss_type=hp.loss_type, shuffle_dataset=False, seed=hp.seed,
                      use_cpu=True, bf16=False, activation_checkpointing=False, report_to=[], logging_steps=1,
                      save_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="You are using 'rollout_func'")  # TRL marks it experimental
        trainer = trainer_class(model=model, reward_funcs=verified_outcome, args=args,
                                train_dataset=Dataset.from_list([{"prompt": t.task_id} for t in tasks]),
                                processing_class=tokenizer, rollout_func=episodes,
                                callbacks=[TimeLimit(hp.time_limit_s), ReportProgress(time_limit_s=hp.time_limit_s)])
    started = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - started
    trainer.save_model(output_dir)
    tokenizer.save_pretrained(output_dir)
    history = [(h["step"], round(h["loss"], 4)) for h in trainer.state.log_history if "loss" in h]
    return {"steps": trainer.state.global_step, "examples": len(episodes.rollouts),
            "train_seconds": round(train_seconds, 2), "final_loss": history[-1][1] if history else None,
            "loss_history": history, "group_success": episodes.group_success, "rollouts": episodes.rollouts,
            "tasks": list({t.task_id: t for t in tasks}.values()), **template_metrics(tokenizer)}
