"""Training runs downstream of the factory: an event per new dataset that a deployment trigger
matches (under a Prefect server), or in ad-hoc mode the loop's flow that runs the factory, then
training (the factory never trains)."""

from pathlib import Path

import pytest
import yaml
from prefect.events import DeploymentEventTrigger

import gymfoundry.flows.factory as factory_module
from gymfoundry.deployments.serve import build_training_deployment
from gymfoundry.flows.factory import DATASET_READY, announce_dataset
from gymfoundry.flows.loop import factory_then_train
from gymfoundry.warehouse import Warehouse

pytestmark = pytest.mark.usefixtures("prefect_harness")
PREFECT_YAML = Path(__file__).resolve().parents[2] / "deployments" / "prefect.yaml"


def test_factory_announces_each_dataset_and_can_train_after(tmp_path, monkeypatch):
    announced = []
    monkeypatch.setattr(factory_module, "announce_dataset", lambda kind, d, data_dir, run_id: announced.append(
        (kind, d["dataset_id"], data_dir)))
    monkeypatch.setattr("gymfoundry.flows.training.DEFAULT_BASE", {"vocab_size": 400, "hidden_size": 32, "layers": 1, "heads": 2})
    report = factory_then_train(families=["inventory"], tasks_per_family=8, seed=4, data_dir=str(tmp_path),
                                train_after="sft", train_hyperparameters={"max_steps": 1, "batch_size": 1, "max_length": 512})
    expected = [(kind, d["dataset_id"], str(tmp_path)) for kind, d in report["datasets"].items() if d["rows"]]
    assert announced == expected and any(kind == "sft" for kind, _, _ in announced)
    training = report["training"]
    assert training["dataset_id"] == report["datasets"]["sft"]["dataset_id"] and training["metrics"]["steps"] == 1
    with Warehouse(tmp_path, read_only=True) as wh:
        assert wh.sql("select dataset_id from training_runs").to_pylist() == [{"dataset_id": training["dataset_id"]}]


def test_the_factory_alone_refuses_train_after_before_any_run(tmp_path):
    """Only factory-then-train trains: a factory run given train_after (a deployment, a Python call) is
    refused whole rather than recorded as training and left without its artifacts."""
    with pytest.raises(ValueError, match="factory does not train: train_after='sft' is for the factory-then-train"):
        factory_module.factory(families=["inventory"], tasks_per_family=2, data_dir=str(tmp_path), train_after="sft")
    assert not (tmp_path / "catalog.duckdb").exists()


def triggers_to_check():
    served = build_training_deployment().triggers[0]
    (deployment,) = [d for d in yaml.safe_load(PREFECT_YAML.read_text())["deployments"]
                     if d["name"] == "train-on-new-dataset"]
    (declared,) = deployment["triggers"]
    declared = DeploymentEventTrigger(**{k: v for k, v in declared.items() if k != "type"})
    return [served, declared]


@pytest.mark.parametrize("trigger", triggers_to_check(), ids=["serve", "prefect.yaml"])
def test_the_training_trigger_matches_the_factorys_event(trigger, tmp_path):
    dataset = {"dataset_id": "sft-abc123", "rows": 3, "path": str(tmp_path / "sft-abc123.parquet")}
    event = announce_dataset("sft", dataset, str(tmp_path), "run-1")
    assert event.event == DATASET_READY and event.event in trigger.expect
    assert trigger.match.matches(event.resource)
    assert event.payload["dataset_id"] == "sft-abc123" and event.payload["data_dir"] == str(tmp_path.resolve())
    assert trigger.parameters["dataset"] == "{{ event.payload.dataset_id }}"
    other = announce_dataset("dpo", {**dataset, "dataset_id": "dpo-abc123"}, str(tmp_path), "run-1")
    assert not trigger.match.matches(other.resource)  # an SFT trainer is not started by a DPO dataset
