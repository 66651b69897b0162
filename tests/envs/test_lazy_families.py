"""Importing the records, or the warehouse that reads them, loads no family: the families are found
on the first lookup (envs/family.py), not at `import gymfoundry.envs`."""

import ast
import json
import subprocess
import sys
from pathlib import Path

ENVS = Path(__file__).resolve().parents[2] / "envs"


def family_folders() -> list[str]:
    """The built-in families' folders: those holding a profile.yaml, or an __init__ declaring a Family."""
    out = []
    for folder in sorted(p for p in ENVS.iterdir() if (p / "__init__.py").is_file()):
        init = ast.parse((folder / "__init__.py").read_text())
        declares = any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Family" for n in ast.walk(init))
        if (folder / "profile.yaml").is_file() or declares:
            out.append(folder.name)
    return out


def loaded_after(statement: str) -> list[str]:
    probe = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_family_folders_are_found():
    assert {"inventory", "coding", "generic"} <= set(family_folders())


def test_importing_the_warehouse_or_the_records_loads_no_family():
    prefixes = tuple(f"gymfoundry.envs.{name}" for name in family_folders())
    for statement in ("import gymfoundry.warehouse", "import gymfoundry.envs.records"):
        loaded = [m for m in loaded_after(statement) if m in prefixes or m.startswith(tuple(p + "." for p in prefixes))]
        assert loaded == [], f"{statement} loads {loaded}"


def test_the_first_lookup_finds_them():
    loaded = loaded_after("from gymfoundry.envs import family\nfamily('inventory')")
    assert "gymfoundry.envs.inventory" in loaded and "gymfoundry.envs.discovery" in loaded


def test_first_lookups_on_many_threads_all_find_the_family():
    """One thread finds the families; the others' first lookups wait for it, none sees a half-found set."""
    probe = ("import json, threading\nfrom gymfoundry.envs import family\nerrors = []\n"
             "def look():\n    try:\n        family('orchestrator')\n    except Exception as exc:\n"
             "        errors.append(repr(exc))\n"
             "threads = [threading.Thread(target=look) for _ in range(8)]\n"
             "[t.start() for t in threads]\n[t.join() for t in threads]\nprint(json.dumps(errors))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
