"""End to end through the factory: a lake file of a real run deleted, the console's COPY onto
another refused, `warehouse check` naming the damage, `run` refusing to start, `warehouse repair`,
and the same run re-landing exactly the rows that were lost."""

from __future__ import annotations

import json

import pytest

from flows.cli import main
from warehouse import TABLES, Warehouse

pytestmark = pytest.mark.usefixtures("prefect_harness")

RUN = ["run", "--families", "inventory", "--tasks", "6", "--seed", "13", "--samples", "2"]


def counts(data_dir) -> dict[str, int]:
    with Warehouse(data_dir, read_only=True) as wh:
        return {name: wh.count(name) for name in TABLES}


def check(data_dir, capsys) -> tuple[int, dict]:
    out = data_dir / "check.json"
    code = main(["warehouse", "check", "--data-dir", str(data_dir), "--report", str(out)])
    capsys.readouterr()
    return code, json.loads(out.read_text())


def test_factory_run_survives_a_deleted_lake_file_and_relands_it(tmp_path, capsys):
    data_dir = tmp_path / "data"
    assert main([*RUN, "--data-dir", str(data_dir)]) == 0
    before = counts(data_dir)
    assert before["steps"] and before["dataset_rows"] and before["runs"] == 1
    [victim] = (data_dir / "lake" / "steps" / "task_family=inventory").glob("*.parquet")
    relative = victim.relative_to(data_dir).as_posix()
    [rollouts] = (data_dir / "lake" / "rollouts" / "task_family=inventory").glob("*.parquet")
    capsys.readouterr()

    assert main(["sql", "--data-dir", str(data_dir), f"COPY (SELECT 1) TO '{rollouts}'"]) == 1
    assert "ConsoleRefused" in capsys.readouterr().err
    victim.unlink()
    assert main(["sql", "--data-dir", str(data_dir), "select count(*) from rollouts"]) == 0
    assert main(["sql", "--data-dir", str(data_dir), "select count(*) from steps"]) == 1
    assert f"{relative}" in capsys.readouterr().err
    assert main([*RUN, "--data-dir", str(data_dir)]) == 1  # refuses before any episode
    err = capsys.readouterr().err
    assert relative in err and "gymfoundry warehouse repair" in err

    code, report = check(data_dir, capsys)
    assert code == 1 and [(f["path"], f["kind"]) for f in report["files"]] == [(relative, "missing")]
    assert main(["warehouse", "repair", "--data-dir", str(data_dir)]) == 0
    code, report = check(data_dir, capsys)
    assert code == 0 and report["files"] == []
    repaired = counts(data_dir)
    assert repaired["runs"] == 1 and repaired["steps"] == 0 and repaired["dataset_rows"] == 0

    assert main([*RUN, "--data-dir", str(data_dir)]) == 0  # the same run lands the lost rows again
    assert counts(data_dir) == before
    assert victim.exists() and check(data_dir, capsys)[0] == 0
