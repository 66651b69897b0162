"""One typed configuration per flow (flows/config.py): the deployment form shows its descriptions
and enums, prefect.yaml and serve.py are valid for it, deploying checks the working directory, and
served deployments never collide with the work-pool ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gymfoundry.deployments import check
from gymfoundry.flows.config import EvaluationConfig, FactoryConfig, TrainingConfig
from gymfoundry.flows.evaluation import evaluate
from gymfoundry.flows.factory import factory
from gymfoundry.flows.training import train

ROOT = Path(__file__).resolve().parents[2]
PREFECT_FILE = ROOT / "deployments" / "prefect.yaml"


@pytest.mark.parametrize("flow, config", [(factory, FactoryConfig), (evaluate, EvaluationConfig),
                                          (train, TrainingConfig)])
def test_the_flow_parameters_are_the_configuration_fields_with_descriptions(flow, config):
    properties = flow.parameters.model_dump()["properties"]
    assert list(properties) == list(config.model_fields)
    for name, field in config.model_fields.items():
        assert properties[name]["description"] == field.description, name


def test_the_deployment_form_has_enums_and_bounds():
    properties = factory.parameters.model_dump()["properties"]
    assert properties["task_runner"]["enum"] == ["threads", "dask", "ray"]
    assert properties["learnability"]["enum"] == ["p(1-p)", "1-p", "uniform"]
    assert properties["tasks_per_family"]["minimum"] == 1 and properties["tasks_per_family"]["default"] == 50
    assert properties["mistake_rate"]["maximum"] == 1


def test_prefect_refuses_a_bad_parameter_before_the_flow_runs():
    from prefect.exceptions import ParameterTypeError

    with pytest.raises(ParameterTypeError):
        factory.validate_parameters({"tasks_per_family": 0})
    assert factory.validate_parameters({"tasks_per_family": "7"})["tasks_per_family"] == 7


def test_every_deployment_in_prefect_yaml_is_valid_for_its_flow():
    assert check.problems(PREFECT_FILE, home=str(ROOT)) == []


def test_deploying_checks_the_working_directory_and_the_parameters(tmp_path):
    assert check.problems(PREFECT_FILE, home="") == [
        "GYMFOUNDRY_HOME is not set: set it to the repository's path on the workers (the pull step runs each flow "
        "from there)"]
    assert check.problems(PREFECT_FILE, home=str(tmp_path)) == [
        f"GYMFOUNDRY_HOME={tmp_path} is not a gymfoundry checkout (no flows/factory.py there)"]
    bad = yaml.safe_load(PREFECT_FILE.read_text())
    bad["deployments"][0]["parameters"]["families"] = ["nosuch"]
    bad["deployments"][0]["parameters"]["task_runner"] = "spark"
    path = tmp_path / "prefect.yaml"
    path.write_text(yaml.safe_dump(bad))
    (problem,) = check.problems(path, home=str(ROOT))
    assert problem.startswith("factory-nightly: --families: unknown family 'nosuch'; known families: ")
    assert "--task-runner: Input should be 'threads', 'dask' or 'ray' (got 'spark')" in problem
    trains = yaml.safe_load(PREFECT_FILE.read_text())
    trains["deployments"][0]["parameters"]["train_after"] = "sft"  # valid for the loop flow, refused on the factory
    path.write_text(yaml.safe_dump(trains))
    assert check.problems(path, home=str(ROOT)) == [
        "factory-nightly: train_after: the factory flow does not train; deploy flows/loop.py:factory_then_train "
        "for a run that trains after"]
    steps = yaml.safe_load(PREFECT_FILE.read_text())["build"]
    assert steps == [{"prefect.deployments.steps.run_shell_script": {
        "id": "check", "script": "python -m gymfoundry.deployments.check", "stream_output": True}}]


def test_served_and_work_pool_deployments_never_share_a_name():
    from gymfoundry.deployments.serve import build_deployment, build_training_deployment

    in_yaml = {d["name"] for d in yaml.safe_load(PREFECT_FILE.read_text())["deployments"]}
    served = [build_deployment(), build_training_deployment()]
    assert not {d.name for d in served} & in_yaml
    training = served[1]
    assert training.concurrency_limit == 1 and training.parameters["min_rows"] == 200
    (trigger,) = training.triggers
    assert trigger.name and trigger.description


def test_the_training_trigger_in_prefect_yaml_has_a_minimum_and_a_limit():
    (deployment,) = [d for d in yaml.safe_load(PREFECT_FILE.read_text())["deployments"]
                     if d["name"] == "train-on-new-dataset"]
    assert deployment["concurrency_limit"] == 1 and deployment["parameters"]["min_rows"] == 200
    (trigger,) = deployment["triggers"]
    assert trigger["name"] and trigger["description"]


@pytest.mark.usefixtures("prefect_harness")
def test_a_dataset_below_min_rows_completes_without_training(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "sft-small.parquet"
    pq.write_table(pa.table({"task_id": ["t-1", "t-2", "t-3"]}), path)
    out = train(dataset=str(path), method="sft", data_dir=str(tmp_path), min_rows=4)
    assert out == {"skipped": "3 rows < min_rows 4", "dataset": str(path), "rows": 3}
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "models").exists()
