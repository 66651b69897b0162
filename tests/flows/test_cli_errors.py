"""A user's mistake on the command line gets one line on stderr and exit 2, found before Prefect
starts where it can be, and creates nothing; the real `gymfoundry` CLI runs as a subprocess (the
module of the entry point, from this checkout)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gymfoundry.warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[2]
ENDLESS = "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM t) SELECT count(*) FROM t"


pytestmark = pytest.mark.integration  # the CLI in subprocesses


def gymfoundry(tmp_path: Path, *argv: str | bytes, timeout: float = 600) -> subprocess.CompletedProcess:
    """`gymfoundry argv...` with its own Prefect home (so a started Prefect server would show there)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_HOME": str(tmp_path / "prefect-home")}
    env.pop("GYMFOUNDRY_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "gymfoundry.flows.cli", *argv], cwd=tmp_path, env=env, capture_output=True,
                          timeout=timeout)


def one_line(done: subprocess.CompletedProcess) -> str:
    err = done.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    return err


def no_prefect(tmp_path: Path, done: subprocess.CompletedProcess) -> None:
    """Prefect never started: it logged nothing and its home has no database."""
    assert "prefect" not in done.stderr.decode("utf-8", "replace").lower()
    assert not (tmp_path / "prefect-home" / "prefect.db").exists()


@pytest.fixture
def warehouse_dir(tmp_path):
    data_dir = tmp_path / "data"
    Warehouse(data_dir).close()
    return data_dir


def test_a_missing_dataset_is_refused_before_prefect_starts(tmp_path, warehouse_dir):
    done = gymfoundry(tmp_path, "train", "--dataset", "nosuch", "--data-dir", str(warehouse_dir))
    assert done.returncode == 2
    assert one_line(done) == (f"gymfoundry train: --dataset: no dataset 'nosuch': neither a Parquet file nor "
                              f"{warehouse_dir}/datasets/nosuch.parquet\n")
    no_prefect(tmp_path, done)
    done = gymfoundry(tmp_path, "train", "--method", "dpo", "--data-dir", str(warehouse_dir))
    assert done.returncode == 2 and "--method dpo trains on a dataset: name one with --dataset" in one_line(done)
    no_prefect(tmp_path, done)


@pytest.mark.parametrize("command", ["run", "evaluate"])
def test_an_unknown_policy_kind_is_one_line(tmp_path, command):
    done = gymfoundry(tmp_path, command, "--policy", "gpt", "--model", "m", "--data-dir", str(tmp_path / "d"))
    assert done.returncode == 2
    assert one_line(done) == (f"gymfoundry {command}: --policy: unknown policy kind 'gpt'; available: scripted, hf, "
                              "openai\n")
    no_prefect(tmp_path, done)
    assert not (tmp_path / "d").exists()


def test_unknown_arms_and_families_are_refused_before_prefect_starts(tmp_path):
    done = gymfoundry(tmp_path, "loop", "--arms", "sft,bogus", "--data-dir", str(tmp_path / "d"))
    assert done.returncode == 2
    assert one_line(done) == ("gymfoundry loop: --arms: unknown arm 'bogus'; choose from sft, sft_weighted, "
                              "sft_then_grpo\n")
    done = gymfoundry(tmp_path, "reverify", "--families", "nosuch", "--data-dir", str(tmp_path / "d"))
    assert done.returncode == 2 and "no warehouse there" in one_line(done)
    no_prefect(tmp_path, done)
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("command", ["reverify", "rescore", "calibrate"])
def test_an_unknown_family_is_refused_before_prefect_starts_with_a_warehouse_there(tmp_path, warehouse_dir, command):
    done = gymfoundry(tmp_path, command, "--families", "inventory", "nosuch", "--data-dir", str(warehouse_dir))
    assert done.returncode == 2
    assert one_line(done).startswith(f"gymfoundry {command}: unknown family 'nosuch'; known families: advisory, ")
    no_prefect(tmp_path, done)


def test_evaluate_refuses_a_data_dir_without_a_warehouse_or_a_missing_checkpoint_before_prefect_starts(
        tmp_path, warehouse_dir):
    typo = tmp_path / "typo"
    done = gymfoundry(tmp_path, "evaluate", "--policy", "scripted", "--data-dir", str(typo))
    assert done.returncode == 2
    assert one_line(done) == (f"gymfoundry evaluate: --data-dir {typo}: no warehouse there (no catalog.duckdb); "
                              "nothing was done\n")
    no_prefect(tmp_path, done)
    assert not typo.exists()
    done = gymfoundry(tmp_path, "evaluate", "--policy", "hf", "--model", str(tmp_path / "no-ckpt"),
                      "--data-dir", str(warehouse_dir))
    assert done.returncode == 2
    assert one_line(done) == f"gymfoundry evaluate: --model {tmp_path / 'no-ckpt'}: no such checkpoint directory\n"
    no_prefect(tmp_path, done)


def test_serve_env_refuses_an_unknown_family_before_locking_a_holdout(tmp_path):
    done = gymfoundry(tmp_path, "serve-env", "--family", "nosuch", "--data-dir", str(tmp_path / "d"), timeout=120)
    assert done.returncode == 2
    assert one_line(done).startswith("gymfoundry serve-env: unknown family 'nosuch'; known families: ")
    assert not (tmp_path / "d").exists()  # no catalog, no holdout lock


@pytest.mark.parametrize("action", ["repair", "check"])
def test_warehouse_repair_or_check_on_a_mistyped_path_creates_nothing(tmp_path, action):
    typo = tmp_path / "typo"
    done = gymfoundry(tmp_path, "warehouse", action, "--data-dir", str(typo))
    assert done.returncode == 2
    assert one_line(done) == (f"gymfoundry warehouse: --data-dir {typo}: no warehouse there (no catalog.duckdb); "
                              "nothing was done\n")
    assert not typo.exists()


@pytest.mark.parametrize("command", [["warehouse", "repair"], ["run", "--tasks", "1"], ["sql", "select 1"]])
def test_a_data_dir_that_is_not_utf8_is_one_line(tmp_path, command):
    bad = os.fsencode(tmp_path) + b"/data-\xff"
    done = gymfoundry(tmp_path, *command, "--data-dir", bad)
    assert done.returncode == 2
    assert "--data-dir" in one_line(done) and "is not valid UTF-8" in one_line(done)
    assert "bad_cast" not in done.stderr.decode("utf-8", "replace")
    assert not [name for name in os.listdir(tmp_path) if name.startswith("data-")]  # nothing created


def test_sql_timeout_cancels_an_endless_query_with_one_line_and_frees_the_catalog(tmp_path, warehouse_dir):
    done = gymfoundry(tmp_path, "sql", "--data-dir", str(warehouse_dir), "--timeout", "2", ENDLESS)
    assert done.returncode == 1
    assert one_line(done) == ("gymfoundry sql: error: QueryCancelled: the query ran past the console's time limit of "
                              "2 s (--timeout) and was cancelled\n")
    Warehouse(warehouse_dir, lock_timeout_s=0).close()  # a writer opens at once
    for bad, line in ((["--timeout", "0"], "--timeout 0: the time limit must be more than 0 seconds"),
                      (["--max-memory", "lots"], "--max-memory 'lots' is not a size such as 2GB or 512MiB")):
        done = gymfoundry(tmp_path, "sql", "--data-dir", str(warehouse_dir), *bad, "select 1")
        assert done.returncode == 2 and line in one_line(done)


@pytest.mark.usefixtures("prefect_harness")
def test_bad_input_a_flow_finds_is_one_line_and_exit_2_without_a_traceback(tmp_path, capfd):
    # The loop's arm timing is checked by the flow itself, once Prefect has started; Prefect logs the
    # failed run (to the file descriptor, hence capfd) without the traceback.
    from gymfoundry.flows.cli import main

    import logging

    from gymfoundry.flows.cli import _UserErrorsWithoutTraceback

    assert main(["loop", "--train-seconds", "10", "--grpo-seconds", "20", "--data-dir", str(tmp_path / "d")]) == 2
    err = capfd.readouterr().err
    # Whether Prefect's console handler reached this fd depends on the tests run before; the filter
    # that strips the traceback from its record is what holds either way.
    assert "Traceback" not in err
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        assert any(isinstance(f, _UserErrorsWithoutTraceback) for f in logging.getLogger(name).filters)
    assert err.splitlines()[-1] == "gymfoundry loop: sft_then_grpo needs 0 < grpo_seconds < train_seconds"


def test_labels_import_of_a_missing_file_is_one_line_and_imports_nothing(tmp_path, warehouse_dir):
    done = gymfoundry(tmp_path, "labels", "import", str(tmp_path / "missing.csv"), "--data-dir", str(warehouse_dir))
    assert done.returncode == 2
    assert one_line(done) == f"gymfoundry labels: no such file: {tmp_path / 'missing.csv'}; nothing was imported\n"


def test_a_crash_still_shows_its_traceback(warehouse_dir, monkeypatch, capsys):
    # Not a user error: the traceback is what a bug report needs (and the exit is 1, not 2).
    from gymfoundry.flows.cli import main

    def crash(self, **_):
        raise KeyError("boom")

    monkeypatch.setattr(Warehouse, "repair", crash)
    assert main(["warehouse", "repair", "--data-dir", str(warehouse_dir)]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.splitlines()[-1] == "gymfoundry warehouse: error: KeyError: 'boom'"


def test_a_pydantic_error_is_one_line_that_never_repeats_its_input():
    from pydantic import BaseModel, ValidationError

    from gymfoundry.flows.cli import one_line

    class Endpoint(BaseModel):
        port: int
        retries: int

    with pytest.raises(ValidationError) as refused:
        Endpoint.model_validate({"port": "sk-secret-value-123", "retries": "x\ny"})
    assert one_line(refused.value) == ("Endpoint: port: Input should be a valid integer, unable to parse string as "
                                       "an integer; retries: Input should be a valid integer, unable to parse string "
                                       "as an integer")
