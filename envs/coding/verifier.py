"""Outcome verifier (the grader) and progress potential of the coding family.

The verdict is computed here, in a process that never imports or runs the submitted code.
The examiner (envs/coding/examiner.py) rewrites the hidden tests and the original visible
tests so that they observe values instead of asserting expected ones; the observer runs them
with `python -I` in a fresh sandbox holding the submission and returns plain data, which is
parsed defensively and compared with the observations of the same tests on the task's original
files (a separate sandbox, once per task). A test passes iff it ran to completion and its
observations equal the reference exactly, so nothing the submitted code prints, patches, reads,
writes or exits with can pass a test: it never holds the expected values.

Reported separately: completion (every hidden test passes), regression (a hidden or visible
test that passed on the buggy snapshot fails now, by the same comparison), constraint
violations (test files changed, network reached for, writes outside the workspace attempted),
side effects (files added or removed outside the tests, which the task never asks for: they fail
the verdict; a count and the first names).

The progress potential measures behaviour, never text: before the ending, Φ of a workspace is the
share of the hidden tests the bugs break that pass on it, graded exactly as a submission is (once
per workspace content, cached); after the submit, Φ is the verdict (1.0 for a verified success,
0.0 otherwise), so a failed fix never earns a real fix's step rewards.

Attribution by boundary, never by text the submitted code could print: a sandbox that cannot
start or run, or a grading sandbox that cannot run the tests on the original files (checked
again in a fresh sandbox whenever a submission's run is incomplete), is a failed `env_fault`
check. Submitted code that crashes the run, exits early (127 included) or hangs it past the time
limit is a model failure: the hidden tests fail, with the reason."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

from gymfoundry.envs.coding import examiner
from gymfoundry.envs.coding.examiner import Observed
from gymfoundry.envs.coding.facts import CodingFacts
from gymfoundry.envs.coding.generator import apply_edits
from gymfoundry.envs.coding.world import CodingEnv, sandbox_limits
from gymfoundry.envs.errors import EnvFault
from gymfoundry.envs.family import family, masked_dirs
from gymfoundry.envs.records import CheckResult, OutcomeReport, Step, TaskSpec, ToolCall, content_hash
from gymfoundry.envs.sandbox import CommandResult, PathError, PathKind, SandboxError, create_sandbox
from gymfoundry.envs.sandbox.base import normalize_path
from gymfoundry.envs.verifier import OutcomeVerifier, calls_of

MAX_NAMED = 20  # file names listed in a reason; the rest are counted
MAX_CACHED = 4096  # grades of workspaces and verdicts of episodes kept per process (oldest dropped first)


@dataclass
class Grade:
    results: dict[str, bool] = field(default_factory=dict)  # test id -> passed
    timed_out: bool = False
    env_fault: str | None = None
    network_attempts: int = 0
    problem: str | None = None  # why the run is incomplete (the code crashed it, exited, hung, ...)

    def failing(self, prefix: str) -> list[str]:
        return sorted(t for t, ok in self.results.items() if t.startswith(prefix) and not ok)

    def passing(self, prefix: str) -> set[str]:
        return {t for t, ok in self.results.items() if t.startswith(prefix) and ok}


@dataclass(frozen=True)
class Exam:
    """The rewritten tests of a task (support files of the grading sandbox), their test ids,
    and the reference observations on the original files."""

    support: dict[str, str]
    test_ids: frozenset[str]
    reference: dict[str, Observed]


def facts(task: TaskSpec) -> CodingFacts:
    """The task's hidden facts, validated (an `InvalidTask` naming the bad fields if not)."""
    return family(CodingEnv.family).facts_of(task)


def exam_support(task: TaskSpec) -> tuple[dict[str, str], frozenset[str]]:
    checks = facts(task)
    sources = {f"hidden/{name}": src for name, src in checks.hidden_tests.items()}
    sources.update({f"visible/{path.rsplit('/', 1)[-1]}": src for path, src in checks.visible_tests.items()})
    support, ids = {"observer.py": examiner.OBSERVER_SOURCE}, set()
    for name, source in sources.items():
        support[name], tests = examiner.rewrite(source)
        ids.update(f"{name}::{t}" for t in tests)
    return support, frozenset(ids)


def original_files(task: TaskSpec) -> dict[str, str]:
    """The task's package before its bugs were injected (the inverse edits of its bug sites)."""
    edits = [ToolCall(name="edit_file", arguments={"path": b.file, "old": b.buggy, "new": b.original})
             for b in facts(task).bugs]
    files = apply_edits(task.initial_state["files"], edits)
    if files is None:
        raise ValueError(f"task {task.task_id}: the bug sites do not invert to the original files")
    return files


def observe(task: TaskSpec, files: dict[str, str], support: dict[str, str], backend: str | None,
            allow_unsafe: bool | None) -> CommandResult:
    """Run the rewritten tests on `files` in a fresh sandbox (SandboxError when it cannot run)."""
    limits = sandbox_limits(task)
    with create_sandbox(files, support, limits, backend, allow_unsafe, masked_dirs()) as box:
        root = box.support_dir
        return box.run(["python", "-I", f"{root}/observer.py", box.workdir, f"hidden={root}/hidden",
                        f"visible={root}/visible"], timeout_s=limits.wall_s)


def _incomplete(result: CommandResult, seen: set[str], ids: frozenset[str]) -> bool:
    return result.timed_out or result.exit_code != 0 or not ids <= seen


_EXAMS: dict[str, Exam] = {}
_BASELINES: dict[str, Grade] = {}
_GRADES: dict[tuple[str, str], Grade] = {}  # (task id, workspace digest) -> its grade
_VERDICTS: dict[tuple[str, str, str], bool] = {}  # (verifier version, task id, calls digest) -> success
_CACHE_LOCK = threading.Lock()


def _keep(cache: dict, key: Any, value: Any) -> None:
    with _CACHE_LOCK:
        cache[key] = value
        while len(cache) > MAX_CACHED:
            cache.pop(next(iter(cache)))


def workspace_digest(files: dict[str, str]) -> str:
    """A digest of a workspace's paths and texts (texts may hold the surrogates of undecodable bytes)."""
    digest = hashlib.sha256()
    for path in sorted(files):
        for part in (path, files[path]):
            data = part.encode("utf-8", "surrogatepass")
            digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def exam(task: TaskSpec, backend: str | None = None, allow_unsafe: bool | None = None,
         fresh: bool = False) -> Exam | str:
    """The task's exam, its reference run cached per task and process; or why the grading
    sandbox cannot run the tests on the original files (an environment fault: no submitted
    code is involved). `fresh` runs the reference again in a new sandbox."""
    with _CACHE_LOCK:
        cached = None if fresh else _EXAMS.get(task.task_id)
    if cached is not None:
        return cached
    support, ids = exam_support(task)
    try:
        result = observe(task, original_files(task), support, backend, allow_unsafe)
    except SandboxError as exc:
        return f"grading sandbox failed: {exc}"
    reference, modules = examiner.parse_report(result.stdout, set(ids))
    if _incomplete(result, set(reference), ids):
        return "the grading sandbox could not run the tests on the task's original files: " + \
            _why_incomplete(task, result, modules, len(ids - set(reference)))
    out = Exam(support, ids, reference)
    with _CACHE_LOCK:
        _EXAMS[task.task_id] = out
    return out


def grade(task: TaskSpec, files: dict[str, str], backend: str | None = None,
          allow_unsafe: bool | None = None) -> Grade:
    """Observe the hidden and original visible tests on `files` and compare with the reference."""
    ready = exam(task, backend, allow_unsafe)
    if isinstance(ready, str):
        return Grade(env_fault=ready)
    try:
        result = observe(task, files, ready.support, backend, allow_unsafe)
    except SandboxError as exc:
        return Grade(env_fault=f"grading sandbox failed: {exc}")
    got, modules = examiner.parse_report(result.stdout, set(ready.test_ids))
    out = Grade(results={t: examiner.passes(ready.reference.get(t), got.get(t)) for t in sorted(ready.test_ids)},
                timed_out=result.timed_out, network_attempts=result.network_attempts)
    if _incomplete(result, set(got), ready.test_ids):
        again = exam(task, backend, allow_unsafe, fresh=True)  # is it the sandbox? ask it without the submission
        if isinstance(again, str):
            return Grade(env_fault=again, network_attempts=result.network_attempts)
        out.problem = _why_incomplete(task, result, modules, len(ready.test_ids - set(got)))
    return out


def graded(task: TaskSpec, files: dict[str, str], backend: str | None = None,
           allow_unsafe: bool | None = None) -> Grade:
    """`grade`, once per task and workspace content (a grade with an env fault is not kept)."""
    key = (task.task_id, workspace_digest(files))
    with _CACHE_LOCK:
        cached = _GRADES.get(key)
    if cached is None:
        cached = grade(task, files, backend, allow_unsafe)
        if cached.env_fault is None:
            _keep(_GRADES, key, cached)
    return cached


def _why_incomplete(task: TaskSpec, result: CommandResult, modules: dict[str, str], missing: int) -> str:
    if result.timed_out:
        return f"the tests ran past their {sandbox_limits(task).wall_s:g}s limit and were killed"
    hits = f"; limits hit: {', '.join(result.limits_hit)}" if result.limits_hit else ""
    imports = "".join(f"; {m} could not be imported ({e})" for m, e in sorted(modules.items())[:5])
    return (f"the test run ended without a complete report (exit code {result.exit_code}, {missing} tests "
            f"unreported{hits}{imports}): {result.stderr.strip()[-300:]}")


class CodingVerifier(OutcomeVerifier):
    verifier_id = "coding-outcome"
    # 2: observations, not verdicts; 3: exception helpers observed as their plain calls; 4: added or
    # removed files fail the verdict, Φ measures the hidden tests on the workspace and follows the verdict
    version = "4"
    # Declared to the conformance checker (envs.check): why a generic check does not apply here.
    not_applicable = {"verifier_checks": "the verdict is the tests run on the submission in a fresh sandbox "
                                         "(hidden_tests, visible_tests, constraints), not an observation-only "
                                         "judgement nor a replay on variant snapshots"}

    # What the agent looked at and said, not what it changed (the audit's collateral check).
    ephemeral_state = ("events", "summary")

    def __init__(self, backend: str | None = None, allow_unsafe: bool | None = None):
        self.backend = backend
        self.allow_unsafe = allow_unsafe

    def final_state(self, task: TaskSpec, calls: list[ToolCall | None]) -> dict[str, Any]:
        """The state after `calls`, replayed in a fresh env and sandbox."""
        return replay(task, calls)

    def crafted_disagreement(self, task: TaskSpec) -> list[ToolCall]:
        """For the conformance checker (envs.check): the reference fix with a test file added
        under the test directory before the submit. The tests pass (the hidden ones and the
        original visible ones, which the grader runs, not the workspace's), the constraints check
        fails (test files changed): not a success."""
        *work, submit = task.hidden.reference
        test = f"{facts(task).test_dir}/test_crafted_extra.py"
        return [*work, ToolCall(name="edit_file", arguments={"path": test, "old": "",
                                                             "new": "def test_extra():\n    assert True\n"}), submit]

    def baseline(self, task: TaskSpec) -> Grade:
        """The tests on the untouched (buggy) snapshot, once per task and process."""
        with _CACHE_LOCK:
            cached = _BASELINES.get(task.task_id)
        if cached is None:
            cached = grade(task, task.initial_state["files"], self.backend, self.allow_unsafe)
            if cached.env_fault is None:
                with _CACHE_LOCK:
                    _BASELINES[task.task_id] = cached
        return cached

    def precondition(self, task: TaskSpec) -> str | None:
        """A task is an exercise only if every test runs cleanly on the original files and its
        bugs make a hidden test fail on the initial snapshot; why not, else None. Raises EnvFault
        when the grading sandbox cannot run the tests at all: that says nothing about the task."""
        try:
            original_files(task)
        except ValueError as exc:
            return str(exc)
        ready = exam(task, self.backend, self.allow_unsafe)
        if isinstance(ready, str):
            raise EnvFault(f"could not run the tests on the original files: {ready}")
        unclean = sorted(t for t, seen in ready.reference.items() if seen.end != "ok")
        if unclean:
            return f"tests end with an exception on the original files: {', '.join(unclean[:5])}"
        base = self.baseline(task)
        if base.env_fault:
            raise EnvFault(f"could not run the hidden tests on the initial snapshot: {base.env_fault}")
        if base.problem:
            return f"the hidden tests do not run cleanly on the initial snapshot: {base.problem}"
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
        checks["side_effects"] = CheckResult(passed=not side_effects, reasons=side_effects)
        completed = regression = False
        if submission is None:
            reasons.append("never submitted")
        else:
            result = grade(task, submission, self.backend, self.allow_unsafe)  # afresh: the verdict is never a cached one
            if result.env_fault is None:
                _keep(_GRADES, (task.task_id, workspace_digest(submission)), result)
            if result.network_attempts:
                violations.append(f"the submitted code tried to reach the network while the tests ran "
                                  f"({result.network_attempts} packets refused)")
                checks["constraints"] = CheckResult(passed=False, reasons=violations)
            if result.env_fault:
                checks["env_fault"] = CheckResult(passed=False, reasons=[result.env_fault])
                reasons.append(result.env_fault)
            else:
                completed, regression = self._judge(task, result, checks, reasons)
        reasons += violations + [f"side effect: {e}, which the task does not ask for" for e in side_effects]
        verdicts = {"completed": completed, "no_regression": not regression,
                    "no_constraint_violation": not violations, "no_side_effects": not side_effects}
        success = all(verdicts[rule] for rule in CodingEnv.profile.outcome_rules) and "env_fault" not in checks
        if submission is not None and "env_fault" not in checks:
            _keep(_VERDICTS, self._episode_key(task, steps), success)
        return OutcomeReport(verifier_id=self.verifier_id, verifier_version=self.version, success=success,
                             completed=completed, regression=regression, constraint_violation=bool(violations),
                             side_effects=side_effects, reasons=reasons, checks=checks)

    def _judge(self, task: TaskSpec, result: Grade, checks: dict[str, CheckResult],
               reasons: list[str]) -> tuple[bool, bool]:
        hidden_failing, visible_failing = result.failing("hidden/"), result.failing("visible/")
        incomplete = [result.problem] if result.problem else []
        completed = bool(result.results) and not hidden_failing and not incomplete
        checks["hidden_tests"] = CheckResult(passed=completed, reasons=incomplete + [f"fails {t}" for t in hidden_failing])
        checks["visible_tests"] = CheckResult(passed=bool(result.results) and not visible_failing and not incomplete,
                                              reasons=[f"fails {t}" for t in visible_failing])
        reasons += incomplete + [f"hidden test fails: {t}" for t in hidden_failing]
        if incomplete:  # the run did not finish: failing tests say so, not which worked before
            return False, False
        base = self.baseline(task)
        if base.env_fault is not None:
            return completed, False
        broken = sorted((base.passing("hidden/") | base.passing("visible/")) - result.passing(""))
        reasons += [f"regression: {t} passed before the changes and fails now" for t in broken]
        return completed, bool(broken)

    # -- progress potential (the rule layer's input) ----------------------------------
    def potential(self, task: TaskSpec, files: dict[str, str], checks: CodingFacts | None = None) -> float:
        """Φ in [0, 0.9] of a workspace before the ending, from what its code does: the share of the
        hidden tests the bugs break (those failing on the initial snapshot) that pass on `files`,
        graded as a submission is; less 0.45 when a test that passed there fails now, and 0.45 when
        a visible test file changed. Text a test cannot observe (a comment) moves nothing."""
        checks = facts(task) if checks is None else checks
        base = self.baseline(task)
        if base.env_fault is not None:
            raise EnvFault(f"could not run the hidden tests on the initial snapshot: {base.env_fault}")
        if files == task.initial_state["files"]:
            return 0.0
        result = graded(task, files, self.backend, self.allow_unsafe)
        if result.env_fault is not None:
            again = exam(task, self.backend, self.allow_unsafe, fresh=True)  # is it the sandbox? ask without the files
            if isinstance(again, str):
                raise EnvFault(f"could not grade a workspace for the progress potential: {again}")
            return 0.0  # the sandbox took the original files but not these: they show no progress
        target, passing = base.failing("hidden/"), result.passing("")
        fixed = sum(t in passing for t in target) / len(target) if target else 0.0
        broken = bool((base.passing("hidden/") | base.passing("visible/")) - passing)
        tests_changed = any(files.get(p) != src for p, src in checks.visible_tests.items())
        return round(max(0.0, 0.9 * fixed - 0.45 * broken - 0.45 * tests_changed), 6)

    def potentials(self, task: TaskSpec, steps: list[Step]) -> list[float]:
        """Φ before the first step and after each. Before the submit, `potential` of the files as
        the `edit_file` calls leave them (edits made by commands run through `run` are not seen
        here); from the submit on, the verdict: 1.0 for a verified success, else 0.0."""
        files, checks = dict(task.initial_state["files"]), facts(task)
        out = [self.potential(task, files, checks)]
        ended = False
        for i, step in enumerate(steps):
            call = step.tool_call if step.error is None else None
            if not ended and call is not None and call.name == "submit":
                ended = True
                out.append(1.0 if self._succeeded(task, steps[:i + 1]) else 0.0)
            elif not ended and call is not None and call.name == "edit_file":
                files = _apply_edit(files, call)
                out.append(self.potential(task, files, checks))
            else:
                out.append(out[-1])
        return out

    def _succeeded(self, task: TaskSpec, steps: list[Step]) -> bool:
        """The verdict of the episode ending with `steps`: the one given when it ended (kept per
        episode's calls), else the steps replayed and judged now."""
        with _CACHE_LOCK:
            known = _VERDICTS.get(self._episode_key(task, steps))
        if known is not None:
            return known
        report = self.verify(task, steps)
        if "env_fault" in report.checks:
            raise EnvFault(f"could not judge the submission for the progress potential: "
                           f"{report.checks['env_fault'].reasons}")
        return report.success

    def _episode_key(self, task: TaskSpec, steps: list[Step]) -> tuple[str, str, str]:
        """The calls that reached the world up to the first submit that did: the replay's input."""
        calls = []
        for step, call in zip(steps, calls_of(steps)):
            calls.append(None if call is None else [call.name, call.arguments])
            if call is not None and call.name == "submit" and step.error is None:
                break
        return self.version, task.task_id, content_hash(calls, 32)


def _apply_edit(files: dict[str, str], call: ToolCall) -> dict[str, str]:
    """`files` after an `edit_file` call the tool accepted, its path read as the tool reads it."""
    try:
        path = normalize_path(call.arguments.get("path", ""))
    except PathError:
        return files
    old = call.arguments.get("old", "")
    call = ToolCall(name=call.name, arguments={**call.arguments, "path": path})
    if old == "":
        return {**files, path: call.arguments.get("new", "")}
    return apply_edits(files, [call]) or files


def constraint_violations(task: TaskSpec, state: dict[str, Any]) -> list[str]:
    """What the agent did that it must not: change tests, reach for the network, write
    outside the workspace. Refused attempts count too."""
    out = []
    checks = facts(task)
    test_dir = checks.test_dir
    submission = state.get("submission")
    if submission is not None:
        original = checks.visible_tests
        now = {p: s for p, s in submission.items() if p.startswith(test_dir + "/")}
        changed = sorted(p for p in set(original) | set(now) if original.get(p) != now.get(p))
        if changed:
            out.append(f"changed test files: {named(changed)}")
    for event in state.get("events", []):
        if event.get("network_attempts"):
            out.append(f"call {event['seq']} ({event['tool']}) tried to reach the network "
                       f"({event['network_attempts']} packets refused)")
        if event["tool"] == "edit_file" and event.get("outcome") == PathKind.outside_workspace:
            out.append(f"call {event['seq']} tried to write outside the workspace: {event['args'].get('path')}")
    if submission is None:
        edited = sorted({e["path"] for e in state.get("events", []) if e.get("test_file") and e.get("outcome") == "ok"})
        if edited:
            out.append(f"changed test files: {named(edited)}")
    return out


def named(paths: list[str], limit: int = MAX_NAMED) -> str:
    """The first `limit` names and a count of the rest: an outcome record's size must not grow
    with the number of files an agent creates."""
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(paths[:limit]) + more


def _side_effects(task: TaskSpec, submission: dict[str, str]) -> list[str]:
    """At most MAX_NAMED entries per kind, then one line counting the rest."""
    original = set(task.initial_state["files"])
    test_dir = facts(task).test_dir + "/"
    out = []
    for verb, paths in (("added", set(submission) - original), ("removed", original - set(submission))):
        paths = sorted(p for p in paths if not p.startswith(test_dir))
        out += [f"{verb} {p}" for p in paths[:MAX_NAMED]]
        if len(paths) > MAX_NAMED:
            out.append(f"{verb} {len(paths) - MAX_NAMED} more files ({len(paths)} in all)")
    return out


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
