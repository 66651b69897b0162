import pytest

from gymfoundry.tasks.training.train import train
from gymfoundry.tasks.training.grpo import completion_advantages, group_step_advantages, reward_to_go, token_advantages


def test_step_advantages_vary_within_a_completion_and_survive_equal_outcomes():
    # Both rollouts succeed: the sequence-level GRPO advantage is 0 for both (a no-op).
    group = [([0.5, -0.5, 1.0], 1.0), ([0.1, 0.1], 1.0)]
    advantages = group_step_advantages(group)
    assert reward_to_go([0.5, -0.5, 1.0], 1.0) == [2.0, 1.5, 2.0]
    assert len(set(advantages[0])) > 1                 # differs between steps of one completion
    assert any(abs(a) > 0.1 for adv in advantages for a in adv)
    # Group statistics count each rollout once: the per-rollout mean advantages cancel.
    per_rollout_means = [sum(a) / len(a) for a in advantages]
    assert sum(per_rollout_means) == pytest.approx(0.0, abs=1e-6)


def test_a_longer_rollout_does_not_outweigh_a_shorter_one():
    long = ([0.0] * 9, 0.0)
    short = ([0.0], 1.0)
    adv_long, adv_short = group_step_advantages([long, short])
    assert adv_short[0] == pytest.approx(-adv_long[0])  # symmetric, as with one record per rollout


def test_token_advantages_broadcast_to_sampled_tokens_only():
    values, mask = token_advantages(10, [(2, 4), (6, 9)], [0.5, -1.0])
    assert values == [0, 0, 0.5, 0.5, 0, 0, -1.0, -1.0, -1.0, 0]
    assert mask == [0, 0, 1, 1, 0, 0, 1, 1, 1, 0]


def test_completion_advantages_are_per_step_and_grouped_per_task():
    rows = [{"step_rewards": [0.5, -0.5], "outcome": 1.0, "step_spans": [(0, 2), (4, 5)]},
            {"step_rewards": [0.0], "outcome": 0.0, "step_spans": [(0, 3)]},
            {"step_rewards": [1.0], "outcome": 1.0, "step_spans": [(1, 2)]},   # a second task's group:
            {"step_rewards": [1.0], "outcome": 1.0, "step_spans": [(1, 2)]}]   # equal, so all zero
    adv = completion_advantages(rows, num_generations=2, shape=(4, 6))
    expected = group_step_advantages([([0.5, -0.5], 1.0), ([0.0], 0.0)])
    assert adv[0].tolist() == pytest.approx([expected[0][0]] * 2 + [0, 0] + [expected[0][1]] + [0])
    assert adv[1].tolist() == pytest.approx([expected[1][0]] * 3 + [0] * 3)
    assert adv[2:].abs().sum() == 0


def test_grpo_trains_with_trl_on_per_token_step_advantages(tiny_model_dir, tmp_path, monkeypatch):
    from safetensors.torch import load_file
    from trl import GRPOTrainer

    from gymfoundry.tasks.training.grpo import StepGRPOTrainer

    fed = []
    compute_loss = StepGRPOTrainer._compute_loss

    def spy(self, model, inputs):
        fed.append((self, inputs))
        return compute_loss(self, model, inputs)

    monkeypatch.setattr(StepGRPOTrainer, "_compute_loss", spy)
    out = tmp_path / "grpo"
    metrics = train(None, "grpo", str(tiny_model_dir), str(out),
                    {"max_steps": 1, "num_generations": 2, "max_completion_length": 6, "tasks": 1, "slack_steps": 0,
                     "learning_rate": 1e-2})
    trainer, inputs = fed[0]
    assert isinstance(trainer, GRPOTrainer) and type(trainer) is not GRPOTrainer
    advantages, completion = inputs["advantages"], inputs["completion_mask"]
    assert advantages.shape == inputs["completion_ids"].shape          # one advantage per token
    sampled = (completion * inputs["tool_mask"]).bool()
    env_tokens = completion.bool() & ~sampled
    assert env_tokens.any(dim=1).all()                                  # tool results sit inside each completion
    assert (advantages[~sampled] == 0).all()                            # and carry no advantage (nor loss)
    assert all(len(set(row[mask].tolist())) > 1 for row, mask in zip(advantages, sampled))  # varies by step
    assert metrics["steps"] == 1 and len(metrics["rollouts"]) == 2
    assert all(s.token_ids and s.logprobs and s.policy_version == "grpo-step0"
               for r in metrics["rollouts"] for s in r.steps)
    before, after = load_file(tiny_model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not (before[k] == after[k]).all() for k in before)


def test_grpo_run_updates_the_model_from_live_episodes(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "grpo"
    metrics = train(None, "grpo", str(tiny_model_dir), str(out),
                    {"max_steps": 1, "num_generations": 2, "max_completion_length": 6, "tasks": 1, "slack_steps": 0,
                     "learning_rate": 1e-2, "temperature": 1.0})
    assert metrics["steps"] == 1 and len(metrics["rollouts"]) == 2
    assert all(s.token_ids and s.logprobs for r in metrics["rollouts"] for s in r.steps)
    before, after = load_file(tiny_model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not (before[k] == after[k]).all() for k in before)


def test_grpo_dataset_tasks_regenerate_in_curriculum_order(tmp_path):
    from gymfoundry.tasks.stages.assemble import grpo_rows, write_dataset
    from gymfoundry.tasks.stages.generate import family_env_class
    from gymfoundry.tasks.training.grpo import dataset_tasks

    env_class = family_env_class("inventory")
    rows = []
    for seed, level, weight in [(11, 1, 1.0), (12, 5, 3.0)]:
        task = env_class.generate_task(seed, level)
        (row,) = grpo_rows({task.task_id: task})
        rows.append(row.model_copy(update={"weight": weight}))
    path = write_dataset(rows, "grpo", tmp_path)
    tasks = dataset_tasks(str(path), 40, seed=0)
    assert tasks[0].task_id == rows[0].task_id                        # easy first
    assert {t.task_id for t in tasks[20:]} == {r.task_id for r in rows}
