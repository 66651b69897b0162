"""What an operator sees in the Prefect UI, read back through Prefect's client from a real local
server: a factory run's families as subflows named and tagged by family, with named task runs and
table and image artifacts; a training run with its stages as named task runs; and no library
output (Python bytecode from `datasets`) in any log."""

from __future__ import annotations

import re
import time

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, \
    FlowRunFilterId, LogFilter, LogFilterFlowRunId
from prefect.settings import PREFECT_API_URL, temporary_settings

from gymfoundry.flows.factory import factory
from gymfoundry.flows.training import train
from tests.deployments.test_trigger_e2e import events_sent_to, running_server

BYTECODE = re.compile(r"\b(RESUME|LOAD_GLOBAL|LOAD_FAST|LOAD_CONST|RETURN_VALUE|CALL_FUNCTION)\b")


pytestmark = pytest.mark.integration  # a Prefect server in a subprocess, a factory run and a training run


@pytest.fixture(scope="module")
def recording_server(tmp_path_factory):
    """A Prefect server of its own that records task runs (from their events) and logs. Tagged
    task runs start Prefect's process-wide concurrency-slot services with a client of this
    server: they are drained before it stops, or later tests' tagged runs would call a dead API."""
    from prefect.concurrency.services import ConcurrencySlotAcquisitionService, \
        ConcurrencySlotAcquisitionWithLeaseService

    with running_server(tmp_path_factory.mktemp("prefect-ui"), TASK_RUN_RECORDER=True, TRIGGERS=False) as api_url:
        try:
            yield api_url
        finally:
            for service in (ConcurrencySlotAcquisitionService, ConcurrencySlotAcquisitionWithLeaseService):
                service.drain_all(timeout=10)


def children(client, parent_id):
    """Flow runs whose parent task run belongs to `parent_id`'s flow run (its subflows)."""
    task_ids = {t.id for t in client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[parent_id])))}
    return [r for r in client.read_flow_runs() if r.parent_task_run_id in task_ids]


def settle(client, flow_run_id, names: set[str], timeout_s: float = 30):
    """Task runs are recorded from events a little after they end: wait until `names` are all there."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        if names <= {r.name for r in runs} or time.monotonic() > deadline:
            return runs
        time.sleep(0.5)


def logs_of(client, flow_run_ids) -> list[str]:
    return [log.message for log in client.read_logs(log_filter=LogFilter(
        flow_run_id=LogFilterFlowRunId(any_=list(flow_run_ids))))]


def test_a_factory_run_and_a_training_run_are_legible_in_the_ui(recording_server, tmp_path):
    data_dir = str(tmp_path / "data")
    # task runs are recorded from their events: the process-wide events worker must send them here
    with temporary_settings({PREFECT_API_URL: recording_server}), events_sent_to(recording_server):
        state = factory(families=["inventory", "coding"], tasks_per_family=3, samples_per_task=1, seed=2,
                        data_dir=data_dir, batch_size=2, return_state=True)
        report = state.result()
        trained = train(method="sft", dataset=report["datasets"]["sft"]["dataset_id"], data_dir=data_dir,
                        base_config={"vocab_size": 400, "hidden_size": 32, "layers": 1, "heads": 2, "copy_steps": 2},
                        hyperparameters={"max_steps": 2, "batch_size": 2}, return_state=True)
        assert trained.is_completed()
        with get_client(sync_client=True) as client:
            parent = client.read_flow_run(state.state_details.flow_run_id)
            families = {r.name: r for r in children(client, parent.id)}
            assert set(families) == {"inventory", "coding"}
            for name, run in families.items():
                assert f"family:{name}" in run.tags
                stages = {t.name for t in settle(client, run.id, {f"{name} · generate", f"{name} · score"})}
                assert {f"{name} · generate", f"{name} · validate", f"{name} · isolate", f"{name} · score"} <= stages
                assert f"{name} · rollout 1/2" in stages and f"{name} · rollout 2/2" in stages
            artifacts = {a.key: a.type for a in client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[parent.id])))}
            assert artifacts["success-by-level"] == "table" and artifacts["failure-classes"] == "table"
            assert artifacts["success-by-level-chart"] == "image" and artifacts["factory-report"] == "markdown"
            progress = {a.key: a for a in client.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[r.id for r in families.values()])))}
            assert {k: (a.type, a.data) for k, a in progress.items() if a.type == "progress"} == \
                {"inventory-rollouts": ("progress", 100.0), "coding-rollouts": ("progress", 100.0)}

            training = client.read_flow_run(trained.state_details.flow_run_id)
            stages = {t.name for t in settle(client, training.id, {"build-base", "copy-pretraining", "train-model",
                                                                   "land-training-run"})}
            assert {"build-base", "copy-pretraining", "train-model", "land-training-run"} <= stages
            lines = logs_of(client, [parent.id, training.id, *(r.id for r in families.values())])
    assert lines and not [line for line in lines if BYTECODE.search(line)]
