"""Serve the factory locally on a schedule, and training downstream of it, without a work pool:

    python -m gymfoundry.deployments.serve [--cron "0 * * * *"] [--tasks 50]

With a Prefect server running (`prefect server start`, PREFECT_API_URL set) both deployments
show in the UI: `factory/factory-local` on its schedule, and `train/train-on-new-dataset-local`,
which the server triggers whenever the factory announces a new SFT dataset of at least
`--min-rows` rows (event `gymfoundry.dataset.ready`), one run at a time. The names end in
`-local` so that they never collide with the work-pool deployments of deployments/prefect.yaml
(a stopped `serve` pauses its own deployments, not those)."""

from __future__ import annotations

import argparse

from prefect import serve
from prefect.events import DeploymentEventTrigger

from gymfoundry.flows.config import FactoryConfig, TrainingConfig
from gymfoundry.flows.defaults import DEFAULT_DATA_DIR
from gymfoundry.flows.factory import DATASET_READY, factory
from gymfoundry.flows.training import train


def build_deployment(cron: str = "0 2 * * *", tasks_per_family: int = 50, data_dir: str = DEFAULT_DATA_DIR):
    parameters = FactoryConfig(tasks_per_family=tasks_per_family, data_dir=data_dir)  # refuses bad values here
    return factory.to_deployment(
        name="factory-local", cron=cron,
        parameters={"families": parameters.families, "tasks_per_family": parameters.tasks_per_family,
                    "data_dir": parameters.data_dir},
        description="The gymfoundry factory on a schedule (served by deployments/serve.py)")


def build_training_deployment(method: str = "sft", time_limit_s: float = 900, min_rows: int = 200):
    TrainingConfig(method=method, min_rows=min_rows)  # refuses bad values here
    trigger = DeploymentEventTrigger(
        name=f"train-on-new-{method}-dataset-local",
        description=f"Starts train-on-new-dataset-local for each {method.upper()} dataset the factory announces",
        expect={DATASET_READY},
        match={"prefect.resource.id": "gymfoundry.dataset.*", "gymfoundry.dataset.kind": method},
        parameters={"dataset": "{{ event.payload.dataset_id }}", "data_dir": "{{ event.payload.data_dir }}",
                    "method": method, "min_rows": min_rows, "hyperparameters": {"time_limit_s": time_limit_s}})
    return train.to_deployment(name="train-on-new-dataset-local", triggers=[trigger], concurrency_limit=1,
                               parameters={"method": method, "min_rows": min_rows},
                               description=f"{method.upper()} on each new dataset of at least {min_rows} rows the "
                                           f"factory announces (served by deployments/serve.py)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cron", default="0 2 * * *")
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    parser.add_argument("--min-rows", type=int, default=200, help="train only on datasets of at least this many rows")
    args = parser.parse_args()
    serve(build_deployment(args.cron, args.tasks, args.data_dir), build_training_deployment(min_rows=args.min_rows))


if __name__ == "__main__":
    main()
