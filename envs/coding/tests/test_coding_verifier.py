"""The coding grader: hidden tests in a fresh sandbox, each aspect reported separately, and
failures attributed to the right class (model error, timeout, constraint violation, env fault)."""

import pytest

import gymfoundry.envs.coding.verifier as grader
from gymfoundry.envs.coding import CodingEnv
from gymfoundry.envs.errors import EnvFault
from gymfoundry.envs.records import Step, TaskSpec, Termination, ToolCall
from gymfoundry.envs.sandbox import SandboxError, bubblewrap
from gymfoundry.envs.timestep import EpisodeEnd
from gymfoundry.tasks.rollout.classify import classify
from gymfoundry.envs.coding.tests.helpers import quick_task, with_limits
from gymfoundry.envs.coding.verifier import CodingVerifier, constraint_violations

from tests.sandbox_guard import needs_sandbox as pytestmark  # noqa: F401  skips here, fails under CI=true


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
    return classify(steps, EpisodeEnd(terminated=True), outcome=report)[0]


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


def test_code_that_hangs_the_tests_is_the_models_failure_with_the_time_limit_as_reason():
    task = quick_task(8, 1, test_timeout_s=1.5)
    module = task.hidden.checks["bugs"][0]["file"]
    steps, state = play(task, [ToolCall(name="run", arguments={
        "argv": ["sh", "-c", "echo 'import time; time.sleep(3600)' >> \"$1\"", "sh", module]}), SUBMIT])
    report = CodingVerifier().verify(task, steps, state)
    assert not report.success and not report.completed and not report.regression
    assert "timeout" not in report.checks and "env_fault" not in report.checks
    assert report.checks["hidden_tests"].reasons[0] == "the tests ran past their 1.5s limit and were killed"
    assert termination(steps, report) == Termination.failure


def test_a_sandbox_without_python_is_an_environment_fault_found_without_the_submission(task, monkeypatch):
    """The same exit 127 that is the model's failure when its code prints it (test_grader_forgery.py)
    is the environment's when the grader's own run on the original files gets it."""
    task = with_limits(task, memory_mb=500)  # a task id no other test has cached
    steps, state = play(task, fixes(task) + [SUBMIT])
    monkeypatch.setattr(bubblewrap, "sandbox_python", lambda: None)
    report = CodingVerifier().verify(task, steps, state)
    [why] = report.checks["env_fault"].reasons
    assert why.startswith("the grading sandbox could not run the tests on the task's original files: "
                          "the test run ended without a complete report (exit code 127")
    assert not report.success and termination(steps, report) == Termination.env_fault
    with pytest.raises(EnvFault, match="^could not run the tests on the original files"):
        CodingVerifier().precondition(task)


def test_the_reference_runs_once_per_task_and_again_only_to_attribute_an_incomplete_run(task, monkeypatch):
    task = with_limits(task, memory_mb=501)
    runs = []

    def counted(task_, files, *args):
        runs.append(files == grader.original_files(task_))
        return observe(task_, files, *args)

    observe = grader.observe
    monkeypatch.setattr(grader, "observe", counted)
    fixed = grader.original_files(task)
    assert all(grader.grade(task, fixed).results.values())
    assert not all(grader.grade(task, task.initial_state["files"]).results.values())
    assert runs == [True, True, False]  # the reference, then the two runs graded against it
    package = task.hidden.checks["package"]
    crashed = {**fixed, f"{package}/__init__.py": "import os\nos._exit(3)\n"}
    result = grader.grade(task, crashed)
    assert runs[3:] == [False, True]  # incomplete: the original files are run again, in a fresh sandbox
    assert result.env_fault is None and not any(result.results.values())
    assert result.problem.startswith("the test run ended without a complete report (exit code 3, ")


def test_honest_prints_and_workspace_files_named_like_startup_modules_do_not_spoil_the_grade(task):
    module = "/".join(task.hidden.checks["bugs"][0]["file"].split("/")[:-1]) + "/__init__.py"
    source = task.initial_state["files"][module]
    chatty = "print('debug ' * 20000)\nimport sys\nsys.stdout.write('{\"test\": 1}\\n')\n"
    exits = "import os\nos._exit(0)\n"
    steps, state = play(task, fixes(task) + [
        ToolCall(name="edit_file", arguments={"path": module, "old": source, "new": chatty + source}),
        *[ToolCall(name="edit_file", arguments={"path": name, "old": "", "new": exits})
          for name in ("sitecustomize.py", "usercustomize.py", "json.py", "hashlib.py")], SUBMIT])
    report = CodingVerifier().verify(task, steps, state)
    assert report.completed and not report.regression and report.checks["visible_tests"].passed
    added = [f"added {n}" for n in ("hashlib.py", "json.py", "sitecustomize.py", "usercustomize.py")]
    assert report.side_effects == added and not report.success  # the grade is sound; the extra files fail it
    assert [r for r in report.reasons if r.startswith("side effect")] == [
        f"side effect: {a}, which the task does not ask for" for a in added]


def test_outcome_records_stay_small_whatever_the_number_of_files_created(task):
    make = ("import os\nfor d in ('junk', 'tests/more'):\n    os.makedirs(d, exist_ok=True)\n"
            "    for i in range(1500):\n        open(f'{d}/f{i:04d}.txt', 'w').close()\n")
    steps, state = play(task, [ToolCall(name="run", arguments={"argv": ["python", "-c", make]}), SUBMIT])
    assert len(state["submission"]) > 3000
    report = CodingVerifier().verify(task, steps, state)
    assert report.side_effects == [f"added junk/f{i:04d}.txt" for i in range(20)] + [
        "added 1480 more files (1500 in all)"]
    [changed] = [r for r in report.reasons if r.startswith("changed test files")]
    assert changed == "changed test files: " + ", ".join(f"tests/more/f{i:04d}.txt" for i in range(20)) + \
        " and 1480 more"
    assert len(report.model_dump_json()) < 8000


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


def test_a_task_whose_bug_sites_do_not_invert_is_refused_with_the_reason(task):
    data = task.model_dump(mode="json")
    data["hidden"]["checks"]["bugs"][0]["buggy"] = "text that is nowhere in the file"
    data["task_id"] = ""
    broken = TaskSpec.model_validate(data)
    assert CodingVerifier().precondition(broken) == \
        f"task {broken.task_id}: the bug sites do not invert to the original files"


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
