"""docs/orchestration.md's Python runs as written: a factory run of the orchestrator family that
offers the annealed parallelism reward stores its schedule with the GRPO dataset."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gymfoundry.tasks.training.grpo import dataset_parallelism
from gymfoundry.warehouse import Warehouse

DOC = Path(__file__).resolve().parents[2] / "docs" / "orchestration.md"


def test_the_orchestration_snippet_runs(tmp_path, prefect_harness, monkeypatch):
    (snippet,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(snippet.replace("tasks_per_family=10", "tasks_per_family=4"), "docs/orchestration.md", "exec"), scope)
    grpo = scope["grpo"]
    assert grpo["rows"] > 0
    schedule = dataset_parallelism(grpo["path"])
    assert (schedule.weight, schedule.anneal_steps) == (0.2, 200)
    with Warehouse(tmp_path / ".gymfoundry", read_only=True) as wh:
        (row,) = wh.sql("select count(*) n, sum(sub_rollouts) subs from critical_steps").to_pylist()
        landed = wh.sql("select count(*) n from sub_rollouts").to_pylist()[0]["n"]
        runs = wh.sql("select params from runs").to_pylist()
    assert row["n"] == 8 and row["subs"] == landed > 0
    assert json.loads(runs[0]["params"])["parallelism_reward"] == {"weight": 0.2, "anneal_steps": 200}
