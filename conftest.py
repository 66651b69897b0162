"""pytest names a family's own tests (envs/<family>/tests/) by their folders, `envs.<family>.tests...`;
the project is installed as `gymfoundry.envs...`. So that such a test module and the family it tests are
one module each, not two copies, `envs` is an alias of its installed module here; the other folders'
bare names resolve as installed (never this checkout's folder). The fixtures here serve every test
folder, the families' included; the tiers are assigned at the end."""

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

import pytest

from gymfoundry.flows.defaults import prefect_defaults

prefect_defaults(hub_offline=True)  # before any test imports Prefect

from gymfoundry.envs.check import check_family  # noqa: E402  (after the defaults above: it loads the project)
from tests.sandbox_guard import needs_sandbox  # noqa: E402

FOLDERS = ("envs", "verifiers", "warehouse", "tasks", "flows", "deployments")
ROOT = os.path.dirname(os.path.realpath(__file__))


class _Names(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`envs...` is an alias of `gymfoundry.envs...` (pytest's name for a family's test folder); any other
    folder's bare name resolves as where the project is installed: never this checkout's folder (which
    pytest's path would otherwise offer first), so `verifiers` is whoever installed that name."""

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if top == "envs":
            return importlib.util.spec_from_loader(fullname, self)
        if top in FOLDERS and path is None:
            elsewhere = [p for p in sys.path if os.path.realpath(p or ".") != ROOT]
            spec = importlib.machinery.PathFinder.find_spec(fullname, elsewhere)
            if spec is None:
                raise ModuleNotFoundError(f"No module named {fullname!r} (this checkout's folder is "
                                          f"gymfoundry.{fullname})", name=fullname)
            return spec
        return None

    def create_module(self, spec):
        return importlib.import_module(f"gymfoundry.{spec.name}")

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Names())


@pytest.fixture(scope="session")
def prefect_harness():
    """One ephemeral Prefect API for the whole session (a cold start can take 20 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def conformance():
    """`conformance(name)`: the family's conformance report (`check_family`, 3 seeds per level), run
    once per session, so tests/envs/test_check_family.py and the family's own tests share one run."""
    return functools.cache(check_family)


# -- test tiers (docs/architecture.md, "Tests and their tiers") ------------------------------------
# Every test is in exactly one tier. A test or module marked with a tier keeps it; a sandbox-guarded
# test (tests/sandbox_guard.py) is `sandbox`; else one using the tiny model is `training`, one using
# the Prefect server `integration`; everything else is `unit`, the tier `make test-fast` runs.
TIERS = ("unit", "integration", "sandbox", "training")
BY_FIXTURE = {"tiny_model_dir": "training", "prefect_harness": "integration"}


def tier_of(item: pytest.Item) -> str:
    marked = {m.name for m in item.iter_markers() if m.name in TIERS}
    if any(m == needs_sandbox.mark for m in item.iter_markers("skipif")):
        marked.add("sandbox")
    if len(marked) > 1:
        raise pytest.UsageError(f"{item.nodeid} is marked with {len(marked)} tiers ({', '.join(sorted(marked))}); "
                                f"give it one")
    if marked:
        return marked.pop()
    return next((tier for fixture, tier in BY_FIXTURE.items() if fixture in item.fixturenames), "unit")


def pytest_collection_modifyitems(items):
    for item in items:
        tier = tier_of(item)
        if not item.get_closest_marker(tier):
            item.add_marker(tier)
