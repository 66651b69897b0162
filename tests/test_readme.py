"""The README's Python snippets run as written (a quick start that fails is the first bug a
user meets)."""

import os
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)


def test_readme_has_the_two_commands_first():
    text = README.read_text()
    assert text.index("make demo") < text.index("make test") < text.index("## ")


def test_readme_python_snippets_run(tmp_path, prefect_harness, monkeypatch):
    quick_start, warehouse_query, analysis_views, factory_run = snippets()
    monkeypatch.chdir(tmp_path)
    exec(compile(quick_start, "README quick start", "exec"), {})
    factory_run = factory_run.replace("tasks_per_family=50", "tasks_per_family=10")
    exec(compile(factory_run, "README factory run", "exec"), {})
    os.symlink(tmp_path / "D", tmp_path / ".gymfoundry")
    scope: dict = {}
    exec(compile(warehouse_query, "README warehouse query", "exec"), scope)
    assert scope["by_level"].height > 0 and len(scope["frame"]) == 5
    assert scope["rollouts"] and all(r.success for r in scope["rollouts"])
    scope = {}
    exec(compile(analysis_views, "README analysis views", "exec"), scope)
    assert scope["cells"].height > 0 and len(scope["classes"]) > 0 and len(scope["mix"]) > 0
