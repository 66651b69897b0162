"""pytest names a family's own tests (envs/<family>/tests/) by their folders, `envs.<family>.tests...`;
the project is installed as `gymfoundry.envs...`. So that such a test module and the family it tests are
one module each, not two copies, a folder's bare name is an alias of its installed module here.
The fixtures here serve every test folder, the families' included."""

import importlib
import importlib.abc
import importlib.util
import sys

import pytest

from gymfoundry.flows.defaults import prefect_defaults

prefect_defaults(hub_offline=True)  # before any test imports Prefect

FOLDERS = ("envs", "verifiers", "warehouse", "tasks", "flows", "deployments")


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in FOLDERS:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(f"gymfoundry.{spec.name}")

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Alias())


@pytest.fixture(scope="session")
def prefect_harness():
    """One ephemeral Prefect API for the whole session (a cold start can take 20 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
