"""docs/warehouse.md's Python snippets and DuckDB commands run as written, against a warehouse in
`./.gymfoundry` (the default data dir)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gymfoundry.envs.records import Termination
from gymfoundry.warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "warehouse.md"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(), re.DOTALL)


def build_default_dir(tmp_path, build) -> Path:
    tasks = [build.task("inventory", i) for i in range(4)]
    rollouts = [build.rollout(t, seed=i, termination=Termination.success if i % 2 else Termination.failure)
                for i, t in enumerate(tasks)]
    with Warehouse(tmp_path / ".gymfoundry") as wh:
        wh.land(tasks=tasks, rollouts=rollouts, scores=[build.score(r, i) for r in rollouts for i in range(3)])
    return tmp_path


def test_the_python_snippets_run(tmp_path, build, monkeypatch):
    monkeypatch.chdir(build_default_dir(tmp_path, build))
    warehouse_snippet, duckdb_snippet, staging_snippet = blocks("python")
    scope: dict = {}
    exec(compile(warehouse_snippet, "docs/warehouse.md notebook", "exec"), scope)
    assert scope["by_level"].to_dicts() == [{"difficulty_level": 2, "success_rate": 0.5, "rollouts": 4}]
    assert len(scope["frame"]) == 5 and len(scope["rollouts"]) == 2 and scope["cells"].height == 1
    scope = {}
    exec(compile(duckdb_snippet, "docs/warehouse.md duckdb", "exec"), scope)
    assert sorted(scope["classes"]["termination"]) == ["failure", "success"]
    task = build.task("inventory", 9)
    rollout = build.rollout(task, seed=9)
    scope = {"tasks": [task], "rollouts": [rollout], "scores": [build.score(rollout, i) for i in range(3)]}
    exec(compile(staging_snippet, "docs/warehouse.md staging", "exec"), scope)
    assert scope["landing"].counts == {"tasks": 1, "rollouts": 1, "steps": 3, "step_scores": 3}


@pytest.mark.integration  # the documented commands in subprocesses
def test_the_duckdb_commands_run(tmp_path, build):
    cwd = build_default_dir(tmp_path, build)
    commands = [line for block in blocks("bash") for line in block.splitlines() if "duckdb " in line]
    assert len(commands) == 4
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # the venv's commands
    outputs = []
    for command in commands:
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{command}\n{done.stderr}"
        outputs.append(done.stdout)
    assert "0.5" in outputs[0] and "inventory" in outputs[0]
    assert "failure" in outputs[1] and "success" not in outputs[1].replace("success_", "")
    assert outputs[2].count("│ r-") == 3  # from rollouts limit 3: one rollout id a row
    assert "inventory" in outputs[3] and " 4 " in outputs[3]  # every registered rollout, read from the lake directly
