"""Installing gymfoundry shadows no other distribution's import name: its folders install under one
namespace (`gymfoundry.envs`, `gymfoundry.verifiers`, ...), so PrimeIntellect's `verifiers`, installed in
the same environment (a dev dependency), imports beside it in one process."""

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("envs", "verifiers", "warehouse", "tasks", "flows", "deployments")

PROBE = """
import importlib.metadata, importlib.util, json
import verifiers
import gymfoundry.verifiers.rules, gymfoundry.envs.records
from gymfoundry.flows.cli import main
print(json.dumps({
    "verifiers": verifiers.__file__,
    "verifiers_dist": importlib.metadata.distribution("verifiers").metadata["Name"],
    "ours": gymfoundry.verifiers.rules.__file__,
    "bare": {name: importlib.util.find_spec(name) is not None for name in %r if name != "verifiers"},
}))
""" % (FOLDERS,)


def test_gymfoundry_and_primeintellects_verifiers_import_side_by_side(tmp_path):
    # -I: no current directory on the path, so only what is installed counts (not this checkout's folders)
    done = subprocess.run([sys.executable, "-I", "-c", PROBE], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["verifiers_dist"] == "verifiers"
    assert "site-packages" in Path(seen["verifiers"]).parts  # theirs, installed; not this checkout's folder
    assert Path(seen["ours"]).resolve() == ROOT / "verifiers" / "rules.py"
    assert seen["bare"] == {name: False for name in FOLDERS if name != "verifiers"}


def test_the_distribution_declares_one_top_level_name():
    dist = importlib.metadata.distribution("gymfoundry")
    top = (dist.read_text("top_level.txt") or "").split()
    assert top == ["gymfoundry"]  # never a folder's bare name
    assert dist.entry_points.select(group="console_scripts")["gymfoundry"].value == "gymfoundry.flows.cli:main"


def test_inside_the_test_session_verifiers_is_still_theirs():
    """The root conftest names the families' test folders for pytest; it aliases nothing else, so here
    too `verifiers` is the distribution installed under that name."""
    import verifiers

    assert "site-packages" in Path(verifiers.__file__).parts
    assert Path(verifiers.__file__).resolve() != ROOT / "verifiers" / "__init__.py"
