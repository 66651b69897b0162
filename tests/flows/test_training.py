import datasets
import pytest

from gymfoundry.flows.evaluation import evaluate
from gymfoundry.flows.factory import factory
from gymfoundry.flows.training import train
from gymfoundry.tasks.training.base_model import build_base_model, factory_texts
from gymfoundry.warehouse import Warehouse

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(scope="module")
def factory_run(tmp_path_factory, prefect_harness):
    data_dir = tmp_path_factory.mktemp("training")
    report = factory(families=["inventory"], tasks_per_family=20, seed=2, data_dir=str(data_dir))
    base = build_base_model(data_dir / "base", factory_texts("inventory", n_tasks=8), vocab_size=400,
                            hidden_size=32, layers=1, heads=2)
    return data_dir, report, str(base)


@pytest.mark.parametrize("method", ["sft", "dpo"])
def test_train_writes_a_checkpoint_and_a_training_run_row(factory_run, method):
    data_dir, report, base = factory_run
    dataset = report["datasets"][method]
    run = train(dataset=dataset["dataset_id"], method=method, base_model=base, data_dir=str(data_dir),
                hyperparameters={"max_steps": 2, "batch_size": 2, "max_length": 768, "logging_steps": 1})
    assert run["landed"] == {"training_runs": 1} and run["dataset_id"] == dataset["dataset_id"]
    metrics = run["metrics"]
    assert metrics["steps"] == 2 and metrics["final_loss"] is not None and metrics["seconds_per_step"] > 0
    with Warehouse(data_dir, read_only=True) as wh:
        (row,) = wh.sql("select * from training_runs where run_id = ?", [run["run_id"]]).to_pylist()
    assert row["method"] == method and row["families"] == ["inventory"] and row["checkpoint"] == run["checkpoint"]
    assert datasets.Dataset.from_parquet(dataset["path"]).num_rows == dataset["rows"]


def test_evaluate_lands_heldout_rollouts_with_tokens(factory_run):
    data_dir, _, base = factory_run
    report = evaluate(model=base, family="inventory", data_dir=str(data_dir), limit=2, max_new_tokens=4)
    assert report["episodes"] == 2 and report["success_rate"] == 0.0 and report["landed"]["rollouts"] == 2
    with Warehouse(data_dir, read_only=True) as wh:
        rollouts = wh.load_rollouts("policy_id = ?", [report["policy_id"]])
        splits = {t.split.value for t in wh.load_tasks(f"task_id in (select task_id from rollouts where policy_id = "
                                                        f"'{report['policy_id']}')")}
    assert len(rollouts) == 2 and splits <= {"test", "val"}
    assert all(s.token_ids and s.logprobs and s.policy_version == report["policy_version"]
               for r in rollouts for s in r.steps)
    again = evaluate(model=base, family="inventory", data_dir=str(data_dir), limit=2, max_new_tokens=4)
    assert again["landed"]["rollouts"] == 0 and again["success_rate"] == report["success_rate"]  # read back


def test_grpo_flow_lands_its_episodes_and_run(factory_run):
    data_dir, _, base = factory_run
    run = train(method="grpo", base_model=base, data_dir=str(data_dir),
                hyperparameters={"max_steps": 1, "num_generations": 2, "max_completion_length": 4, "tasks": 1,
                                 "slack_steps": 0})
    assert run["landed"] == {"training_runs": 1} and run["metrics"]["landed_rollouts"]["rollouts"] == 2
    with Warehouse(data_dir, read_only=True) as wh:
        rollouts = wh.load_rollouts("policy_id like 'grpo:%'")
    assert len(rollouts) == 2 and all(s.token_ids for r in rollouts for s in r.steps)


def test_closed_loop_trains_every_arm_for_the_same_time(tmp_path):
    from gymfoundry.flows.loop import closed_loop

    figures = closed_loop(data_dir=str(tmp_path), tasks=10, eval_limit=1, train_seconds=60, grpo_seconds=20,
                          hyperparameters={"max_steps": 1, "batch_size": 1, "max_length": 512},
                          grpo_hyperparameters={"max_steps": 1, "num_generations": 2, "max_completion_length": 4,
                                                "tasks": 1, "slack_steps": 0},
                          base={"vocab_size": 400, "hidden_size": 32, "layers": 1, "heads": 2, "copy_steps": 2})
    runs = figures["runs"]
    assert figures["copy_pretraining"]["steps"] == 2
    assert list(runs) == ["sft", "sft_weighted", "sft_then_grpo"] and figures["heldout_episodes"] == 1
    assert [r["steps"] for r in runs.values()] == [[1], [1], [1, 1]]
    assert all(r["success_rate"] is not None for r in runs.values())
    with Warehouse(tmp_path, read_only=True) as wh:
        methods = sorted(r["method"] for r in wh.sql("select method from training_runs").to_pylist())
    assert methods == ["grpo", "sft", "sft", "sft"]
    with pytest.raises(ValueError, match="unknown arms"):
        closed_loop(data_dir=str(tmp_path), arms=["rlhf"])
