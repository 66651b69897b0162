"""The defaults the flows, the CLI and the deployments share, each written once: where the
warehouse lives when no data dir is named, and the environment a process that runs flows gives
Prefect (and the trainers). Nothing here imports anything slow: the CLI reads it to build its
options."""

from __future__ import annotations

import os

DEFAULT_DATA_DIR = ".gymfoundry"
LOOP_DATA_DIR = f"{DEFAULT_DATA_DIR}-loop"  # the closed loop's own warehouse, beside the factory's

PREFECT_ENV = {
    # A cold ephemeral Prefect server can need 20 s to start on a small machine.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}
HUB_OFFLINE_ENV = {"HF_HUB_OFFLINE": "1"}  # models are local checkpoints: never ask the Hub


def prefect_defaults(hub_offline: bool = True) -> None:
    """Set the defaults before Prefect is imported (it reads its settings then); a variable the
    environment already sets keeps its value. `hub_offline`: also keep Hugging Face off the network
    (every command: a model is a local checkpoint, nothing downloads weights at run time)."""
    for name, value in {**PREFECT_ENV, **(HUB_OFFLINE_ENV if hub_offline else {})}.items():
        os.environ.setdefault(name, value)
