"""The training trigger end to end: a real Prefect server turns the factory's dataset event into a
flow run of `train-on-new-dataset`, with the dataset and data dir taken from the event."""

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.client.schemas.objects import StateType
from prefect.events.clients import PrefectEventsClient
from prefect.events.worker import EventsWorker
from prefect.settings import PREFECT_API_URL, temporary_settings

from gymfoundry.deployments.serve import build_training_deployment
from gymfoundry.flows.factory import announce_dataset

SERVER_STARTUP_TIMEOUT_S = 60
FLOW_RUN_TIMEOUT_S = 60
SECOND_RUN_GRACE_S = 5
# The triggers service evaluates automations and runs their actions (here: create a flow run);
# the event persister stores the events. The other services only cost CPU in this test.
SERVICES_ENABLED = {"TRIGGERS": True, "EVENT_PERSISTER": True, "SCHEDULER": False, "LATE_RUNS": False,
                    "FOREMAN": False, "CANCELLATION_CLEANUP": False, "PAUSE_EXPIRATIONS": False,
                    "REPOSSESSOR": False, "TASK_RUN_RECORDER": False, "EVENT_LOGGER": False,
                    "CLEANUP_RECONCILER": False}


pytestmark = pytest.mark.integration  # a Prefect server in a subprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(home: Path, port: int) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    env.update({f"PREFECT_SERVER_SERVICES_{name}_ENABLED": str(on).lower() for name, on in SERVICES_ENABLED.items()})
    env.update({"PREFECT_HOME": str(home), "OMP_NUM_THREADS": "1",
                "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
                # `--port` alone is not enough: settings derived from the server's address read these.
                "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_API_PORT": str(port),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_UI_ENABLED": "false"})
    return env


def wait_until_healthy(server: subprocess.Popen, api_url: str, log: Path) -> None:
    deadline = time.monotonic() + SERVER_STARTUP_TIMEOUT_S
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"{api_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    state = f"exited with {server.returncode}" if server.poll() is not None else \
        f"not healthy after {SERVER_STARTUP_TIMEOUT_S} s"
    pytest.fail(f"Prefect server at {api_url} {state}; its log ends:\n{log.read_text()[-3000:]}")


@contextmanager
def running_server(home: Path, **services: bool):
    """A Prefect server of its own (database, home, port) with SERVICES_ENABLED updated by
    `services`; its API URL; killed with its children afterwards."""
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = server_env(home, port)
    env.update({f"PREFECT_SERVER_SERVICES_{name}_ENABLED": str(on).lower() for name, on in services.items()})
    log = home / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until_healthy(server, api_url, log)
        yield api_url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("prefect-server")) as api_url:
        yield api_url


@contextmanager
def events_sent_to(api_url: str):
    """`emit_event` hands events to one process-wide worker, which may already be bound to the
    session's test harness; give it a client for this server and flush it when done."""
    EventsWorker.set_client_override(PrefectEventsClient, api_url=api_url)
    try:
        yield
    finally:
        EventsWorker.instance().drain()
        EventsWorker.set_client_override(None)


def flow_runs(deployment_id):
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))


def wait_for_a_flow_run(deployment_id) -> None:
    deadline = time.monotonic() + FLOW_RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        if flow_runs(deployment_id):
            return
        time.sleep(0.5)
    pytest.fail(f"no flow run of train-on-new-dataset within {FLOW_RUN_TIMEOUT_S} s of the SFT dataset event")


def test_an_sft_dataset_event_creates_a_training_run_and_a_dpo_one_does_not(prefect_server, tmp_path):
    def dataset(dataset_id):
        return {"dataset_id": dataset_id, "rows": 3, "path": str(tmp_path / f"{dataset_id}.parquet")}

    with temporary_settings({PREFECT_API_URL: prefect_server}), events_sent_to(prefect_server):
        deployment_id = build_training_deployment().apply()
        announce_dataset("dpo", dataset("dpo-e2e"), str(tmp_path), "run-e2e")
        announce_dataset("sft", dataset("sft-e2e"), str(tmp_path), "run-e2e")
        wait_for_a_flow_run(deployment_id)
        # The server evaluates the DPO event first, but runs triggered actions concurrently: a run the DPO
        # event wrongly started can land seconds after the SFT one (the two contend for SQLite).
        time.sleep(SECOND_RUN_GRACE_S)
        runs = flow_runs(deployment_id)

    assert [run.parameters.get("dataset") for run in runs] == ["sft-e2e"]  # and none for the DPO dataset
    (run,) = runs
    assert run.state_type == StateType.SCHEDULED
    assert run.parameters == {"dataset": "sft-e2e", "data_dir": str(tmp_path.resolve()), "method": "sft",
                              "min_rows": 200, "hyperparameters": {"time_limit_s": 900}}
