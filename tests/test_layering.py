"""Environments and verifiers must be usable from a plain Python loop: they never import the
orchestration, storage or training stacks, and dependencies point one way: a family's verifier builds on
the family SDK's base (envs/verifier.py), never on the scoring layers in verifiers/."""

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
    """Top-level names a file imports, the project's own by folder (`gymfoundry.envs.x` -> `envs`)."""
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {_folder(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {_folder(node.module)} if node.module != "gymfoundry" else {a.name for a in node.names}
    return names


def _folder(name: str) -> str:
    parts = name.split(".")
    return parts[1] if parts[0] == "gymfoundry" and len(parts) > 1 else parts[0]


FOLDERS = ("envs", "verifiers", "warehouse", "tasks", "flows", "deployments")


def bare_project_imports(path: Path) -> list[str]:
    """Imports of a folder by its bare name (`import envs`): installed, the project is `gymfoundry.*` only."""
    tree = ast.parse(path.read_text(), str(path))
    bare = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    bare += [node.module for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module]
    return [name for name in bare if name.split(".")[0] in FOLDERS]


def test_the_project_is_imported_by_its_installed_names_only():
    files = [p for folder in (*FOLDERS, "tests") for p in (ROOT / folder).rglob("*.py")]
    offenders = {str(p.relative_to(ROOT)): bare_project_imports(p) for p in files}
    assert {p: names for p, names in offenders.items() if names} == {}


def forbidden(package: str, path: Path) -> set[str]:
    if package == "envs" and "tests" in path.relative_to(ROOT).parts:
        return FORBIDDEN[package] - {"verifiers", "warehouse", "tasks", "flows", "prefect", "duckdb"}
    return FORBIDDEN[package]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependencies_point_one_way(package):
    offenders = {str(p.relative_to(ROOT)): sorted(imported_modules(p) & forbidden(package, p))
                 for p in (ROOT / package).rglob("*.py")}
    assert {p: names for p, names in offenders.items() if names} == {}


def test_the_checks_read_installed_and_bare_names(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import envs\nfrom tasks.rollout import x\nimport gymfoundry.verifiers.rules as r\n"
                      "from gymfoundry import warehouse\nfrom gymfoundry.flows.cli import main\n")
    assert bare_project_imports(source) == ["envs", "tasks.rollout"]
    assert imported_modules(source) == {"envs", "tasks", "verifiers", "warehouse", "flows"}
