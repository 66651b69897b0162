"""docs/datasets.md's Python runs as written: the datasets load into plain TRL's trainers, with
the tool-argument form the template wants and the masked turns out of the loss."""

from __future__ import annotations

import re
from pathlib import Path
from tests.audits import audited

DOC = Path(__file__).resolve().parents[2] / "docs" / "datasets.md"


def test_the_loading_snippet_runs(tiny_model_dir, tmp_path, monkeypatch):
    import torch

    from gymfoundry.tasks.stages.assemble import assemble_datasets
    from gymfoundry.tasks.stages.generate import generate_tasks
    from gymfoundry.tasks.stages.isolate import isolate_tasks
    from gymfoundry.tasks.stages.land import land_batch
    from gymfoundry.tasks.policies.registry import make_policy
    from gymfoundry.tasks.rollout.episodes import collect_rollouts
    from gymfoundry.tasks.stages.score import score_rollouts

    torch.set_num_threads(1)
    tasks, _ = isolate_tasks(generate_tasks("inventory", 12, seed=5), holdout_fraction=0.1)
    policy = make_policy("scripted", "inventory", mistake_rate=0.35)
    rollouts = collect_rollouts(tasks, policy, 3, seed=5)
    land_batch(str(tmp_path / "data"), tasks, [], rollouts, score_rollouts(rollouts, tasks))
    audited(tmp_path / "data", ["inventory"])
    result = assemble_datasets(tmp_path / "data", ["inventory"], kinds=("sft", "dpo"))
    (snippet,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    monkeypatch.chdir(tmp_path)
    scope = {"SFT": result["sft"]["path"], "DPO": result["dpo"]["path"], "MODEL": str(tiny_model_dir)}
    exec(compile(snippet, str(DOC), "exec"), scope)
    assert scope["form"] == "string" and len(scope["tokens"]) == result["sft"]["rows"]
    assert (tmp_path / "out" / "sft-masked").is_dir() and (tmp_path / "out" / "dpo").is_dir()
