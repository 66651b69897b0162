"""Environments and verifiers must be usable from a plain Python loop: they never import the
orchestration, storage or training stacks, and dependencies point one way."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "envs": {"prefect", "duckdb", "torch", "transformers", "trl", "verifiers", "warehouse", "tasks", "flows"},
    "verifiers": {"prefect", "duckdb", "torch", "transformers", "trl", "warehouse", "tasks", "flows"},
    "warehouse": {"prefect", "torch", "transformers", "trl", "tasks", "flows"},
    "tasks": {"flows", "deployments"},
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependencies_point_one_way(package):
    offenders = {str(p.relative_to(ROOT)): sorted(imported_modules(p) & FORBIDDEN[package])
                 for p in (ROOT / package).rglob("*.py")}
    assert {p: names for p, names in offenders.items() if names} == {}
