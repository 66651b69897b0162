"""Curriculum-weighted assembly: SFT / DPO / GRPO rows from the warehouse, weights reduced per
rollout, the mixture and lineage stored in `datasets` / `dataset_rows`, and the files loading
into TRL's trainers as written."""

from __future__ import annotations

import json

import pytest

from gymfoundry import envs
from gymfoundry.envs.records import DPORow, GRPORow, SFTRow, Split, Termination
from gymfoundry.tasks.stages import curriculum
from gymfoundry.tasks.stages.assemble import assemble_datasets, load_dataset, trajectory_value
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.stages.isolate import isolate_tasks
from gymfoundry.tasks.stages.land import land_batch
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.episodes import collect_rollouts
from gymfoundry.tasks.stages.score import latest_step_rewards, score_rollouts
from gymfoundry.warehouse import Warehouse
from tests.audits import audited

MISTAKES = 0.35


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("assemble")
    tasks, _ = isolate_tasks(generate_tasks("inventory", 24, seed=5), holdout_fraction=0.1)
    policy = make_policy("scripted", "inventory", mistake_rate=MISTAKES)
    rollouts = collect_rollouts(tasks, policy, 4, seed=5)
    land_batch(str(data_dir), tasks, [], rollouts, score_rollouts(rollouts, tasks))
    audited(data_dir, ["inventory"])
    result = assemble_datasets(data_dir, ["inventory"], policy_version=policy.version)
    return data_dir, result, policy.version


def test_success_rates_are_per_rollout_over_model_outcomes():
    rows = ([{"task_family": "a", "difficulty": 1, "termination": "success"}] * 3
            + [{"task_family": "a", "difficulty": 1, "termination": "failure"}]
            + [{"task_family": "a", "difficulty": 1, "termination": "env_fault"}] * 10
            + [{"task_family": "a", "difficulty": 2, "termination": "timeout"}])
    assert curriculum.success_rates(rows, prior=0) == {"a/1": 0.75}
    assert curriculum.success_rates(rows, prior=1) == {"a/1": 4 / 6}


def test_learnability_is_configurable():
    rates = {"a/1": 0.9, "a/2": 0.5, "a/3": 0.1}
    _, fn = curriculum.learnability_fn("p(1-p)")
    shares = curriculum.mixture(rates, rates, fn)
    assert shares["a/2"] > shares["a/1"] == pytest.approx(shares["a/3"]) and sum(shares.values()) == pytest.approx(1)
    _, hard = curriculum.learnability_fn("1-p")
    assert curriculum.mixture(rates, rates, hard)["a/3"] == pytest.approx(0.9 / 1.5)
    name, custom = curriculum.learnability_fn(lambda p: p ** 2)
    assert curriculum.mixture(rates, rates, custom)["a/1"] == pytest.approx(0.81 / 1.07)
    assert curriculum.mixture({}, ["x/1", "y/2"], fn) == {"x/1": 0.5, "y/2": 0.5}  # unmeasured: the prior
    with pytest.raises(ValueError, match="unknown learnability"):
        curriculum.learnability_fn("p^2")


def test_row_weights_reduce_per_rollout_never_per_row():
    rows = [{"task_family": "a", "difficulty": 1, "owner": "r1"}] * 3 + \
           [{"task_family": "a", "difficulty": 1, "owner": "r2"}] + \
           [{"task_family": "a", "difficulty": 2, "owner": "r3"}]
    weights = curriculum.row_weights([curriculum.cell(r["task_family"], r["difficulty"]) for r in rows],
                                     [r["owner"] for r in rows], {"a/1": 0.5, "a/2": 0.5})
    assert sum(weights) == pytest.approx(len(rows))
    per_owner = {}
    for row, w in zip(rows, weights):
        per_owner[row["owner"]] = per_owner.get(row["owner"], 0) + w
    assert per_owner["r1"] == pytest.approx(per_owner["r2"])          # 3 rows count as much as 1
    assert per_owner["r3"] == pytest.approx(per_owner["r1"] + per_owner["r2"])  # cells get their share


def test_datasets_store_mixture_and_lineage(built):
    data_dir, result, version = built
    with Warehouse(data_dir, read_only=True) as wh:
        manifests = {m.kind: m for m in wh.load("datasets")}
        cells = wh.sql("""select task_family, difficulty_level, successes, model_outcomes from success_by_cell
                          where policy_version = ?""", [version]).to_pylist()
        lineage = wh.sql("select dataset_id, count(*) as n, sum(weight) as w from dataset_rows group by 1").to_pylist()
        orphans = wh.sql("""select count(*) as n from (select unnest(rollout_ids) as rollout_id from dataset_rows)
                            anti join rollouts using (rollout_id)""").to_pylist()[0]["n"]
        composition = wh.sql("select dataset_id, task_family, difficulty, weight_share from dataset_composition"
                             ).to_pylist()
        train = {t.task_id for t in wh.load_tasks("split = 'train'")}
    assert set(manifests) == {"sft", "dpo", "grpo"}
    assert {m.dataset_id for m in manifests.values()} == {d["dataset_id"] for d in result.values()}
    # Success rates are measured per rollout in the warehouse, for the policy version, train split.
    sft = manifests["sft"]
    assert sft.policy_version == version and sft.learnability == "p(1-p)"
    assert set(sft.success_rates) <= {f"inventory/{c['difficulty_level']}" for c in cells}
    expected = curriculum.mixture(sft.success_rates, sft.mixture, curriculum.LEARNABILITY["p(1-p)"])
    assert sft.mixture == pytest.approx(expected, abs=1e-6)
    # Lineage: one dataset_rows row per row, naming rollouts that landed; weights average 1.
    assert {r["dataset_id"]: r["n"] for r in lineage} == {m.dataset_id: m.rows for m in manifests.values() if m.rows}
    assert all(r["w"] == pytest.approx(r["n"], rel=1e-6) for r in lineage)
    assert orphans == 0
    for row in composition:
        manifest = next(m for m in manifests.values() if m.dataset_id == row["dataset_id"])
        assert row["weight_share"] == pytest.approx(manifest.mixture[f"{row['task_family']}/{row['difficulty']}"],
                                                    abs=1e-6)
    for kind, info in result.items():
        rows = load_dataset(info["path"])
        assert len(rows) == info["rows"] > 0 and set(rows["task_id"]) <= train
        assert (data_dir / manifests[kind].path).exists()


def test_sft_rows_follow_the_records(built):
    data_dir, result, _ = built
    sft = rows_of(result["sft"]["path"], SFTRow)
    with Warehouse(data_dir, read_only=True) as wh:
        rollouts = {r.rollout_id: r for r in wh.load_rollouts("rollout_id IN (SELECT unnest(?))",
                                                                [[row.rollout_id for row in sft]])}
        rewards = latest_step_rewards(wh)
        tasks = {t.task_id: t for t in wh.load_tasks()}
    for row in sft:
        rollout = rollouts[row.rollout_id]
        assert rollout.termination == Termination.success
        assistant = [m for m in row.messages if m["role"] == "assistant"]
        assert len(assistant) == len(rollout.steps) == len(row.step_rewards)
        assert row.step_rewards == pytest.approx(rewards[rollout.rollout_id])
        for message, step in zip(assistant, rollout.steps):
            call = message["tool_calls"][0]["function"]
            assert call["name"] == step.tool_call.name and json.loads(call["arguments"]) == step.tool_call.arguments
        assert {t["function"]["name"] for t in json.loads(row.tools)} == set(tasks[row.task_id].allowed_tools)


def rows_of(path, record, tool_arguments=None):
    """A dataset file's rows as their records, through `load_dataset` (what TRL is given)."""
    return [record.model_validate(row) for row in load_dataset(path, tool_arguments=tool_arguments).to_list()]


def acted(rollout):
    return [(s.tool_call.model_dump(exclude={"id"}) if s.tool_call else s.action_text, s.result)
            for s in rollout.steps]


def test_dpo_pairs_have_a_margin_and_step_pairs_share_their_prefix(built):
    data_dir, result, _ = built
    dpo = rows_of(result["dpo"]["path"], DPORow)
    with Warehouse(data_dir, read_only=True) as wh:
        rollouts = {r.rollout_id: r for r in wh.load_rollouts()}
        rewards = latest_step_rewards(wh)
    kinds = {row.pair_type for row in dpo}
    assert kinds == {"trajectory", "step"}
    for row in dpo:
        chosen, rejected = rollouts[row.chosen_rollout_id], rollouts[row.rejected_rollout_id]
        assert chosen.task_id == rejected.task_id == row.task_id and chosen.success
        assert rejected.termination not in (Termination.env_fault, Termination.timeout, Termination.policy_error)
        assert row.chosen != row.rejected and row.prompt[1]["role"] == "user"
        if row.pair_type == "trajectory":
            margin = trajectory_value(chosen, rewards) - trajectory_value(rejected, rewards)
            assert margin == pytest.approx(row.margin, abs=1e-5) and margin >= 0.5
        else:
            k = row.step_index
            assert acted(chosen)[:k] == acted(rejected)[:k] and acted(chosen)[k][0] != acted(rejected)[k][0]
            assert len(row.prompt) == 2 + 2 * k
            assert [m["role"] for m in row.chosen] == [m["role"] for m in row.rejected] == ["assistant"]
            assert row.margin >= 0
    # DPO weights are shared per rejected rollout.
    per_rollout = {}
    for row in dpo:
        per_rollout.setdefault(row.rejected_rollout_id, []).append(row.weight)
    assert any(len(ws) > 1 for ws in per_rollout.values())
    for ws in per_rollout.values():
        assert max(ws) == pytest.approx(min(ws))


def test_a_higher_margin_keeps_fewer_trajectory_pairs(built, tmp_path):
    import shutil

    data_dir, result, version = built
    copy = tmp_path / "copy"
    shutil.copytree(data_dir, copy)
    strict = assemble_datasets(copy, ["inventory"], policy_version=version, min_margin=1.2, kinds=("dpo",))
    pairs = rows_of(strict["dpo"]["path"], DPORow)
    assert all(r.margin >= 1.2 for r in pairs if r.pair_type == "trajectory")
    assert strict["dpo"]["rows"] < result["dpo"]["rows"]


def test_grpo_rows_recreate_their_env(built):
    data_dir, result, _ = built
    rows = rows_of(result["grpo"]["path"], GRPORow)
    with Warehouse(data_dir, read_only=True) as wh:
        tasks = {t.task_id: t for t in wh.load_tasks()}
    assert len(rows) == sum(t.split == Split.train for t in tasks.values())
    for row in rows[:5]:
        env = envs.family(row.env_id).make()
        task = env.generate_task(row.seed, row.level)
        assert task.task_id == row.task_id
        assert env.reset(task=task).observation == row.prompt[1]["content"]


def test_assembling_again_adds_nothing(built):
    data_dir, result, version = built
    with Warehouse(data_dir, read_only=True) as wh:
        before = wh.count("dataset_rows"), wh.count("datasets")
    again = assemble_datasets(data_dir, ["inventory"], policy_version=version)
    assert {k: d["dataset_id"] for k, d in again.items()} == {k: d["dataset_id"] for k, d in result.items()}
    with Warehouse(data_dir, read_only=True) as wh:
        assert (wh.count("dataset_rows"), wh.count("datasets")) == before


@pytest.mark.training  # TRL's trainers
def test_trl_trainers_accept_the_datasets_unchanged(built, tmp_path):
    import torch
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    from tests.tasks.tiny_lm import tiny_model, tiny_tokenizer

    _, result, _ = built
    torch.set_num_threads(1)
    sft = load_dataset(result["sft"]["path"])
    dpo = load_dataset(result["dpo"]["path"])
    tokenizer = tiny_tokenizer(json.dumps(m) for m in sft["messages"][:8])
    common = dict(max_steps=1, per_device_train_batch_size=2, use_cpu=True, bf16=False, report_to=[],
                  save_strategy="no", logging_steps=1, dataset_num_proc=None, max_length=384, disable_tqdm=True)
    trainer = SFTTrainer(model=tiny_model(len(tokenizer)), train_dataset=sft, processing_class=tokenizer,
                         args=SFTConfig(output_dir=str(tmp_path / "sft"), assistant_only_loss=True, **common))
    labels = trainer.train_dataset[0]["labels"]
    assert -100 in labels and any(x != -100 for x in labels)  # assistant-only loss: observations masked
    assert trainer.train().global_step == 1
    # No length limit here: with one, TRL drops the pairs whose prompt alone fills it.
    trainer = DPOTrainer(model=tiny_model(len(tokenizer)), ref_model=tiny_model(len(tokenizer)), train_dataset=dpo,
                         processing_class=tokenizer,
                         args=DPOConfig(output_dir=str(tmp_path / "dpo"), **{**common, "max_length": None}))
    assert len(trainer.train_dataset) == len(dpo)
    assert trainer.train().global_step == 1


def test_sft_rows_list_their_negative_reward_turns(built):
    data_dir, result, _ = built
    sft = rows_of(result["sft"]["path"], SFTRow)
    with Warehouse(data_dir, read_only=True) as wh:
        rewards = latest_step_rewards(wh)
    for row in sft:
        assert row.masked_turns == [k for k, r in enumerate(rewards[row.rollout_id]) if r < 0]
    # Successes that over-reserved or repeated themselves: about half the rows of this fixture.
    assert 0 < sum(bool(row.masked_turns) for row in sft) < len(sft)


def as_written(messages):
    """Messages as the row builders wrote them (Parquet gives every message every key, None where unset)."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def test_dpo_pairs_end_on_the_assistant_turn_and_keep_their_turns(built):
    from gymfoundry.tasks.policies.chat import step_messages, turn_messages

    data_dir, result, _ = built
    dpo = rows_of(result["dpo"]["path"], DPORow)
    with Warehouse(data_dir, read_only=True) as wh:
        rollouts = {r.rollout_id: r for r in wh.load_rollouts()}
    assert {row.pair_type for row in dpo} == {"trajectory", "step"}
    for row in dpo:
        assert row.chosen[-1]["role"] == row.rejected[-1]["role"] == "assistant"
        chosen, rejected = rollouts[row.chosen_rollout_id], rollouts[row.rejected_rollout_id]
        if row.pair_type == "trajectory":  # every turn, only the last observation dropped
            assert as_written(row.chosen) == turn_messages(chosen)[:-1]
            assert as_written(row.rejected) == turn_messages(rejected)[:-1]
        else:
            k = row.step_index
            assert as_written(row.chosen) == step_messages(chosen.steps[k])[:1]
            assert as_written(row.rejected) == step_messages(rejected.steps[k])[:1]


def calls(messages):
    return [c["function"]["arguments"] for m in messages if m["role"] == "assistant" for c in m["tool_calls"]]


def test_tool_arguments_load_as_dicts_or_strings(built):
    data_dir, result, _ = built
    with Warehouse(data_dir, read_only=True) as wh:
        rollouts = {r.rollout_id: r for r in wh.load_rollouts()}
    stored, as_dicts, as_strings = (rows_of(result["sft"]["path"], SFTRow, tool_arguments=form)
                                    for form in (None, "dict", "string"))
    for row, d, s in zip(stored, as_dicts, as_strings):
        steps = rollouts[row.rollout_id].steps
        assert calls(d.messages) == [step.tool_call.arguments for step in steps]  # each call its own keys
        assert calls(s.messages) == calls(row.messages) == [json.dumps(step.tool_call.arguments, sort_keys=True)
                                                            for step in steps]
        assert d.model_copy(update={"messages": []}) == row.model_copy(update={"messages": []})
    pairs = rows_of(result["dpo"]["path"], DPORow, tool_arguments="dict")
    step_pair = next(p for p in pairs if p.pair_type == "step" and p.step_index > 0)
    for p in pairs:
        assert all(isinstance(a, dict) for messages in (p.prompt, p.chosen, p.rejected) for a in calls(messages))
    assert calls(step_pair.prompt)  # the shared prefix's calls are converted too
    with pytest.raises(ValueError, match="unknown tool_arguments 'json'"):
        load_dataset(result["sft"]["path"], tool_arguments="json")


# The tool-call line of Qwen2.5's chat template (as Llama 3.x and gpt-oss do it too): arguments through tojson.
QWEN25_LIKE = ("{%- for m in messages %}{%- if m.tool_calls %}{%- for tc in m.tool_calls %}"
               "{%- set tc = tc.function %}"
               "<tool_call>\n{\"name\": \"{{ tc.name }}\", \"arguments\": {{ tc.arguments | tojson }}}\n</tool_call>\n"
               "{%- endfor %}{%- endif %}{%- endfor %}")


def test_a_tojson_template_double_encodes_string_arguments_and_renders_dicts_right(built):
    from tests.tasks.tiny_lm import tiny_tokenizer

    _, result, _ = built
    tokenizer = tiny_tokenizer(["a b c"], vocab_size=300)
    tokenizer.chat_template = QWEN25_LIKE

    def rendered_calls(row):
        text = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        return [json.loads(block.split("\n")[1]) for block in text.split("<tool_call>")[1:]]

    stored = load_dataset(result["sft"]["path"])[0]
    as_dicts = load_dataset(result["sft"]["path"], tool_arguments="dict")[0]
    wanted = [json.loads(a) for a in calls(stored["messages"])]
    assert [c["arguments"] for c in rendered_calls(as_dicts)] == wanted
    doubled = [c["arguments"] for c in rendered_calls(stored)]
    assert doubled == calls(stored["messages"]) and all(isinstance(a, str) for a in doubled)  # a JSON string, again
    text = tokenizer.apply_chat_template(stored["messages"], tokenize=False)
    assert '"arguments": "{\\"' in text


@pytest.mark.training  # TRL's trainers
def test_trl_sft_trainer_takes_dict_arguments(built, tmp_path):
    from trl import SFTConfig, SFTTrainer

    from gymfoundry.tasks.policies.checkpoint import CHAT_TEMPLATE
    from tests.tasks.tiny_lm import tiny_model, tiny_tokenizer

    _, result, _ = built
    sft = load_dataset(result["sft"]["path"], tool_arguments="dict")
    tokenizer = tiny_tokenizer(json.dumps(m) for m in sft["messages"][:8])
    tokenizer.chat_template = CHAT_TEMPLATE  # the embedded model's: takes dicts and strings alike
    trainer = SFTTrainer(model=tiny_model(len(tokenizer)), train_dataset=sft.select(range(2)),
                         processing_class=tokenizer,
                         args=SFTConfig(output_dir=str(tmp_path), assistant_only_loss=True, max_steps=1, use_cpu=True,
                                        bf16=False, report_to=[], dataset_num_proc=None, disable_tqdm=True))
    text = tokenizer.decode(trainer.train_dataset[0]["input_ids"])
    first = sft[0]["messages"][2]["tool_calls"][0]["function"]
    assert f'"arguments": {json.dumps(first["arguments"])}' in text
