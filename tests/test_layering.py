"""Environments and verifiers must be usable from a plain Python loop: they never import the
orchestration, storage or training stacks, and dependencies point one way. One exception: a
family folder's own verifier module (envs/<family>/verifier.py, beside a profile.yaml) may import
`verifiers` (its base classes); the family names it as "module:attr", loaded only when needed."""

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


def forbidden(package: str, path: Path) -> set[str]:
    if package == "envs" and _family_verifier(path):
        return FORBIDDEN[package] - {"verifiers"}
    return FORBIDDEN[package]


def _family_verifier(path: Path) -> bool:
    rel = path.relative_to(ROOT)
    return len(rel.parts) == 3 and rel.name == "verifier.py" and (path.parent / "profile.yaml").is_file()


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependencies_point_one_way(package):
    offenders = {str(p.relative_to(ROOT)): sorted(imported_modules(p) & forbidden(package, p))
                 for p in (ROOT / package).rglob("*.py")}
    assert {p: names for p, names in offenders.items() if names} == {}


def test_only_a_family_folders_verifier_module_may_import_verifiers():
    assert _family_verifier(ROOT / "envs" / "inventory" / "verifier.py")
    assert not _family_verifier(ROOT / "envs" / "verifier.py")
    assert not _family_verifier(ROOT / "envs" / "inventory" / "world.py")
    assert not _family_verifier(ROOT / "envs" / "inventory" / "tests" / "verifier.py")
    assert not _family_verifier(ROOT / "envs" / "sandbox" / "verifier.py")  # no profile.yaml: not a family
