"""The CLI refuses bad run settings at once: one line naming each option and what it allows,
exit 2, before Prefect (the slow import) is loaded; `--help` shows defaults and choices."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gymfoundry.flows.cli import build_parser
from gymfoundry.flows.config import known_families

REPO = Path(__file__).resolve().parents[2]
PROBE = ("import sys; from gymfoundry.flows.cli import main; code = main(sys.argv[1:]); "
         "assert 'prefect' not in sys.modules, 'prefect was imported'; sys.exit(code)")


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("argv, line", [
    (["run", "--families", "nosuch"],
     "gymfoundry run: --families: unknown family 'nosuch'; known families: " + ", ".join(known_families())),
    (["run", "--tasks", "0"], "gymfoundry run: --tasks: Input should be greater than or equal to 1 (got 0)"),
    (["run", "--tasks", "-3", "--samples", "0"],
     "gymfoundry run: --tasks: Input should be greater than or equal to 1 (got -3); "
     "--samples: Input should be greater than or equal to 1 (got 0)"),
    (["run", "--mistake-rate", "1.5"], "gymfoundry run: --mistake-rate: Input should be less than or equal to 1 (got 1.5)"),
    (["run", "--holdout-fraction", "-0.1"],
     "gymfoundry run: --holdout-fraction: holdout fraction -0.1 refused: it must be a number in [0, 1]"),
    (["run", "--policy", "openai"], "gymfoundry run: --policy: a 'openai' policy needs a model (a checkpoint "
                                    "directory / the endpoint's model name)"),
    (["run", "--cluster-address", "tcp://127.0.0.1:8786"],
     "gymfoundry run: --cluster-address: a cluster address needs the task runner dask or ray"),
    (["evaluate", "--family", "nosuch", "--model", "m"],
     "gymfoundry evaluate: --family: unknown family 'nosuch'; known families: " + ", ".join(known_families())),
])
@pytest.mark.integration  # the CLI in subprocesses
def test_bad_settings_fail_with_one_line_before_prefect_loads(argv, line):
    done = run_cli(*argv)
    assert (done.returncode, done.stderr.strip().splitlines(), done.stdout) == (2, [line], "")


def test_help_shows_defaults_choices_and_examples(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "tasks generated per family (default: 50)" in out
    assert "--task-runner {threads,dask,ray}" in out and "--learnability {p(1-p),1-p,uniform}" in out
    assert "examples: gymfoundry run --families inventory coding" in out


def test_version(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.startswith("gymfoundry 0.1.0")
