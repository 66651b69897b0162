"""Serve the factory locally on a schedule, without a work pool:

    python -m deployments.serve [--cron "0 * * * *"] [--tasks 50]

With a Prefect server running (`prefect server start`, PREFECT_API_URL set) the deployment
shows in the UI and can also be triggered from there."""

from __future__ import annotations

import argparse

from prefect import serve

from flows.factory import factory


def build_deployment(cron: str = "0 2 * * *", tasks_per_family: int = 50, data_dir: str = ".gymfoundry"):
    return factory.to_deployment(
        name="factory-local", cron=cron,
        parameters={"families": ["inventory"], "tasks_per_family": tasks_per_family, "data_dir": data_dir},
        description="The gymfoundry factory on a schedule")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cron", default="0 2 * * *")
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--data-dir", default=".gymfoundry")
    args = parser.parse_args()
    serve(build_deployment(args.cron, args.tasks, args.data_dir))


if __name__ == "__main__":
    main()
