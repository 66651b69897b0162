"""Environments and verifiers must be usable from a plain Python loop: they never import the
orchestration, storage or training stacks, and dependencies point one way: a family's verifier builds on
the family SDK's base (envs/verifier.py), never on the scoring layers in verifiers/."""

import ast
import sys
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
    # the one bare `verifiers` allowed: PrimeIntellect's distribution, imported beside ours on purpose
    assert {p: names for p, names in offenders.items() if names} == {"tests/test_installed_names.py": ["verifiers"]}


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
    source.write_text("import envs\nfrom tasks.rollout.episodes import x\nimport gymfoundry.verifiers.rules as r\n"
                      "from gymfoundry import warehouse\nfrom gymfoundry.flows.cli import main\n")
    assert bare_project_imports(source) == ["envs", "tasks.rollout.episodes"]
    assert imported_modules(source) == {"envs", "tasks", "verifiers", "warehouse", "flows"}


# -- The import graph, read from the AST ------------------------------------------------------------------
# Folders in layer order: a module may import its own folder and the folders before it, never one after.
ORDER = ("envs", "verifiers", "warehouse", "tasks", "flows", "deployments")
# Function-local imports of project modules allowed, each with its reason: (importing module, imported module).
# Each loads a heavy dependency (duckdb, Prefect, torch/TRL, mcp) that a command's --help or an importer does
# not need; the importing line says the same after `# local:`.
LOCAL_IMPORTS: dict[tuple[str, str], str] = {
    ('envs', 'envs.discovery'): 'it imports families; this package loads none',
    ('flows.cli', 'warehouse'): 'duckdb',
    ('flows.cli', 'warehouse.console'): 'duckdb, as above',
    ('flows.cli.families', 'tasks.stages.audit'): 'loads polars (~0.3 s); --help needs none',
    ('flows.cli.families', 'warehouse'): 'duckdb (~0.7 s), only to land the audit',
    ('flows.cli.harness', 'tasks.harness.hub'): "the warehouse's duckdb (~0.7 s); --help needs none",
    ('flows.cli.harness', 'tasks.harness.mcp_server'): 'the mcp package (~0.6 s)',
    ('flows.cli.harness', 'tasks.harness.proxy'): "the warehouse's duckdb (~0.7 s); --help needs none",
    ('flows.cli.options', 'warehouse'): 'the warehouse loads duckdb (~0.7 s); --help needs none',
    ('flows.cli.prm', 'flows.scoring'): 'Prefect loads only for commands that run flows',
    ('flows.cli.prm', 'tasks.ops.calibrate'): 'duckdb and pandas (~0.5 s); --help needs none',
    ('flows.cli.report', 'flows.report'): "the warehouse's duckdb (~0.7 s); --help needs none",
    ('flows.cli.reverify', 'flows.reverify'): 'Prefect loads only for commands that run flows',
    ('flows.cli.run', 'flows.factory'): 'Prefect loads only for commands that run flows',
    ('flows.cli.run', 'flows.loop'): 'Prefect, as above',
    ('flows.cli.run', 'warehouse'): 'the warehouse loads duckdb (~0.7 s); --help needs none',
    ('flows.cli.training', 'flows.evaluation'): 'Prefect loads only for commands that run flows',
    ('flows.cli.training', 'flows.loop'): 'Prefect loads only for commands that run flows',
    ('flows.cli.training', 'flows.training'): 'Prefect loads only for commands that run flows',
    ('flows.cli.training', 'warehouse.store'): 'duckdb (~0.7 s); --help needs none',
    ('flows.cli.warehouse', 'tasks.stages.assemble'): 'duckdb (~0.7 s), as the warehouse',
    ('flows.cli.warehouse', 'warehouse'): 'duckdb (~0.7 s); --help needs none',
    ('flows.cli.warehouse', 'warehouse.console'): 'duckdb (~0.7 s); --help needs none',
    ('tasks.training.train', 'tasks.training.grpo'): 'torch/transformers/trl, loaded only when a run trains',
    ('tasks.training.train', 'tasks.training.runners'): 'torch/transformers/trl, loaded only when a run trains',
}


def project_modules() -> dict[str, Path]:
    """Every project module outside the tests, by dotted name within the project (`envs.records`)."""
    out = {}
    for folder in ORDER:
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if "tests" in rel.parts:
                continue
            parts = rel.with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(modules: dict[str, Path]) -> tuple[dict[str, set[str]], list[tuple[str, str, int]]]:
    """Edges module -> project modules it imports (TYPE_CHECKING blocks left out), and the imports made
    inside a function body as (module, imported, line)."""
    def resolve(name: str) -> str | None:
        name = name.removeprefix("gymfoundry.")
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in modules}
    local: list[tuple[str, str, int]] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        in_function = {id(n) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if id(node) in typing_only or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + [base]).strip(".")
                names = ([f"{base}.{alias.name}" for alias in node.names] if base != "gymfoundry"
                         else [alias.name for alias in node.names])
            for target in {resolve(name) for name in names} - {None, module}:
                edges[module].add(target)
                if id(node) in in_function:
                    local.append((module, target, node.lineno))
    return edges, local


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter; counter += 1; stack.append(root); on_stack.add(root)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter; counter += 1; stack.append(succ); on_stack.add(succ)
                    work.append((succ, iter(sorted(edges[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop(); on_stack.discard(member); component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def up_arrows(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    rank = {folder: n for n, folder in enumerate(ORDER)}
    return sorted((a, b) for a, targets in edges.items() for b in targets
                  if rank[b.split(".")[0]] > rank[a.split(".")[0]])


def test_no_import_circles_and_no_arrow_against_the_layer_order():
    edges, _ = import_graph(project_modules())
    found, against = circles(edges), up_arrows(edges)
    print(f"import circles: {len(found)}", *found, f"arrows against the layer order: {len(against)}", *against,
          sep="\n")
    assert found == [] and against == []


def test_function_local_project_imports_are_the_listed_ones():
    _, local = import_graph(project_modules())
    print(f"function-local project imports: {len(local)}", *local, sep="\n")
    assert sorted({(a, b) for a, b, _ in local}) == sorted(LOCAL_IMPORTS)
    assert len(local) <= 35 and all(reason.strip() for reason in LOCAL_IMPORTS.values())


def test_the_graph_finds_circles_arrows_and_local_imports(tmp_path, monkeypatch):
    """The checks can fail: a planted circle, up-arrow and function-local import are all seen."""
    files = {"envs/a.py": "from gymfoundry.envs import b\n", "envs/b.py": "import gymfoundry.envs.a\n",
             "envs/c.py": "def f():\n    from gymfoundry.tasks.d import x\n", "tasks/d.py": "from ..envs.a import y\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    edges, local = import_graph(project_modules())
    assert circles(edges) == [["envs.a", "envs.b"]]
    assert up_arrows(edges) == [("envs.c", "tasks.d")]
    assert local == [("envs.c", "tasks.d", 2)]
