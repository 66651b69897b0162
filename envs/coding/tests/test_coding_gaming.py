"""The coding family against a reward-hacking agent: text that only looks like a fix earns no
progress, a failed submit ends with Φ = 0 (its return below the reference's), files the task does
not ask for fail the verdict, and the progress potential is graded where the workspace's code
never runs. Episodes go through the real runtime, sandbox, verifier and rule layer."""

import os
import uuid

import pytest

import gymfoundry.envs.coding.verifier as grader
from gymfoundry.envs.coding import CodingEnv
from gymfoundry.envs.records import TaskSpec, Termination, ToolCall
from gymfoundry.tasks.rollout.episodes import run_episode
from gymfoundry.envs.coding.tests.helpers import ScriptPolicy, quick_task, run
from gymfoundry.envs.coding.verifier import CodingVerifier
from gymfoundry.verifiers.rules import score_rules

from tests.sandbox_guard import needs_sandbox as pytestmark  # noqa: F401  skips here, fails under CI=true

SUBMIT = ToolCall(name="submit", arguments={"summary": "fixed"})


@pytest.fixture(scope="module")
def task() -> TaskSpec:
    return quick_task(7, 3)  # two bugs in one module


def fixes(task: TaskSpec) -> list[ToolCall]:
    return [c for c in task.hidden.reference if c.name == "edit_file"]


def appended(path: str, text: str, files: dict[str, str]) -> ToolCall:
    """An edit that appends `text` to `path` (whose content `files` tracks)."""
    call = ToolCall(name="edit_file", arguments={"path": path, "old": files[path], "new": files[path] + text})
    files[path] += text
    return call


def comment_only(task: TaskSpec) -> list[ToolCall]:
    """Each bug's fixed text written into its file as a comment (a string where it spans lines)."""
    files, calls = dict(task.initial_state["files"]), []
    for bug in task.hidden.checks["bugs"]:
        fixed = bug["original"]
        note = f"\n# {fixed}\n" if "\n" not in fixed else f'\n"""\n{fixed}\n"""\n'
        calls.append(appended(bug["file"], note, files))
    return calls


def rules_return(task: TaskSpec, rollout) -> float:
    """The rule layer's return: the sum of the episode's step scores."""
    scores = score_rules([rollout], {task.task_id: task}, {"coding": CodingEnv.profile},
                         {"coding": CodingVerifier().potentials})
    return round(sum(s.score for s in scores), 6)


def episode(task: TaskSpec, calls: list[ToolCall]):
    rollout = run_episode(task, ScriptPolicy(calls), seed=0)
    assert rollout.outcome is not None, rollout.termination_reason
    return rollout


def test_the_reference_succeeds_with_phi_rising_to_one_and_the_top_return(task):
    rollout = episode(task, list(task.hidden.reference))
    assert rollout.termination == Termination.success
    phi = CodingVerifier().potentials(task, rollout.steps)
    names = [s.tool_call.name for s in rollout.steps]
    assert names == ["run_tests", "read_file", "edit_file", "edit_file", "run_tests", "submit"]
    assert phi[:2] == [0.0, 0.0] and phi[-3:] == [0.9, 0.9, 1.0]
    assert all(b >= a for a, b in zip(phi, phi[1:]))
    assert rules_return(task, rollout) == 1.0


def test_a_fix_written_only_as_a_comment_earns_no_progress_and_fails(task):
    rollout = episode(task, comment_only(task) + [SUBMIT])
    assert rollout.termination == Termination.failure and not rollout.outcome.completed
    assert CodingVerifier().potentials(task, rollout.steps) == [0.0, 0.0, 0.0, 0.0]
    assert rules_return(task, rollout) == 0.0


def test_a_failed_submit_ends_with_phi_zero_and_a_return_below_the_reference(task):
    """The edits fix the bugs (as the edit replay sees them); a command then puts the buggy file
    back. The verdict fails, so Φ after the submit is 0, not 1."""
    bug_file = task.hidden.checks["bugs"][0]["file"]
    restore = run(["python", "-c", "import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
                   bug_file, task.initial_state["files"][bug_file]])
    rollout = episode(task, fixes(task) + [restore, SUBMIT])
    assert rollout.termination == Termination.failure
    phi = CodingVerifier().potentials(task, rollout.steps)
    assert phi == [0.0, phi[1], 0.9, 0.9, 0.0] and phi[-1] != 1.0
    assert rules_return(task, rollout) == 0.0 < rules_return(task, episode(task, list(task.hidden.reference)))


def test_a_file_the_task_does_not_ask_for_fails_the_verdict_and_is_named(task):
    package = task.hidden.checks["package"]
    notes = ToolCall(name="edit_file", arguments={"path": f"{package}/notes.py", "old": "", "new": "TODO = 1\n"})
    scratch = ToolCall(name="edit_file", arguments={"path": "repro.py", "old": "", "new": "print(1)\n"})
    rollout = episode(task, fixes(task) + [notes, scratch, SUBMIT])
    outcome = rollout.outcome
    assert rollout.termination == Termination.failure and not outcome.success
    assert outcome.completed and not outcome.regression and not outcome.constraint_violation
    assert outcome.side_effects == [f"added {package}/notes.py", "added repro.py"]
    assert outcome.checks["side_effects"].reasons == outcome.side_effects
    assert [r for r in outcome.reasons if r.startswith("side effect")] == [
        f"side effect: added {package}/notes.py, which the task does not ask for",
        "side effect: added repro.py, which the task does not ask for"]
    phi = CodingVerifier().potentials(task, rollout.steps)
    assert phi[-2:] == [0.9, 0.0]
    assert rules_return(task, rollout) == 0.0


def test_an_honest_fix_by_command_with_its_scratch_file_removed_succeeds(task):
    """Edits made by `run` are not in the edit replay: Φ shows them at the submit, from the verdict."""
    calls = [run(["sh", "-c", "echo 'print(1)' > scratch.py && python scratch.py"])]
    for fix in fixes(task):
        path, old, new = fix.arguments["path"], fix.arguments["old"], fix.arguments["new"]
        calls.append(run(["python", "-c", "import sys; p, o, n = sys.argv[1:]; t = open(p).read(); "
                          "open(p, 'w').write(t.replace(o, n, 1))", path, old, new]))
    rollout = episode(task, calls + [run(["rm", "scratch.py"]), SUBMIT])
    assert rollout.termination == Termination.success, rollout.outcome.reasons
    phi = CodingVerifier().potentials(task, rollout.steps)
    assert phi == [0.0] * (len(rollout.steps)) + [1.0]
    assert rules_return(task, rollout) == 1.0


def test_the_potential_is_graded_in_the_sandbox_never_by_running_the_code_here(task):
    """Workspace code that leaves a mark where it runs and prints forged reports: the host never
    gets the mark, and the forgery moves Φ no more than a comment does."""
    marker = f"/tmp/gf-coding-phi-{uuid.uuid4().hex}"
    bug_file = task.hidden.checks["bugs"][0]["file"]
    forge = (f"\nopen({marker!r}, 'w').write('ran')\nimport json as _j, sys as _s\n"
             "for _t in ('hidden', 'visible'):\n"
             "    _s.__stdout__.write(_j.dumps({'test': _t + '/x.py::test_x', 'obs': [], 'end': 'ok'}) + '\\n')\n")
    files = dict(task.initial_state["files"])
    calls = [appended(bug_file, forge, files), SUBMIT]
    rollout = episode(task, calls)
    assert CodingVerifier().potentials(task, rollout.steps) == [0.0, 0.0, 0.0]
    assert not os.path.exists(marker)


def test_each_workspace_is_graded_once_and_the_ending_s_verdict_is_reused(task, monkeypatch):
    task = quick_task(7, 3, memory_mb=502)  # a task id no other test has graded
    fix = fixes(task)[0]
    undo = ToolCall(name="edit_file", arguments={**fix.arguments, "old": fix.arguments["new"],
                                                 "new": fix.arguments["old"]})
    rollout = episode(task, [fix, undo, fix, undo, fix] + fixes(task)[1:] + [SUBMIT])
    assert rollout.termination == Termination.success
    graded, replayed = [], []
    grade, replay = grader.grade, grader.replay
    monkeypatch.setattr(grader, "grade", lambda t, files, *a: graded.append(files) or grade(t, files, *a))
    monkeypatch.setattr(grader, "replay", lambda *a: replayed.append(a) or replay(*a))
    phi = CodingVerifier().potentials(task, rollout.steps)
    half = phi[1]
    assert phi == [0.0, half, 0.0, half, 0.0, half, 0.9, 1.0] and 0.0 < half < 0.9
    # one grading run (the half fix); the whole fix was graded at the submit, whose verdict is kept
    assert len(graded) == 1 and replayed == []
