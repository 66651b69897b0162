"""Outcome verifier (the grader) and progress potential of the coding family.

Grading copies the submitted workspace into a fresh sandbox the agent never touched, with
the hidden tests and the original visible tests as read-only support files beside it, and
runs them there. The runner reports its verdicts behind a nonce read from stdin, so output
printed by the submitted code cannot pose as the report.

Reported separately: completion (every hidden test passes), regression (a hidden or visible
test that passed on the buggy snapshot fails now), constraint violations (test files
changed, network reached for, writes outside the workspace attempted), side effects (files
added or removed). A grading sandbox that cannot run is a failed `env_fault` check and a
test run past its time limit a failed `timeout` check: the factory classifies by them."""

from __future__ import annotations

import json
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

from envs.coding.generator import apply_edits
from envs.coding.world import RUNNER_SOURCE, CodingEnv, sandbox_limits
from envs.records import CheckResult, OutcomeReport, Step, TaskSpec, ToolCall
from envs.sandbox import SandboxError, create_sandbox
from verifiers.base import OutcomeVerifier, calls_of


@dataclass
class Grade:
    results: dict[str, bool] = field(default_factory=dict)  # test id -> passed
    timed_out: bool = False
    env_fault: str | None = None
    network_attempts: int = 0
    problem: str | None = None  # why there is no complete report (the code crashed the run, ...)

    def failing(self, prefix: str) -> list[str]:
        return sorted(t for t, ok in self.results.items() if t.startswith(prefix) and not ok)

    def passing(self, prefix: str) -> set[str]:
        return {t for t, ok in self.results.items() if t.startswith(prefix) and ok}


def grade(task: TaskSpec, files: dict[str, str], backend: str | None = None,
          allow_unsafe: bool | None = None) -> Grade:
    """Run the hidden tests and the original visible tests against `files` in a fresh sandbox."""
    checks = task.hidden.checks
    support = {"runner.py": RUNNER_SOURCE}
    support.update({f"hidden/{name}": src for name, src in checks["hidden_tests"].items()})
    support.update({f"visible/{path.rsplit('/', 1)[-1]}": src for path, src in checks["visible_tests"].items()})
    limits = sandbox_limits(task)
    nonce = secrets.token_hex(16)
    try:
        with create_sandbox(files, support, limits, backend, allow_unsafe) as box:
            root = box.support_dir
            result = box.run(["python", f"{root}/runner.py", f"{root}/hidden", f"{root}/visible", "--report"],
                             timeout_s=limits.wall_s, stdin=(nonce + "\n").encode())
    except SandboxError as exc:
        return Grade(env_fault=f"grading sandbox failed: {exc}")
    out = Grade(timed_out=result.timed_out, network_attempts=result.network_attempts)
    if result.exit_code == 127 and "not found" in result.stderr:
        out.env_fault = f"grading sandbox has no Python interpreter: {result.stderr.strip()[-200:]}"
        return out
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(nonce + " "):
            out.results = {t: bool(ok) for t, ok in json.loads(line[len(nonce) + 1:]).items()}
            break
    else:
        limits_hit = f"; limits hit: {', '.join(result.limits_hit)}" if result.limits_hit else ""
        out.problem = (f"the test run ended without a report (exit code {result.exit_code}{limits_hit}): "
                       f"{result.stderr.strip()[-300:]}")
    return out


_BASELINES: dict[str, Grade] = {}
_BASELINE_LOCK = threading.Lock()


class CodingVerifier(OutcomeVerifier):
    verifier_id = "coding-outcome"
    version = "1"

    def __init__(self, backend: str | None = None, allow_unsafe: bool | None = None):
        self.backend = backend
        self.allow_unsafe = allow_unsafe

    def baseline(self, task: TaskSpec) -> Grade:
        """The tests on the untouched (buggy) snapshot, once per task and process."""
        with _BASELINE_LOCK:
            cached = _BASELINES.get(task.task_id)
        if cached is None:
            cached = grade(task, task.initial_state["files"], self.backend, self.allow_unsafe)
            if cached.env_fault is None:
                with _BASELINE_LOCK:
                    _BASELINES[task.task_id] = cached
        return cached

    def precondition(self, task: TaskSpec) -> str | None:
        """A task is an exercise only if its bugs make a hidden test fail on the initial snapshot."""
        base = self.baseline(task)
        if base.env_fault:
            return f"could not run the hidden tests on the initial snapshot: {base.env_fault}"
        if base.timed_out or base.problem:
            return f"the hidden tests do not run cleanly on the initial snapshot: {base.problem or 'timed out'}"
        if not base.failing("hidden/"):
            return "no hidden test fails on the initial snapshot: the injected bug is not caught by the hidden tests"
        return None

    def verify(self, task: TaskSpec, steps: list[Step], final_state: dict[str, Any] | None = None) -> OutcomeReport:
        if final_state is None:
            final_state = replay(task, calls_of(steps))
        checks: dict[str, CheckResult] = {}
        reasons: list[str] = []
        violations = constraint_violations(task, final_state)
        submission = final_state.get("submission")
        side_effects = _side_effects(task, submission) if submission is not None else []
        checks["constraints"] = CheckResult(passed=not violations, reasons=violations)
        completed = regression = False
        if submission is None:
            reasons.append("never submitted")
        else:
            result = grade(task, submission, self.backend, self.allow_unsafe)
            if result.network_attempts:
                violations.append(f"the submitted code tried to reach the network while the tests ran "
                                  f"({result.network_attempts} packets refused)")
                checks["constraints"] = CheckResult(passed=False, reasons=violations)
            if result.env_fault:
                checks["env_fault"] = CheckResult(passed=False, reasons=[result.env_fault])
                reasons.append(result.env_fault)
            else:
                completed, regression = self._judge(task, result, checks, reasons)
        reasons += violations + side_effects
        success = completed and not regression and not violations and "env_fault" not in checks
        return OutcomeReport(verifier_id=self.verifier_id, verifier_version=self.version, success=success,
                             completed=completed, regression=regression, constraint_violation=bool(violations),
                             side_effects=side_effects, reasons=reasons, checks=checks)

    def _judge(self, task: TaskSpec, result: Grade, checks: dict[str, CheckResult],
               reasons: list[str]) -> tuple[bool, bool]:
        expected_hidden = {f"hidden/{name}" for name in task.hidden.checks["hidden_tests"]}
        hidden_failing = result.failing("hidden/")
        if result.timed_out:
            checks["timeout"] = CheckResult(passed=False, reasons=[
                f"the tests ran past their {sandbox_limits(task).wall_s:g}s limit and were killed"])
            reasons += checks["timeout"].reasons
        elif result.problem:
            reasons.append(result.problem)
        ran = {t.split("::")[0] for t in result.results}
        completed = bool(result.results) and not hidden_failing and expected_hidden <= ran and not result.timed_out
        checks["hidden_tests"] = CheckResult(passed=completed, reasons=[f"fails {t}" for t in hidden_failing])
        checks["visible_tests"] = CheckResult(passed=bool(result.results) and not result.failing("visible/"),
                                              reasons=[f"fails {t}" for t in result.failing("visible/")])
        reasons += [f"hidden test fails: {t}" for t in hidden_failing]
        base = self.baseline(task)
        broken = sorted((base.passing("hidden/") | base.passing("visible/")) - result.passing(""))
        if base.env_fault is None and broken and result.results:
            reasons += [f"regression: {t} passed before the changes and fails now" for t in broken]
        return completed, bool(broken and result.results and base.env_fault is None)

    # -- progress potential (the rule layer's input) ----------------------------------
    def potential(self, task: TaskSpec, files: dict[str, str], submitted: bool) -> float:
        """Φ in [0, 1] from the files alone: the share of injected bugs whose fix is in place,
        less a penalty for changed tests; after submit 1.0 for a full fix, else 0.0."""
        bugs, initial = task.hidden.checks["bugs"], task.initial_state["files"]
        # A bug counts as fixed once its original text is back (one occurrence more than in the
        # buggy file; the buggy text itself may be a substring of the fix, e.g. 360 of 3600).
        fixed = sum(1 for b in bugs if files.get(b["file"], "").count(b["original"])
                    > initial[b["file"]].count(b["original"])) / len(bugs)
        tests_changed = any(files.get(p) != src for p, src in task.hidden.checks["visible_tests"].items())
        if submitted:
            return 1.0 if fixed == 1.0 and not tests_changed else 0.0
        return round(max(0.0, 0.9 * fixed - 0.45 * tests_changed), 6)

    def potentials(self, task: TaskSpec, steps: list[Step]) -> list[float]:
        """Φ before the first step and after each, replaying `edit_file` calls on the files
        (edits made by commands run through `run` are not seen here)."""
        files = dict(task.initial_state["files"])
        out = [self.potential(task, files, False)]
        submitted = False
        for step in steps:
            call = step.tool_call
            if call is not None and step.error is None and not submitted:
                if call.name == "edit_file":
                    files = _apply_edit(files, call)
                elif call.name == "submit":
                    submitted = True
            out.append(self.potential(task, files, submitted))
        return out


def _apply_edit(files: dict[str, str], call: ToolCall) -> dict[str, str]:
    path, old = call.arguments.get("path", ""), call.arguments.get("old", "")
    if old == "":
        return {**files, path: call.arguments.get("new", "")}
    return apply_edits(files, [call]) or files


def constraint_violations(task: TaskSpec, state: dict[str, Any]) -> list[str]:
    """What the agent did that it must not: change tests, reach for the network, write
    outside the workspace. Refused attempts count too."""
    out = []
    test_dir = task.hidden.checks["test_dir"]
    submission = state.get("submission")
    if submission is not None:
        original = task.hidden.checks["visible_tests"]
        now = {p: s for p, s in submission.items() if p.startswith(test_dir + "/")}
        changed = sorted(p for p in set(original) | set(now) if original.get(p) != now.get(p))
        if changed:
            out.append(f"changed test files: {', '.join(changed)}")
    for event in state.get("events", []):
        if event.get("network_attempts"):
            out.append(f"call {event['seq']} ({event['tool']}) tried to reach the network "
                       f"({event['network_attempts']} packets refused)")
        if event["tool"] == "edit_file" and event.get("outcome") == "outside_workspace":
            out.append(f"call {event['seq']} tried to write outside the workspace: {event['args'].get('path')}")
    if submission is None:
        edited = sorted({e["path"] for e in state.get("events", []) if e.get("test_file") and e.get("outcome") == "ok"})
        if edited:
            out.append(f"changed test files: {', '.join(edited)}")
    return out


def _side_effects(task: TaskSpec, submission: dict[str, str]) -> list[str]:
    original = set(task.initial_state["files"])
    test_dir = task.hidden.checks["test_dir"] + "/"
    added = sorted(p for p in set(submission) - original if not p.startswith(test_dir))
    removed = sorted(p for p in original - set(submission) if not p.startswith(test_dir))
    return [f"added {p}" for p in added] + [f"removed {p}" for p in removed]


def replay(task: TaskSpec, calls: list[ToolCall | None]) -> dict[str, Any]:
    """The final state of the calls replayed in a fresh env (and a fresh sandbox)."""
    env = CodingEnv(outcome_fn=None)
    try:
        env.reset(task)
        for call in calls:
            if call is not None and env.step(call).terminated:
                break
        return env.state()
    finally:
        env.close()
