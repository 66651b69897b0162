"""`gymfoundry new-family NAME`: the family it writes passes the conformance checks unchanged,
runs through the factory with a mix of outcomes, passes its own tests, and lives in one folder;
a bad or taken name is refused and nothing is written. Families are scaffolded into temporary
folders (on sys.path, or a copy of the envs package), never into this checkout's envs/."""

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gymfoundry.envs.check import CHECKS, check_family
from gymfoundry.envs.family import add, remove
from gymfoundry.envs.scaffold import ENVS_DIR, TEMPLATES, ScaffoldError, new_family
from gymfoundry.flows.cli import main
from gymfoundry.tasks.stages.audit import audit_family

ROOT = Path(__file__).resolve().parents[2]
NAME = "scaffolded_notes"  # a top-level package name nothing else uses


@pytest.fixture
def scaffolded(tmp_path, monkeypatch):
    """The family NAME written into tmp_path, imported from there and registered; unregistered after."""
    folder = new_family(NAME, tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    fam = importlib.import_module(NAME).FAMILY
    add(fam)
    yield folder, fam
    remove(NAME)
    for module in [m for m in sys.modules if m == NAME or m.startswith(NAME + ".")]:
        del sys.modules[module]


def test_the_scaffold_is_one_folder_that_passes_every_check_unchanged(scaffolded):
    folder, fam = scaffolded
    written = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert written == sorted(rel.replace("NAME", NAME) for rel in TEMPLATES)
    assert fam.tool_names == ["read", "write", "submit"] and fam.levels == (1, 2, 3, 4, 5)
    report = check_family(NAME)
    assert report.ok, report.render()
    assert [c.status for c in report.checks] == ["pass"] * len(CHECKS), report.render()
    audit = audit_family(NAME, episodes=1)
    assert audit.ok, audit.render()
    # the verifier and the scripted policy are classes of the family's folder
    assert (fam.verifier.__module__, fam.verifier.__name__) == (f"{NAME}.verifier", "ScaffoldedNotesVerifier")
    assert (fam.scripted_policy.__module__, fam.scripted_policy.__name__) == (f"{NAME}.policy", "ScaffoldedNotesPolicy")
    assert str(folder) in fam.masked_dirs()


@pytest.mark.integration  # pytest and the CLI in subprocesses
def test_its_own_tests_pass(scaffolded):
    folder, _ = scaffolded
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder.parent), str(ROOT)])}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder / "tests")],
                         capture_output=True, text=True, timeout=120, env=env, cwd=folder.parent)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "3 passed" in out.stdout


def test_a_short_factory_run_lands_its_rollouts_with_mixed_outcomes(scaffolded, tmp_path, prefect_harness):
    from gymfoundry.flows.factory import factory

    report = factory(families=[NAME], tasks_per_family=10, seed=3, data_dir=str(tmp_path / "data"))
    terminations = {r["termination"]: r["rollouts"] for r in report["summary"] if r["task_family"] == NAME}
    assert {"success", "failure"} <= set(terminations), report["summary"]
    assert sum(terminations.values()) == report["landed"]["rollouts"] > 0 and not report["quarantined"]


@pytest.mark.integration  # pytest and the CLI in subprocesses
def test_written_into_the_envs_package_it_is_a_builtin_family(tmp_path):
    """In a copy of the envs package: `new-family` then `check-family` from the command line; the
    copy changes only inside the new folder."""
    # gymfoundry is a namespace: a portion earlier on the path holding envs/ is gymfoundry.envs, the
    # other folders still come from the checkout, which stays untouched
    copy = tmp_path / "gymfoundry"
    shutil.copytree(ENVS_DIR, copy / "envs", ignore=shutil.ignore_patterns("__pycache__"))
    before = {p.relative_to(copy) for p in (copy / "envs").rglob("*")}
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cli = [sys.executable, "-c", "import sys; from gymfoundry.flows.cli import main; sys.exit(main())"]
    made = subprocess.run(cli + ["new-family", "probe"], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    assert f"wrote family 'probe' in {copy / 'envs' / 'probe'}/" in made.stdout
    checked = subprocess.run(cli + ["check-family", "probe"], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "family probe (gymfoundry/probe-v0) passes" in checked.stdout
    assert "gameability audit of probe (env 0, generator 1, verifier probe-outcome@1" in checked.stdout
    assert "): passes in" in checked.stdout  # the audit, run by check-family after the checks
    assert "the same ids in a fresh interpreter" in checked.stdout  # found by discovery there too
    after = {p.relative_to(copy) for p in (copy / "envs").rglob("*") if "__pycache__" not in p.parts}
    assert {str(p) for p in after - before} >= {"envs/probe", "envs/probe/verifier.py"}
    assert all(p.parts[:2] == ("envs", "probe") for p in after - before) and before <= after
    assert not (ENVS_DIR / "probe").exists()


@pytest.mark.parametrize("name, says", [
    ("Probe", "must match ^[a-z][a-z0-9_]*$"), ("1probe", "must match"), ("my-family", "must match"),
    ("", "must match"), ("probe/x", "must match"), ("class", "is a Python keyword"),
    ("json", "standard-library module")])
def test_a_bad_name_is_refused_and_nothing_is_written(tmp_path, name, says):
    with pytest.raises(ScaffoldError, match=re.escape(says)):
        new_family(name, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_taken_name_is_refused(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    with pytest.raises(ScaffoldError, match="mine already exists"):
        new_family("mine", tmp_path)
    with pytest.raises(ScaffoldError, match="inventory already exists"):
        new_family("inventory")  # into envs/: a built-in family's folder
    with pytest.raises(ScaffoldError, match=r"tools\.py already exists"):
        new_family("tools")  # envs/tools.py: the package would be shadowed
    with pytest.raises(ScaffoldError, match="a family named 'inventory' is already registered"):
        new_family("inventory", tmp_path)
    assert main(["new-family", "Bad-Name", "--dir", str(tmp_path)]) == 2
    assert "gymfoundry new-family: family name 'Bad-Name' must match" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    assert not (ENVS_DIR / "Bad-Name").exists()
