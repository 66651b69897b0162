"""Seeded task generator of the coding family: template repositories with injected bugs.

`generate(family, seed, level)` is a pure function of (seed, level, GENERATOR_VERSION); the
family (envs/coding/__init__.py) assembles the TaskSpec and `generate_task(seed, level)` is its
`generate`. It picks
a template repository shipped under templates/ (a small package with docstrings, visible
tests, hidden tests and a manifest of bug sites), injects bugs by exact text replacement,
and writes the bug report the agent sees. The reference trajectory is the inverse patch
applied with `edit_file`, bracketed by test runs. No sandbox is needed here: the validate
stage proves each task (hidden tests fail before, pass after the reference).

Template groups (`template_id`, what isolation keeps in one split) are the modules of each
repository: all of a task's bugs sit in one module, so a bug site (its fix, the original code
it restores) and every task using it fall in one split, and the scripted reference, reading only
the bug files, shows no held-out module's source in a train trajectory. An agent can still open
another module of its repository; grouping by repository alone would close that too, but would
leave three groups for the four splits.

Difficulty knobs by level: number of bugs (1, 1, 2, 2, 3), how far the symptom is from the
cause (`distance`: 0 = a visible test of the buggy module fails, 1 = only a visible test of
another module fails, 2 = only the hidden tests fail), whether the report names the file,
and (level 5) one bug reported without an example. File count varies by template."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gymfoundry.envs.coding.facts import Bug, CodingFacts
from gymfoundry.envs.family import Family
from gymfoundry.envs.records import TaskSpec, ToolCall

GENERATOR_VERSION = "2"  # 2: a task's bugs sit in one module, its template group
TEMPLATES_DIR = Path(__file__).with_name("templates")
TEST_DIR = "tests"
SUFFIX = ".txt"  # template sources ship as *.py.txt so no tool ever imports or collects them

LEVELS = {  # bugs, largest distance, smallest distance wanted for one of them, file named, examples
    1: {"bugs": 1, "max_distance": 0, "min_distance": 0, "name_file": True, "vague": 0},
    2: {"bugs": 1, "max_distance": 1, "min_distance": 0, "name_file": False, "vague": 0},
    3: {"bugs": 2, "max_distance": 1, "min_distance": 0, "name_file": False, "vague": 0},
    4: {"bugs": 2, "max_distance": 2, "min_distance": 2, "name_file": False, "vague": 0},
    5: {"bugs": 3, "max_distance": 2, "min_distance": 2, "name_file": False, "vague": 1},
}
SANDBOX_LIMITS = {"command_timeout_s": 10.0, "test_timeout_s": 20.0, "memory_mb": 512, "processes": 64}


@dataclass(frozen=True)
class Site:
    id: str
    file: str
    kind: str
    original: str
    buggy: str
    distance: int
    example: dict[str, Any] = field(hash=False)


@dataclass(frozen=True)
class Template:
    name: str
    package: str
    files: dict[str, str] = field(hash=False)  # the repository the agent gets (package + visible tests)
    hidden_tests: dict[str, str] = field(hash=False)
    sites: tuple[Site, ...]


def _read_tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)).removesuffix(SUFFIX): p.read_text(encoding="utf-8")
            for p in sorted(root.rglob(f"*{SUFFIX}"))}


@functools.cache
def load_templates() -> dict[str, Template]:
    templates = {}
    for manifest_path in sorted(TEMPLATES_DIR.glob("*/manifest.yaml")):
        root = manifest_path.parent
        manifest = yaml.safe_load(manifest_path.read_text(encoding="utf-8"))
        files = {f"{manifest['package']}/{k}": v for k, v in _read_tree(root / manifest["package"]).items()}
        files.update({f"{TEST_DIR}/{k}": v for k, v in _read_tree(root / TEST_DIR).items()})
        sites = tuple(Site(**site) for site in manifest["sites"])
        templates[manifest["name"]] = Template(manifest["name"], manifest["package"], files,
                                               _read_tree(root / "hidden"), sites)
    return templates


def inject(files: dict[str, str], sites: list[Site]) -> dict[str, str] | None:
    """The files with every site's bug injected, or None when the sites collide (a site's
    original text is not found exactly once, or its buggy text would not be unique, so the
    inverse edit could not be applied)."""
    out = dict(files)
    for site in sites:
        text = out[site.file]
        if text.count(site.original) != 1:
            return None
        out[site.file] = text.replace(site.original, site.buggy)
    for site in sites:
        if out[site.file].count(site.buggy) != 1:
            return None
    return out


def fix_edits(sites: list[Site]) -> list[ToolCall]:
    return [ToolCall(name="edit_file", arguments={"path": s.file, "old": s.buggy, "new": s.original}) for s in sites]


def apply_edits(files: dict[str, str], edits: list[ToolCall]) -> dict[str, str] | None:
    out = dict(files)
    for edit in edits:
        path, old, new = edit.arguments["path"], edit.arguments["old"], edit.arguments["new"]
        if out.get(path, "").count(old) != 1:
            return None
        out[path] = out[path].replace(old, new)
    return out


def _choose_sites(rng: random.Random, template: Template, knobs: dict) -> list[Site] | None:
    pool = [s for s in template.sites if s.distance <= knobs["max_distance"]]
    far = [s for s in pool if s.distance >= knobs["min_distance"]]
    if len(pool) < knobs["bugs"] or not far:
        return None
    first = rng.choice(far)
    rest = [s for s in pool if s is not first and s.file == first.file]  # one module: one template group
    if len(rest) < knobs["bugs"] - 1:
        return None
    return [first] + rng.sample(rest, knobs["bugs"] - 1)


def template_group(template: Template, sites: list[Site]) -> str:
    """The template id of a task: its repository and the one module its bug sites are in."""
    (file,) = {s.file for s in sites}
    module = file.removeprefix(f"{template.package}/").removesuffix(".py").replace("/", ".")
    return f"coding-{template.name}-{module}"


def example_text(site: Site, name_file: bool) -> str:
    ex = site.example
    where = f" (in {site.file})" if name_file else ""
    setup = "; ".join(ex.get("setup", []))
    after = f"after `{setup}`, " if setup else ""
    outcome = f"should raise {ex['expected'].split()[-1]}" if ex["expected"].startswith("raises ") \
        else f"should return `{ex['expected']}`"
    return f"{after}`{ex['call']}` from `{ex['module']}`{where} {outcome}."


def vague_text(site: Site) -> str:
    function = site.example["call"].split("(")[0].split(".")[-1]
    return f"`{function}` from `{site.example['module']}` gives wrong results in some cases."


def _goal(template: Template, sites: list[Site], knobs: dict) -> str:
    n = len(sites)
    lines = [f"The Python package `{template.package}` in your workspace has {n} reported bug{'s' if n > 1 else ''}:"]
    for i, site in enumerate(sites, 1):
        vague = i > n - knobs["vague"]
        lines.append(f"{i}. " + (vague_text(site) if vague else example_text(site, knobs["name_file"])))
    lines.append(f"Fix the source code. Do not change the tests in {TEST_DIR}/: hidden tests check the package "
                 "when you submit.")
    return "\n".join(lines)


def secret_lines(template: Template, limit: int = 6) -> list[str]:
    """Distinctive hidden-test source lines (never in a visible file): seeing one in an
    observation means the hidden tests leaked."""
    visible = "\n".join(template.files.values())
    candidates = []
    for source in template.hidden_tests.values():
        for line in source.splitlines():
            text = line.strip()
            if (text.startswith("def test_hidden_") or text.startswith("assert ")) and len(text) >= 30 \
                    and text not in visible:
                candidates.append(text)
    defs = [c for c in candidates if c.startswith("def ")]
    asserts = [c for c in candidates if c.startswith("assert ")]
    return (defs[: limit // 2] + asserts[: limit - limit // 2])[:limit]


def generate(family: Family, seed: int, level: int) -> TaskSpec:
    knobs = LEVELS[level]
    rng = family.rng(seed, level)
    templates = load_templates()
    for _ in range(100):
        template = templates[rng.choice(sorted(templates))]
        sites = _choose_sites(rng, template, knobs)
        if sites is None:
            continue
        buggy = inject(template.files, sites)
        if buggy is not None and apply_edits(buggy, fix_edits(sites)) == template.files:
            break
    else:
        raise RuntimeError(f"no bug combination found for seed {seed} level {level}")

    bug_files = sorted({s.file for s in sites})
    reference = [ToolCall(name="run_tests", arguments={})]
    reference += [ToolCall(name="read_file", arguments={"path": f}) for f in bug_files]
    reference += fix_edits(sites)
    reference += [ToolCall(name="run_tests", arguments={}),
                  ToolCall(name="submit", arguments={"summary": "fixed: " + ", ".join(s.kind for s in sites)})]
    facts = CodingFacts(
        template=template.name, package=template.package, test_dir=TEST_DIR,
        bugs=[Bug(id=s.id, file=s.file, kind=s.kind, original=s.original, buggy=s.buggy, distance=s.distance)
              for s in sites],
        hidden_tests=dict(template.hidden_tests),
        visible_tests={k: v for k, v in template.files.items() if k.startswith(TEST_DIR + "/")})
    features = {
        "n_bugs": float(len(sites)),
        "n_files": float(sum(1 for f in template.files if not f.startswith(TEST_DIR + "/"))),
        "n_files_touched": float(len(bug_files)),
        "max_distance": float(max(s.distance for s in sites)),
        "named_file": float(knobs["name_file"]),
        "vague_reports": float(knobs["vague"]),
    }
    return family.task(seed=seed, level=level, template_id=template_group(template, sites),
                       goal=_goal(template, sites, knobs), initial_state={"files": buggy, "limits": dict(SANDBOX_LIMITS)},
                       reference=reference, facts=facts, max_steps=len(reference) + 20 + 10 * len(sites),
                       features=features, secrets=secret_lines(template),
                       budget={"step_timeout_s": 60.0, "episode_timeout_s": 600.0})
