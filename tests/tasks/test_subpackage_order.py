"""tasks/ is layered one way (its docstring draws the order): no module of a subpackage imports a
subpackage at or above its own level, function-local imports included."""

import ast
from pathlib import Path

import gymfoundry.tasks

TASKS = Path(gymfoundry.tasks.__file__).parent
LEVEL = {"policies": 0, "rollout": 1, "stages": 2, "ops": 3, "training": 4, "harness": 4}


def arrows() -> list[str]:
    """'file:line a -> b' for each import of subpackage b by a module of subpackage a, b not below a."""
    out = []
    for path in sorted(TASKS.rglob("*.py")):
        parts = path.relative_to(TASKS).parts
        if len(parts) < 2:
            continue
        own = parts[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                other = name.split(".")[2] if name.startswith("gymfoundry.tasks.") else None
                if other is not None and other != own and LEVEL.get(other, 0) >= LEVEL[own]:
                    out.append(f"{path.relative_to(TASKS)}:{node.lineno} {own} -> {other}")
    return out


def test_every_subpackage_has_a_level():
    assert {p.parent.name for p in TASKS.glob("*/__init__.py")} == set(LEVEL)
    assert [p.name for p in TASKS.glob("*.py")] == ["__init__.py"]


def test_no_subpackage_imports_one_at_or_above_its_level():
    assert arrows() == []
