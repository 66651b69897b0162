"""Serve the factory locally on a schedule, and training downstream of it, without a work pool:

    python -m deployments.serve [--cron "0 * * * *"] [--tasks 50]

With a Prefect server running (`prefect server start`, PREFECT_API_URL set) both deployments
show in the UI: `factory-local` on its schedule, and `train-on-new-dataset`, which the server
triggers whenever the factory announces a new SFT dataset (event `gymfoundry.dataset.ready`)."""

from __future__ import annotations

import argparse

from prefect import serve
from prefect.events import DeploymentEventTrigger

from flows.factory import DATASET_READY, factory
from flows.training import train


def build_deployment(cron: str = "0 2 * * *", tasks_per_family: int = 50, data_dir: str = ".gymfoundry"):
    return factory.to_deployment(
        name="factory-local", cron=cron,
        parameters={"families": ["inventory"], "tasks_per_family": tasks_per_family, "data_dir": data_dir},
        description="The gymfoundry factory on a schedule")


def build_training_deployment(method: str = "sft", time_limit_s: float = 900):
    trigger = DeploymentEventTrigger(
        expect={DATASET_READY},
        match={"prefect.resource.id": "gymfoundry.dataset.*", "gymfoundry.dataset.kind": method},
        parameters={"dataset": "{{ event.payload.dataset_id }}", "data_dir": "{{ event.payload.data_dir }}",
                    "method": method, "hyperparameters": {"time_limit_s": time_limit_s}})
    return train.to_deployment(name="train-on-new-dataset", triggers=[trigger],
                               description=f"{method.upper()} on each new dataset the factory announces")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cron", default="0 2 * * *")
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--data-dir", default=".gymfoundry")
    args = parser.parse_args()
    serve(build_deployment(args.cron, args.tasks, args.data_dir), build_training_deployment())


if __name__ == "__main__":
    main()
