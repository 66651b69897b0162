"""The README's tour and the docs it links work as written (a quick start that fails is the first
bug a user meets): the README's Python and its `gymfoundry sql` / `gymfoundry report` commands
run, the Python of the docs/ pages listed in OWN_PYTHON runs, every `--option` a page's bash
names exists, the refusals docs/operations.md shows are what the CLI prints, and every relative
link and anchor resolves. (docs/warehouse.md, docs/datasets.md, docs/report.md and
docs/orchestration.md have tests of their own.)"""

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent  # the commands of the venv running the tests
# The docs/ pages whose Python blocks this file runs (and how many each has).
OWN_PYTHON = {"environments.md": 1, "architecture.md": 0, "records.md": 0, "prm.md": 0, "training.md": 0,
              "operations.md": 0, "scaling.md": 0, "experiments.md": 0, "yaml-families.md": 0}


def blocks(path: Path, kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", path.read_text(), re.DOTALL)


def test_readme_has_the_two_commands_first():
    text = README.read_text()
    assert text.index("make demo") < text.index("make test") < text.index("## ")


def test_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    linked = set(re.findall(r"\(docs/([\w-]+\.md)", text))
    assert linked == {p.name for p in DOCS.glob("*.md")}, "every page under docs/ is linked from the README"


def test_every_relative_link_resolves():
    broken = []
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).resolve().is_file():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but - and _ dropped, spaces as -."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_anchor_names_a_heading():
    broken = []
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for target, anchor in re.findall(r"\]\(([^)#\s]*\.md)#([^)\s]+)\)", page.read_text()):
            if anchor not in anchors((page.parent / target).resolve()):
                broken.append(f"{page.relative_to(ROOT)} -> {target}#{anchor}")
    assert not broken


def test_this_file_runs_every_python_block_of_its_pages():
    for name, n in OWN_PYTHON.items():
        assert len(blocks(DOCS / name, "python")) == n, f"docs/{name}: a Python block no test runs"


def test_the_environment_walkthrough_runs():
    (walkthrough,) = blocks(DOCS / "environments.md", "python")
    exec(compile(walkthrough, "docs/environments.md", "exec"), {})


def test_the_tour_runs(tmp_path, prefect_harness, monkeypatch):
    (python,) = blocks(README, "python")
    monkeypatch.chdir(tmp_path)
    python = python.replace("tasks_per_family=50", "tasks_per_family=10")
    scope: dict = {}
    exec(compile(python, "README tour", "exec"), scope)
    sft = scope["report"]["datasets"]["sft"]["path"]
    assert scope["report"]["landed"]["rollouts"] > 0 and (Path(sft).is_file() or Path("tour", sft).is_file())
    assert scope["cells"].height > 0 and set(scope["cells"]["task_family"]) == {"inventory"}
    assert len(scope["mix"]) > 0 and "sft" in scope["mix"].columns

    # The tour's commands read the demo's data dir, ./.gymfoundry.
    os.symlink(tmp_path / "tour", tmp_path / ".gymfoundry")
    commands = [line for block in blocks(README, "bash") for line in block.splitlines()
                if line.startswith(("gymfoundry sql", "gymfoundry report"))]
    assert len(commands) == 3
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    outputs = []
    for command in commands:
        done = subprocess.run(["bash", "-c", command.split("  #")[0]], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, f"{command}\n{done.stderr}"
        outputs.append(done.stdout)
    assert "inventory" in outputs[0] and "success_rate" in outputs[0]
    assert "success" in outputs[1]
    html = (tmp_path / "tour" / "reports" / "report.html").read_text()
    assert "data:image/png;base64," in html


@pytest.mark.integration  # the CLI in subprocesses
@pytest.mark.parametrize("page", ["README.md", *sorted(p.name for p in DOCS.glob("*.md"))])
def test_no_page_names_a_cli_option_that_does_not_exist(page):
    """Every `gymfoundry <command> ... --option` line in a bash block names an option that
    command's --help lists."""
    path = README if page == "README.md" else DOCS / page
    lines = [line for block in blocks(path, "bash") for line in _joined(block) if line.lstrip().startswith("gymfoundry ")]
    for line in lines:
        words = line.split("#")[0].split()
        command = tuple(w for w in words[1:3] if not w.startswith("-") and not w.startswith('"'))[:2]
        command = command if command[:1] in (("warehouse",), ("labels",)) else command[:1]
        for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", line.split("#")[0]):
            assert re.search(rf"(?<![\w-]){option}(?![\w-])", _help(command)), \
                f"{page}: gymfoundry {' '.join(command)} has no {option}"


def _joined(block: str) -> list[str]:
    return block.replace("\\\n", " ").splitlines()


@functools.cache
def _help(command: tuple[str, ...]) -> str:
    done = subprocess.run([str(BIN / "gymfoundry"), *command, "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.integration  # the CLI in subprocesses
def test_the_refusals_operations_md_shows_are_what_the_cli_prints():
    pairs = re.findall(r"^\s*\$ gymfoundry (.+)\n\s*(.+)$", (DOCS / "operations.md").read_text(), re.MULTILINE)
    assert len(pairs) == 4
    for arguments, message in pairs:
        done = subprocess.run([str(BIN / "gymfoundry"), *arguments.split()], capture_output=True,
                              text=True, timeout=10)
        shown, printed = message.strip(), done.stderr.strip()
        assert done.returncode == 2, printed
        if "known families: " in shown:  # a family added since the page was written is listed too
            shown, families = shown.split("known families: ")
            printed, known = printed.split("known families: ")
            assert set(families.split(", ")) <= set(known.split(", "))
        assert printed == shown
