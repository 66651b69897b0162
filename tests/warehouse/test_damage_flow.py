"""End to end through the factory: a lake file of a real run deleted, the console's COPY onto
another refused, `warehouse check` naming the damage, `run` refusing to start, `warehouse repair`,
and the same run re-landing exactly the rows that were lost."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest

from gymfoundry.flows.cli import main
from gymfoundry.warehouse import TABLES, Warehouse

pytestmark = pytest.mark.usefixtures("prefect_harness")

RUN = ["run", "--families", "inventory", "--tasks", "6", "--seed", "13", "--samples", "2"]


def counts(data_dir) -> dict[str, int]:
    with Warehouse(data_dir, read_only=True) as wh:
        return {name: wh.count(name) for name in TABLES}


def cli(*argv: str) -> tuple[int, str]:
    """`main` with its stderr, for commands that run no flow. (capsys would hand Prefect's log handler
    a stream that closes with this test, breaking every later flow test of the session.)"""
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = main(list(argv))
    return code, err.getvalue()


def check(data_dir) -> tuple[int, dict]:
    out = data_dir / "check.json"
    code, _ = cli("warehouse", "check", "--data-dir", str(data_dir), "--report", str(out))
    return code, json.loads(out.read_text())


def test_factory_run_survives_a_deleted_lake_file_and_relands_it(tmp_path):
    data_dir = tmp_path / "data"
    assert main([*RUN, "--data-dir", str(data_dir)]) == 0
    before = counts(data_dir)
    assert before["steps"] and before["dataset_rows"] and before["runs"] == 1
    [victim] = (data_dir / "lake" / "steps" / "task_family=inventory").glob("*.parquet")
    relative = victim.relative_to(data_dir).as_posix()
    [rollouts] = (data_dir / "lake" / "rollouts" / "task_family=inventory").glob("*.parquet")

    code, err = cli("sql", "--data-dir", str(data_dir), f"COPY (SELECT 1) TO '{rollouts}'")
    assert code == 1 and "ConsoleRefused" in err
    victim.unlink()
    assert cli("sql", "--data-dir", str(data_dir), "select count(*) from rollouts") == (0, "")
    code, err = cli("sql", "--data-dir", str(data_dir), "select count(*) from steps")
    assert code == 1 and relative in err
    code, err = cli(*RUN, "--data-dir", str(data_dir))  # refuses before any episode (no flow starts)
    assert code == 1 and relative in err and "gymfoundry warehouse repair" in err

    code, report = check(data_dir)
    assert code == 1 and [(f["path"], f["kind"]) for f in report["files"]] == [(relative, "missing")]
    assert cli("warehouse", "repair", "--data-dir", str(data_dir))[0] == 0
    code, report = check(data_dir)
    assert code == 0 and report["files"] == []
    repaired = counts(data_dir)
    assert repaired["runs"] == 1 and repaired["steps"] == 0 and repaired["dataset_rows"] == 0

    assert main([*RUN, "--data-dir", str(data_dir)]) == 0  # the same run lands the lost rows again
    assert counts(data_dir) == before
    assert victim.exists() and check(data_dir)[0] == 0
