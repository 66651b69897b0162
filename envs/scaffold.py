'''`gymfoundry new-family NAME [--dir DIR]`: write a small working family into one folder.

The family is a notebook world (notes read and written by key; the task: copy some notes' texts
into others, change nothing else, submit) with three tools, a seeded generator for levels 1-5
with typed hidden facts, a replay verifier with its three checks, a progress potential and a
crafted disagreement, a scripted policy with a mistake rate, a data-only profile and tests. It
passes `gymfoundry check-family NAME` as written and runs through `gymfoundry run --families
NAME`; a person then replaces the world and keeps the shape.

Written into the envs package folder (the default) it is a built-in family, found by `import
envs` from its folder; written elsewhere it is the top-level package NAME, for a distribution that
declares it under the `gymfoundry.families` entry point group (envs/discovery.py). Its modules
import one another relatively, so the same files work in either place.'''

from __future__ import annotations

import keyword
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from gymfoundry.envs.family import families
from gymfoundry.envs.records import FAMILY_NAME

NAME = re.compile(FAMILY_NAME)
ENVS_DIR = Path(__file__).resolve().parent


class ScaffoldError(ValueError):
    """A family name or folder the scaffold refuses."""


def new_family(name: str, root: str | Path | None = None) -> Path:
    """Write the family `name` into `root/name/` (root: the envs package folder by default) and
    return that folder. Nothing is written when the name is refused."""
    root = ENVS_DIR if root is None else Path(root).resolve()
    builtin = root == ENVS_DIR
    problem = name_problem(name, root, builtin)
    if problem:
        raise ScaffoldError(problem)
    if not root.is_dir():
        raise ScaffoldError(f"{root} is not a folder")
    values = {"name": name, "Name": "".join(p.capitalize() for p in name.split("_")),
              "module": f"gymfoundry.envs.{name}" if builtin else name}
    folder = root / name
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))  # renamed into place when complete
    try:
        for rel, template in TEMPLATES.items():
            path = staging / rel.replace("NAME", name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render(template, values), encoding="utf-8")
        os.rename(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder


def name_problem(name: str, root: Path, builtin: bool = True) -> str | None:
    """Why `name` cannot be a new family in `root`, or None."""
    if not isinstance(name, str) or not NAME.match(name):
        return (f"family name {name!r} must match {FAMILY_NAME} (lower-case letters, digits and _, "
                "starting with a letter): it is a Python package name and part of the env id")
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return f"family name {name!r} is a Python keyword; choose another"
    for taken in (root / name, root / f"{name}.py"):
        if taken.exists():
            return f"{taken} already exists: choose another name (or remove it first)"
    if not builtin and name in sys.stdlib_module_names:
        return f"family name {name!r} is a standard-library module; as a top-level package it would shadow it"
    if name in {f.name for f in families()}:
        return f"a family named {name!r} is already registered; choose another name"
    return None


def render(template: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        template = template.replace("{{" + key + "}}", value)
    return template


def main_message(folder: Path, name: str) -> str:
    """What `gymfoundry new-family` prints after writing the family."""
    lines = [f"wrote family {name!r} in {folder}/:"]
    lines += [f"  {p.relative_to(folder)}" for p in sorted(folder.rglob("*")) if p.is_file()]
    if folder.parent == ENVS_DIR:
        lines += ["next:", f"  gymfoundry check-family {name}",
                  f"  gymfoundry run --families {name} --tasks 20 --data-dir /tmp/{name}-run",
                  f"  pytest {folder / 'tests'}"]
    else:
        lines += ["it is the top-level package " + name + "; to make it a family, install a distribution holding it "
                  "that declares", '  [project.entry-points."gymfoundry.families"]', f'  {name} = "{name}:FAMILY"']
    return "\n".join(lines)


# -- the family's files ({{name}}, {{Name}} and {{module}} are filled in) -----------------------------
INIT = '''"""The {{name}} family (scaffolded by `gymfoundry new-family`): copy notes' texts into other
notes, change nothing else, submit. Declared once, here; found by discovery (envs/discovery.py)."""

from gymfoundry.envs.family import Family

from .generator import GENERATOR_VERSION, {{Name}}Facts, generate
from .policy import {{Name}}Policy
from .verifier import {{Name}}Verifier
from .world import {{Name}}Env

FAMILY = Family(
    name="{{name}}", env={{Name}}Env, generator=generate, generator_version=GENERATOR_VERSION,
    facts={{Name}}Facts, verifier={{Name}}Verifier, scripted_policy={{Name}}Policy)
'''

WORLD = '''"""The {{name}} world: a notebook of notes by key. Tools are declared once, by `@tool` on
`tool_<name>` handlers (typed arguments become the JSON schema, the docstring the description);
every call is written to `state["events"]` with its outcome."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from gymfoundry.envs.base import ToolEnv, ToolError
from gymfoundry.envs.errors import InvalidTask
from gymfoundry.envs.records import TaskSpec, ToolCategory
from gymfoundry.envs.tools import tool

Key = Annotated[str, Field(min_length=1, max_length=40, description="a note's key, e.g. garden/todo")]


class Refusal(str, Enum):
    """The tools' own refusal kinds (a step's `error`)."""

    unknown_note = "unknown_note"


class {{Name}}Env(ToolEnv):
    family = "{{name}}"
    profile_yaml = Path(__file__).with_name("profile.yaml")  # data only; the tools are below

    def initial_state(self, task: TaskSpec) -> dict[str, Any]:
        notes = task.initial_state.get("notes")
        if not isinstance(notes, dict) or not all(isinstance(v, str) for v in notes.values()):
            raise InvalidTask(f"task {task.task_id}: initial_state is not a {{name}} world (notes: key -> text)")
        return {"notes": dict(notes), "events": [], "submitted": False}

    def is_finished(self, state: dict[str, Any]) -> bool:
        return state["submitted"]

    @tool(ToolCategory.read)
    def tool_read(self, state, key: Key):
        """Read the text of a note."""
        return {"key": key, "text": _note(state, key)}

    @tool(ToolCategory.write)
    def tool_write(self, state, key: Key, text: Annotated[str, Field(max_length=200)]):
        """Replace the text of an existing note."""
        _note(state, key)
        state["notes"][key] = text
        return {"key": key, "text": text}

    @tool(ToolCategory.irreversible)
    def tool_submit(self, state):
        """Finish the task. Irreversible; ends the episode."""
        state["submitted"] = True
        return {"submitted": True}


def _note(state: dict[str, Any], key: str) -> str:
    if key not in state["notes"]:
        raise ToolError(Refusal.unknown_note, f"no note {key!r}")
    return state["notes"][key]
'''

GENERATOR = '''"""Seeded tasks of the {{name}} family, with their reference trajectory and typed facts.

`generate(family, seed, level)` is a pure function of (seed, level, GENERATOR_VERSION): every
random choice comes from `family.rng(seed, level)`. Levels 1-5 add copies to make and notes
whose keys share a word with the targets."""

from __future__ import annotations

import itertools

from pydantic import BaseModel, ConfigDict

from gymfoundry.envs.family import Family, HiddenFacts
from gymfoundry.envs.records import TaskSpec, ToolCall

GENERATOR_VERSION = "1"  # bump when any (seed, level) gives another task
TOPICS = ["budget", "garden", "harbor", "kitchen", "launch", "meeting", "orbit", "pantry", "travel"]
KINDS = ["draft", "final", "ideas", "log", "todo"]
WORDS = ["amber", "brisk", "cedar", "delta", "ember", "fable", "glint", "haven", "ivory", "jolly", "lumen"]
COPIES = {1: 1, 2: 1, 3: 2, 4: 2, 5: 3}


class Copy(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    source: str
    dest: str


class {{Name}}Facts(HiddenFacts):
    """What the generator tells the verifier (`task.hidden.checks`), validated both ways."""

    copies: list[Copy]
    expected: dict[str, str]  # dest key -> its text once the task is done


def generate(family: Family, seed: int, level: int) -> TaskSpec:
    rng = family.rng(seed, level)
    n = COPIES[level]
    keys = rng.sample([f"{t}/{k}" for t in TOPICS for k in KINDS], 2 * n + 2 * level)
    texts = rng.sample([" ".join(w) for w in itertools.permutations(WORDS, 3)], len(keys))  # all different
    notes = dict(sorted(zip(keys, texts)))
    copies = [Copy(source=keys[2 * i], dest=keys[2 * i + 1]) for i in range(n)]
    goal = "\\n".join([f'Copy the text of note "{c.source}" into note "{c.dest}".' for c in copies]
                      + ["Change no other note, then submit."])
    reference = []
    for c in copies:
        reference += [ToolCall(name="read", arguments={"key": c.source}),
                      ToolCall(name="write", arguments={"key": c.dest, "text": notes[c.source]})]
    reference.append(ToolCall(name="submit"))
    facts = {{Name}}Facts(copies=copies, expected={c.dest: notes[c.source] for c in copies})
    return family.task(seed=seed, level=level, template_id=family.template_id(sorted(keys[: 2 * n])), goal=goal,
                       initial_state={"notes": notes}, reference=reference, facts=facts,
                       max_steps=2 * len(reference) + 4,
                       features={"n_copies": float(n), "n_notes": float(len(notes))})
'''

POLICY = '''"""Scripted, observation-only policy of the {{name}} family: it reads each source note and
writes its text into the destination, then submits. With probability `mistake_rate` per copy
it makes a realistic mistake (gives up, copies the wrong way round, or drops a word and sometimes
notices), so its rollouts give a mix of outcomes."""

from __future__ import annotations

import re
from collections.abc import Generator

from gymfoundry.envs.scripted import ScriptedPolicy, tool_result

GOAL_COPY = re.compile(r'Copy the text of note "([^"]+)" into note "([^"]+)"')


class {{Name}}Policy(ScriptedPolicy):
    policy_id = "scripted-{{name}}"
    max_turns = 30

    def _final_call(self, reason: str) -> str:
        return self._say(f"Submitting ({reason}).", "submit", {})

    def _run(self, goal: str) -> Generator[str, str, None]:
        for source, dest in GOAL_COPY.findall(goal):
            slip = self.rng.choice(["stop", "swap", "typo"]) if self._mistake() else None
            if slip == "stop":  # gives up before this copy
                break
            if slip == "swap":  # copies the wrong way round
                source, dest = dest, source
            obs = yield self._say(f"Read {source}.", "read", {"key": source})
            text = (tool_result(obs) or {}).get("text", "")
            typo = slip == "typo" and " " in text  # drops the last word
            written = text.rsplit(" ", 1)[0] if typo else text
            yield self._say(f"Write it into {dest}.", "write", {"key": dest, "text": written})
            if typo and self.rng.random() < 0.5:  # notices and writes it again
                yield self._say(f"{dest} lost a word; write it again.", "write", {"key": dest, "text": text})
        yield self._say("Every copy is made.", "submit", {})
'''

VERIFIER = '''"""Outcome verifier and progress potential of the {{name}} family. It replays the agent's
calls on a fresh env (`ReplayVerifier`) and reports three checks of the same outcome:
`observation` from what the agent saw, `invariants` from the final hidden state,
`hidden_variation` from a replay on a variant world (the other notes' texts changed)."""

from __future__ import annotations

from typing import Any

from gymfoundry.envs.records import CheckResult, OutcomeReport, Step, TaskSpec, ToolCall
from gymfoundry.envs.scripted import tool_result
from gymfoundry.envs.verifier import ReplayVerifier, calls_of

from .generator import {{Name}}Facts
from .world import {{Name}}Env


class {{Name}}Verifier(ReplayVerifier):
    verifier_id = "{{name}}-outcome"
    version = "1"  # bump when a verdict changes; `gymfoundry reverify` re-judges stored rollouts
    family = "{{name}}"

    def verify(self, task: TaskSpec, steps: list[Step], final_state: dict[str, Any] | None = None) -> OutcomeReport:
        facts, calls = self.facts(task), calls_of(steps)
        initial = self.initial_state(task)
        final = self.final_state(task, calls) if final_state is None else final_state
        missing = [f"note {k!r} is {final['notes'].get(k)!r}, expected {v!r}" for k, v in facts.expected.items()
                   if final["notes"].get(k) != v] + ([] if final["submitted"] else ["never submitted"])
        changed = [f"note {k!r} changed" for k, v in initial["notes"].items()
                   if k not in facts.expected and final["notes"].get(k) != v]
        checks = {"observation": _observation(facts, steps), "invariants": invariants(facts, initial, final),
                  "hidden_variation": self._variation(task, facts, calls)}
        verdicts = {"completed": not missing, "no_side_effects": not changed}
        success = all(verdicts[rule] for rule in {{Name}}Env.profile.outcome_rules)
        reasons = missing + changed
        if success and not all(checks[c].passed for c in ("invariants", "hidden_variation")):
            success = False  # a success must hold in the hidden state and on the variant too
            reasons += [f"{n}: {r}" for n in ("invariants", "hidden_variation") for r in checks[n].reasons]
        return OutcomeReport(verifier_id=self.verifier_id, verifier_version=self.version, success=success,
                             completed=not missing, regression=False, constraint_violation=False,
                             side_effects=changed, reasons=reasons, checks=checks)

    def potential(self, task: TaskSpec, state: dict[str, Any]) -> float:
        """Phi in [0, 1]: sources read and copies made, less for another note changed; 1.0 only
        after a correct submit, 0.0 after a wrong one."""
        facts, initial = self.facts(task), task.initial_state["notes"]
        made = sum(state["notes"].get(k) == v for k, v in facts.expected.items())
        changed = any(state["notes"].get(k) != v for k, v in initial.items() if k not in facts.expected)
        if state["submitted"]:
            return 1.0 if made == len(facts.expected) and not changed else 0.0
        read = {e["args"]["key"] for e in state["events"] if e["tool"] == "read" and e["outcome"] == "ok"}
        n = len(facts.copies)
        phi = 0.3 * len(read & {c.source for c in facts.copies}) / n + 0.6 * made / n - 0.3 * changed
        return round(min(0.9, max(0.0, phi)), 6)

    def crafted_disagreement(self, task: TaskSpec) -> list[ToolCall]:
        """The reference plus a write to another note: the agent's confirmed copies look right
        (observation passes), the hidden state shows the extra change (invariants fail)."""
        other = next(k for k in task.initial_state["notes"] if k not in self.facts(task).expected)
        *calls, submit = task.hidden.reference
        return [*calls, ToolCall(name="write", arguments={"key": other, "text": "overwritten"}), submit]

    def _variation(self, task: TaskSpec, facts: {{Name}}Facts, calls: list[ToolCall | None]) -> CheckResult:
        touched = {k for c in facts.copies for k in (c.source, c.dest)}
        notes = {k: v if k in touched else v + " (variant)" for k, v in task.initial_state["notes"].items()}
        variant = TaskSpec.model_validate({**task.model_dump(), "initial_state": {"notes": notes}, "task_id": ""})
        result = invariants(facts, self.initial_state(variant), self.final_state(variant, calls))
        return CheckResult(passed=result.passed, reasons=[f"variant: {r}" for r in result.reasons])


def invariants(facts: {{Name}}Facts, initial: dict[str, Any], state: dict[str, Any]) -> CheckResult:
    """The final hidden state: every copy made, every other note as it was, submitted."""
    want = {**initial["notes"], **facts.expected}
    reasons = [f"note {k!r} is {state['notes'].get(k)!r}, want {v!r}" for k, v in want.items()
               if state["notes"].get(k) != v] + ([] if state["submitted"] else ["not submitted"])
    return CheckResult(passed=not reasons, reasons=reasons)


def _observation(facts: {{Name}}Facts, steps: list[Step]) -> CheckResult:
    """Success as the agent saw it: a confirmed write of each copy's text, then an accepted submit."""
    seen: dict[str, str] = {}
    submitted = False
    for step in steps:
        result = tool_result(step.result) if step.tool_call else None
        if result and step.tool_call.name == "write":
            seen[result["key"]] = result["text"]
        submitted = submitted or bool(result and step.tool_call.name == "submit")
    reasons = [f"saw no write of {v!r} into {k!r}" for k, v in facts.expected.items() if seen.get(k) != v]
    return CheckResult(passed=not reasons and submitted, reasons=reasons + ([] if submitted else ["saw no submit"]))
'''

PROFILE = '''name: {{name}}
description: >
  Copy the text of some notes into other notes, change no other note, then submit.
# The tools are declared in code (world.py, @tool); this file is data.
outcome_rules: [completed, no_side_effects]
score_weights:
  rules: {valid_call: 0.2, permitted: 0.3, non_redundant: 0.1, no_undo: 0.2, information_use: 0.2, progress: 1.0, injection_attempt: 1.0}
  layers: {rules: 1.0, judge: 0.5}
approval_required: []
# Values the agent should have seen before using them: a copied text comes from a read.
grounded_arguments:
  read: [key]
  write: [key, text]
judge_rubric:
  instructions: >
    The agent copies the text of named notes into other named notes, changes nothing else, then submits.
  dimensions:
    - name: goal_progress
      weight: 0.6
      description: Does this step move toward exactly the requested copies (or a submit once they are made)?
    - name: grounding
      weight: 0.4
      description: Does the action use what the agent saw (keys from the goal, texts it read)?
'''

TESTS = '''"""The {{name}} family: it passes the conformance checks, its reference succeeds, and its
verifier names what is wrong with a rollout that is not."""

from gymfoundry.envs.check import check_family
from gymfoundry.envs.family import add
from {{module}} import FAMILY

add(FAMILY)  # a no-op once discovery found it; lets the tests run before an external package is installed


def test_passes_the_conformance_checks():
    report = check_family(FAMILY.name, seeds=2)
    assert report.ok, report.render()


def play(task, calls):
    env = FAMILY.make()
    ts = env.reset(task)
    for call in calls:
        ts = env.step(call)
    return ts


def test_the_reference_succeeds_at_every_level():
    for level in FAMILY.levels:
        task = FAMILY.generate(seed=1, level=level)
        ts = play(task, task.hidden.reference)
        assert ts.terminated and ts.info["outcome"]["success"], ts.info["outcome"]["reasons"]


def test_a_wrong_copy_and_an_extra_change_are_named():
    task = FAMILY.generate(seed=1, level=3)
    facts = FAMILY.facts_of(task)
    dest = facts.copies[0].dest
    other = next(k for k in task.initial_state["notes"] if k not in facts.expected)
    outcome = play(task, [{"name": "write", "arguments": {"key": dest, "text": "wrong"}},
                          {"name": "write", "arguments": {"key": other, "text": "x"}},
                          {"name": "submit", "arguments": {}}]).info["outcome"]
    assert not outcome["success"]
    assert f"note {dest!r} is 'wrong'" in outcome["reasons"][0] and f"note {other!r} changed" in outcome["reasons"]
'''

TEMPLATES = {"__init__.py": INIT, "world.py": WORLD, "generator.py": GENERATOR, "policy.py": POLICY,
             "verifier.py": VERIFIER, "profile.yaml": PROFILE, "tests/test_NAME.py": TESTS}
