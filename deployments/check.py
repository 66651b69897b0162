"""Checks `prefect deploy` runs before it registers anything (the build step of
deployments/prefect.yaml), so a deployment that cannot run fails at deploy time, not at 2 am:

- `GYMFOUNDRY_HOME` is set and is this repository (workers `cd` there before each run);
- every deployment's parameters are valid for its flow's typed configuration (flows/config.py).

    python -m gymfoundry.deployments.check [--prefect-file deployments/prefect.yaml]

Exit 0 and one line per deployment, or exit 1 with one line per problem."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

from gymfoundry.flows.config import Config, EvaluationConfig, FactoryConfig, TrainingConfig, explain

CONFIGS: dict[str, type[Config]] = {"flows/factory.py:factory": FactoryConfig,
                                    "flows/loop.py:factory_then_train": FactoryConfig,
                                    "flows/evaluation.py:evaluate": EvaluationConfig,
                                    "flows/training.py:train": TrainingConfig}
PREFECT_FILE = Path(__file__).with_name("prefect.yaml")


def problems(prefect_file: Path = PREFECT_FILE, home: str | None = None) -> list[str]:
    found = []
    home = os.environ.get("GYMFOUNDRY_HOME") if home is None else home
    if not home:
        found.append("GYMFOUNDRY_HOME is not set: set it to the repository's path on the workers "
                     "(the pull step runs each flow from there)")
    elif not (Path(home) / "flows" / "factory.py").is_file():
        found.append(f"GYMFOUNDRY_HOME={home} is not a gymfoundry checkout (no flows/factory.py there)")
    for deployment in yaml.safe_load(prefect_file.read_text())["deployments"]:
        name, entrypoint = deployment["name"], deployment["entrypoint"]
        config = CONFIGS.get(entrypoint)
        if config is None:
            found.append(f"{name}: no typed configuration for entrypoint {entrypoint}")
            continue
        params = deployment.get("parameters") or {}
        templated = {k for trigger in deployment.get("triggers") or [] for k in (trigger.get("parameters") or {})}
        try:  # values a trigger fills from its event are checked by the flow when it runs
            config(**{k: v for k, v in params.items() if k not in templated})
        except ValidationError as exc:
            found.append(f"{name}: {explain(exc, config)}")
            continue
        if entrypoint == "flows/factory.py:factory" and params.get("train_after"):
            found.append(f"{name}: train_after: the factory flow does not train; deploy "
                         "flows/loop.py:factory_then_train for a run that trains after")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefect-file", type=Path, default=PREFECT_FILE)
    args = parser.parse_args(argv)
    found = problems(args.prefect_file)
    for line in found:
        print(f"deployments.check: {line}", file=sys.stderr)
    if not found:
        print(f"deployments.check: {args.prefect_file}: every deployment's parameters are valid; "
              f"GYMFOUNDRY_HOME={os.environ['GYMFOUNDRY_HOME']}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
