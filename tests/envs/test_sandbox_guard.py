"""The shared sandbox guard: a sandbox test that cannot run skips on a developer's machine and
FAILS under CI=true (a broken sandbox must never look green)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASES = '''
import pytest
from tests.sandbox_guard import needs_sandbox, require_sandbox


@needs_sandbox
def test_marked():
    pass


@pytest.fixture
def box():
    require_sandbox()


def test_fixture(box):
    pass


class TestModuleMark:
    pytestmark = needs_sandbox

    def test_in_class(self):
        pass
'''


pytestmark = pytest.mark.integration  # each test runs pytest in a subprocess


def run_cases(tmp_path, **env) -> subprocess.CompletedProcess:
    cases = tmp_path / "test_guarded.py"
    cases.write_text(CASES)
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "GYMFOUNDRY_BWRAP", "GYMFOUNDRY_SANDBOX")}
    environ.update(env, PYTHONPATH=str(ROOT), GYMFOUNDRY_BWRAP="/nonexistent/bwrap")  # no sandbox can start
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(cases)],
                          cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ci", ["true", "TRUE", "1", "yes"])
def test_under_ci_a_sandbox_test_that_cannot_run_fails_with_the_reason(tmp_path, ci):
    done = run_cases(tmp_path, CI=ci)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("3 errors in")  # failed at setup; none skipped
    assert done.stdout.count("the bubblewrap sandbox cannot run here: no bwrap binary") >= 3
    assert "CI=true: a sandbox test that cannot run fails instead of skipping" in done.stdout


@pytest.mark.parametrize("ci", [None, "false", "0", ""])
def test_outside_ci_it_skips_with_the_reason(tmp_path, ci):
    done = run_cases(tmp_path, **({"CI": ci} if ci is not None else {}))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("3 skipped")
    assert "the bubblewrap sandbox cannot run here: no bwrap binary" in done.stdout
