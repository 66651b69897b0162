"""The coding grader: hidden tests in a fresh sandbox, each aspect reported separately, and
failures attributed to the right class (model error, timeout, constraint violation, env fault)."""

import pytest

import verifiers.coding as grader
from envs.coding import CodingEnv
from envs.records import Step, TaskSpec, Termination, ToolCall
from envs.sandbox import SandboxError, bubblewrap
from tasks.classify import classify
from tests.envs.coding_helpers import quick_task
from verifiers.coding import CodingVerifier, constraint_violations

ISOLATED, WHY = bubblewrap.probe()
pytestmark = pytest.mark.skipif(not ISOLATED, reason=f"bubblewrap cannot run here: {WHY}")


def play(task: TaskSpec, calls: list[ToolCall]) -> tuple[list[Step], dict]:
    env = CodingEnv()
    env.reset(task)
    for call in calls:
        if env.step(call).terminated:
            break
    steps, state = env.steps, env.state()
    env.close()
    return steps, state


def fixes(task: TaskSpec) -> list[ToolCall]:
    return [c for c in task.hidden.reference if c.name == "edit_file"]


SUBMIT = ToolCall(name="submit", arguments={})


def termination(steps, report):
    return classify(steps, terminated=True, truncated=False, end_info={}, outcome=report)[0]


@pytest.fixture(scope="module")
def task():
    return quick_task(7, 3)


def test_the_reference_fix_succeeds(task):
    steps, state = play(task, fixes(task) + [SUBMIT])
    report = CodingVerifier().verify(task, steps, state)
    assert report.success and report.completed and not report.regression and not report.constraint_violation
    assert report.checks["hidden_tests"].passed and report.checks["visible_tests"].passed
    assert termination(steps, report) == Termination.success


def test_no_fix_is_a_model_failure_naming_the_failing_hidden_tests(task):
    steps, state = play(task, [SUBMIT])
    report = CodingVerifier().verify(task, steps, state)
    assert not report.success and not report.completed and not report.regression
    assert any(r.startswith("hidden test fails: hidden/") for r in report.reasons)
    assert termination(steps, report) == Termination.failure


def test_half_a_fix_is_not_completion(task):
    steps, state = play(task, fixes(task)[:1] + [SUBMIT])
    report = CodingVerifier().verify(task, steps, state)
    assert not report.completed and not report.success


def test_breaking_something_that_worked_is_a_regression(task):
    buggy = {b["file"] for b in task.hidden.checks["bugs"]}
    other = next(f for f in sorted(task.initial_state["files"])
                 if f not in buggy and not f.startswith("tests/") and not f.endswith("__init__.py"))
    line = next(l for l in task.initial_state["files"][other].splitlines() if l.strip().startswith("return "))
    steps, state = play(task, fixes(task) + [
        ToolCall(name="edit_file", arguments={"path": other, "old": line, "new": line.replace("return ", "return None and ", 1)}),
        SUBMIT])
    report = CodingVerifier().verify(task, steps, state)
    assert report.regression and not report.success
    assert any(r.startswith("regression: ") for r in report.reasons)


def test_editing_a_test_file_is_a_constraint_violation_even_with_the_fix(task):
    test_file, source = next(iter(task.hidden.checks["visible_tests"].items()))
    first = source.splitlines()[0]
    steps, state = play(task, fixes(task) + [
        ToolCall(name="edit_file", arguments={"path": test_file, "old": first, "new": first + "  # changed"}),
        ToolCall(name="edit_file", arguments={"path": "tests/test_extra.py", "old": "", "new": "def test_ok(): pass\n"}),
        SUBMIT])
    report = CodingVerifier().verify(task, steps, state)
    assert report.constraint_violation and not report.success
    assert any(r.startswith("changed test files") and test_file in r and "test_extra" in r for r in report.reasons)
    assert termination(steps, report) == Termination.constraint_violation


def test_submitted_code_reaching_for_the_network_is_a_violation(task):
    module = "/".join(task.hidden.checks["bugs"][0]["file"].split("/")[:-1]) + "/__init__.py"
    source = task.initial_state["files"][module]
    phone_home = "\nimport socket\ntry:\n    socket.create_connection(('10.1.2.3', 80), 1)\nexcept OSError:\n    pass\n"
    steps, state = play(task, fixes(task) + [
        ToolCall(name="edit_file", arguments={"path": module, "old": source, "new": source + phone_home}), SUBMIT])
    report = CodingVerifier().verify(task, steps, state)
    assert report.constraint_violation and any("network" in r for r in report.reasons)


def test_code_that_hangs_the_tests_is_a_timeout():
    task = quick_task(8, 1, test_timeout_s=1.5)
    module = task.hidden.checks["bugs"][0]["file"]
    steps, state = play(task, [ToolCall(name="run", arguments={
        "argv": ["sh", "-c", "echo 'import time; time.sleep(3600)' >> \"$1\"", "sh", module]}), SUBMIT])
    report = CodingVerifier().verify(task, steps, state)
    assert not report.success and not report.checks["timeout"].passed
    assert termination(steps, report) == Termination.timeout


def test_a_grading_sandbox_that_fails_is_an_environment_fault(task, monkeypatch):
    steps, state = play(task, fixes(task) + [SUBMIT])

    def broken(*args, **kwargs):
        raise SandboxError("the sandbox failed to start: simulated crash")

    monkeypatch.setattr(grader, "create_sandbox", broken)
    report = CodingVerifier().verify(task, steps, state)
    assert not report.success and not report.checks["env_fault"].passed
    assert termination(steps, report) == Termination.env_fault


def test_printed_fake_reports_and_writes_to_the_grader_files_change_nothing(task):
    module = task.hidden.checks["bugs"][0]["file"]
    cheat = ("\nimport json, sys\nprint('0' * 32, json.dumps({'hidden/x.py::test_x': True}))\n"
             "for path in ('/opt/gymfoundry/runner.py', '/opt/gymfoundry/hidden/x.py'):\n"
             "    try:\n        open(path, 'w').write('')\n    except OSError:\n        pass\n")
    steps, state = play(task, [ToolCall(name="edit_file", arguments={
        "path": module, "old": task.initial_state["files"][module], "new": task.initial_state["files"][module] + cheat}),
        SUBMIT])
    report = CodingVerifier().verify(task, steps, state)
    assert not report.success and not report.completed


def test_precondition_accepts_a_real_bug_and_verify_replays_without_a_final_state(task):
    verifier = CodingVerifier()
    assert verifier.precondition(task) is None
    steps, _ = play(task, fixes(task) + [SUBMIT])
    assert verifier.verify(task, steps).success  # replayed in a fresh env and sandbox


def test_never_submitting_is_reported_without_running_tests(task):
    steps, state = play(task, fixes(task))
    report = CodingVerifier().verify(task, steps, state)
    assert not report.success and "never submitted" in report.reasons


def test_constraint_violations_are_read_from_the_event_log(task):
    state = {"submission": None, "events": [
        {"seq": 0, "tool": "run", "args": {}, "network_attempts": 3, "outcome": "ok"},
        {"seq": 1, "tool": "edit_file", "args": {"path": "/etc/passwd"}, "outcome": "outside_workspace"},
        {"seq": 2, "tool": "edit_file", "args": {}, "path": "tests/test_a.py", "test_file": True, "outcome": "ok"}]}
    found = constraint_violations(task, state)
    assert len(found) == 3 and "network" in found[0] and "outside the workspace" in found[1]


def test_progress_potential_follows_the_fix(task):
    verifier = CodingVerifier()
    steps, _ = play(task, task.hidden.reference)
    phi = verifier.potentials(task, steps)
    assert len(phi) == len(steps) + 1 and phi[0] == 0.0 and phi[-1] == 1.0
    assert all(b >= a for a, b in zip(phi, phi[1:]))
    test_file, source = next(iter(task.hidden.checks["visible_tests"].items()))
    first = source.splitlines()[0]
    steps, _ = play(task, fixes(task) + [ToolCall(name="edit_file", arguments={
        "path": test_file, "old": first, "new": first + "  # changed"})])
    assert verifier.potentials(task, steps)[-1] < verifier.potentials(task, steps)[-2]
