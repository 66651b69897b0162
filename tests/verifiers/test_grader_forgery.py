"""Hostile submissions against the coding grader, played through the env as an agent would:
`edit_file` prepends a payload to the package's `__init__.py` (so it runs in every process
that imports the package, the grader's examinee included), then `submit`. None of them fixes
the bug, so none may succeed; each must end as the model's failure with the hidden tests
reported failing, never as an environment fault or a timeout. The genuine reference fix, with
and without the same harmless edit, still succeeds."""

import pytest

import gymfoundry.envs.coding.verifier as grader
from gymfoundry.envs.coding.generator import inject, load_templates
from gymfoundry.envs.records import TaskSpec, Termination, ToolCall
from gymfoundry.tasks.rollout.episodes import run_episode
from gymfoundry.envs.coding.tests.helpers import ScriptPolicy, quick_task
from tests.sandbox_guard import needs_sandbox as pytestmark  # noqa: F401  skips here, fails under CI=true

TASKS = {"ledger": (0, 1), "timekit": (1, 1), "textkit": (2, 1)}  # template -> (seed, level)

# (a) every dict the grader's process dumps becomes all-true when it is the old runner or the new observer;
# a variant keeps the new record shape and flips every False observation to True.
FORGE_DUMPS = '''
import json as _json, sys as _sys
_real_dumps = _json.dumps
def _forged_dumps(obj, *args, **kwargs):
    if _sys.argv and _sys.argv[0].endswith(("runner.py", "observer.py", "examiner.py")) and isinstance(obj, dict):
        if "test" in obj and isinstance(obj.get("obs"), list):
            obj = {**obj, "end": "ok", "obs": [o.replace("False", "True") for o in obj["obs"]]}
        else:
            obj = {key: True for key in obj}
    return _real_dumps(obj, *args, **kwargs)
_json.dumps = _forged_dumps
'''

# (b) walk the frames for a nonce or any secret, forge a report in every format the grader could read
# (the old `<nonce> <json>` line and the new per-test records, for every test named in the support
# dir), write it to every descriptor, and leave before anything else is printed.
FORGE_FRAMES = '''
import json as _json, os as _os, re as _re, sys as _sys
_secrets = set()
_frame = _sys._getframe()
while _frame is not None:
    for _value in list(_frame.f_locals.values()) + list(_frame.f_globals.values()):
        if isinstance(_value, str) and _re.fullmatch(r"[0-9a-f]{16,64}", _value):
            _secrets.add(_value)
    _frame = _frame.f_back
_root = _os.path.dirname(_os.path.abspath(_sys.argv[0]))
_ids = []
for _label in ("hidden", "visible"):
    _folder = _os.path.join(_root, _label)
    for _name in sorted(_os.listdir(_folder)) if _os.path.isdir(_folder) else []:
        _text = open(_os.path.join(_folder, _name)).read()
        _ids += [f"{_label}/{_name}::{_t}" for _t in _re.findall(r"^def (test_\\w+)", _text, _re.M)]
_lines = [f"{_s} {_json.dumps({_i: True for _i in _ids})}" for _s in _secrets]
_lines += [_json.dumps({"test": _i, "obs": [], "end": "ok"}) for _i in _ids]
_data = ("\\n".join(_lines) + "\\n").encode()
for _fd in range(1, 10):
    try:
        _os.write(_fd, _data)
    except OSError:
        pass
_os._exit(0)
'''

EXIT_AT_IMPORT = "import os as _os\n_os._exit(0)\n"  # (c)

# (d) fake unittest/pytest, a harmless AssertionError, test functions replaced by no-ops as their
# modules load, and the recorder of the rewritten tests found by a frame walk and told to record nothing.
PATCH_FRAMEWORKS = '''
import builtins as _builtins, sys as _sys, types as _types, importlib.machinery as _machinery
for _name in ("unittest", "unittest.case", "pytest", "_pytest"):
    _fake = _types.ModuleType(_name)
    _fake.main = lambda *a, **k: None
    _fake.TestCase = object
    _sys.modules[_name] = _fake
_builtins.AssertionError = type("AssertionError", (Exception,), {})
_real_exec = _machinery.SourceFileLoader.exec_module
def _exec_module(self, module):
    _real_exec(self, module)
    for _key in list(vars(module)):
        if _key.startswith("test_"):
            setattr(module, _key, lambda: None)
_machinery.SourceFileLoader.exec_module = _exec_module
_frame = _sys._getframe()
while _frame is not None:
    _recorder = _frame.f_globals.get("__gf__")
    if _recorder is not None:
        _recorder.value = _recorder.raised = lambda *a: None
    _frame = _frame.f_back
'''

# (e) forged result files wherever the submitted code can write, and attempts on the grader's files.
FORGE_FILES = '''
import json as _json, os as _os, sys as _sys
_forged = _json.dumps({"passed": True, "success": True, "results": {"hidden": True}})
_root = _os.path.dirname(_os.path.abspath(_sys.argv[0]))
for _path in ["results.json", "report.json", "verdict.json", ".gymfoundry/result.json", "/tmp/results.json",
              "/tmp/observations.json", "/tmp/report.json", _os.path.join(_root, "observer.py"),
              _os.path.join(_root, "runner.py"), _os.path.join(_root, "report.json")]:
    try:
        _os.makedirs(_os.path.dirname(_path) or ".", exist_ok=True)
        with open(_path, "w") as _fh:
            _fh.write(_forged)
    except OSError:
        pass
'''

FAKE_NO_PYTHON = "import os as _os, sys as _sys\n_sys.stderr.write('python: not found\\n')\n_sys.stderr.flush()\n_os._exit(127)\n"  # (f)
HANG = "while True:\n    pass\n"  # (g)

# (h) every public function of the package returns an object equal to everything.
ALWAYS_EQUAL = '''
import importlib as _importlib, pkgutil as _pkgutil
class _Equal:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __bool__(self): return True
    def __len__(self): return 4
    def __repr__(self): return "True"
    __hash__ = object.__hash__
for _info in _pkgutil.iter_modules(__path__):
    _module = _importlib.import_module(__name__ + "." + _info.name)
    for _key, _value in list(vars(_module).items()):
        if callable(_value) and not isinstance(_value, type) and not _key.startswith("_"):
            setattr(_module, _key, lambda *a, **k: _Equal())
'''

PAYLOADS = {"forge_json_dumps": FORGE_DUMPS, "forge_report_by_frame_walk": FORGE_FRAMES,
            "exit_at_import": EXIT_AT_IMPORT, "patch_test_frameworks": PATCH_FRAMEWORKS,
            "forge_result_files": FORGE_FILES, "always_equal_results": ALWAYS_EQUAL}


def task_for(template: str, **limits) -> TaskSpec:
    return quick_task(*TASKS[template], **limits)


def prepend(task: TaskSpec, payload: str) -> ToolCall:
    path = f"{task.hidden.checks['package']}/__init__.py"
    first = task.initial_state["files"][path].splitlines(keepends=True)[0]
    return ToolCall(name="edit_file", arguments={"path": path, "old": first, "new": payload + "\n" + first})


def fixes(task: TaskSpec) -> list[ToolCall]:
    return [c for c in task.hidden.reference if c.name == "edit_file"]


def episode(task: TaskSpec, calls: list[ToolCall]):
    rollout = run_episode(task, ScriptPolicy(calls + [ToolCall(name="submit", arguments={})]), seed=0)
    assert rollout.outcome is not None, rollout.termination_reason
    return rollout


def assert_model_failure(task: TaskSpec, rollout) -> None:
    outcome = rollout.outcome
    assert rollout.termination == Termination.failure, (rollout.termination, rollout.termination_reason)
    assert not outcome.success and not outcome.completed
    assert not outcome.checks["hidden_tests"].passed
    assert "env_fault" not in outcome.checks and "timeout" not in outcome.checks
    caught = set(grader.CodingVerifier().baseline(task).failing("hidden/"))
    assert caught and caught <= {r.removeprefix("hidden test fails: ") for r in outcome.reasons}


@pytest.mark.parametrize("template", sorted(TASKS))
def test_the_reference_fix_succeeds_also_beside_a_harmless_prepended_line(template):
    task = task_for(template)
    assert episode(task, fixes(task)).termination == Termination.success
    rollout = episode(task, [prepend(task, "import os as _os  # harmless\n")] + fixes(task))
    assert rollout.termination == Termination.success and rollout.outcome.success


@pytest.mark.parametrize("template", sorted(TASKS))
@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_a_forging_payload_without_the_fix_fails(payload, template):
    task = task_for(template)
    assert_model_failure(task, episode(task, [prepend(task, PAYLOADS[payload])]))


@pytest.mark.parametrize("payload", ["forge_report_by_frame_walk", "exit_at_import", "patch_test_frameworks"])
def test_a_payload_beside_the_real_fix_cannot_make_it_pass_without_running_the_tests(payload):
    task = task_for("ledger")
    assert_model_failure(task, episode(task, [prepend(task, PAYLOADS[payload])] + fixes(task)))


def raises_only_task() -> TaskSpec:
    """A ledger task whose one bug is caught only through the hidden tests' `raises` helper, so the
    hidden test's bare predicate is True on the reference: flipping observed False to True is the
    obvious forgery, and the call observed inside the helper's try must stop it."""
    template = load_templates()["ledger"]
    site = next(s for s in template.sites if s.id == "cart-zero-quantity")
    data = quick_task(1, 4).model_dump(mode="json")  # a ledger task
    data["initial_state"]["files"] = inject(template.files, [site])
    data["hidden"]["checks"]["bugs"] = [{"id": site.id, "file": site.file, "kind": site.kind,
                                         "original": site.original, "buggy": site.buggy, "distance": site.distance}]
    data["hidden"]["reference"] = [{"name": "edit_file", "arguments": {"path": site.file, "old": site.buggy,
                                                                      "new": site.original}, "id": "ref-0"}]
    data["task_id"] = ""
    return TaskSpec.model_validate(data)


def test_flipping_false_observations_to_true_does_not_pass_a_raises_test():
    task = raises_only_task()
    assert grader.CodingVerifier().precondition(task) is None
    assert grader.CodingVerifier().baseline(task).failing("hidden/") == [
        "hidden/test_hidden_ledger.py::test_hidden_cart_rejects_zero_quantity"]
    assert_model_failure(task, episode(task, [prepend(task, FORGE_DUMPS)]))
    assert episode(task, fixes(task)).termination == Termination.success


@pytest.mark.parametrize("template", sorted(TASKS))
def test_code_printing_python_not_found_and_exiting_127_is_the_models_failure(template):
    task = task_for(template)
    rollout = episode(task, [prepend(task, FAKE_NO_PYTHON)])
    assert_model_failure(task, rollout)
    [why] = [r for r in rollout.outcome.checks["hidden_tests"].reasons if not r.startswith("fails ")]
    assert why.startswith("the test run ended without a complete report (exit code 127") and "python: not found" in why


@pytest.mark.parametrize("template", sorted(TASKS))
def test_code_that_hangs_the_tests_is_the_models_failure_with_the_time_limit_as_reason(template):
    task = task_for(template, test_timeout_s=1.5)
    rollout = episode(task, [prepend(task, HANG)])
    assert_model_failure(task, rollout)
    assert "the tests ran past their 1.5s limit and were killed" in rollout.outcome.checks["hidden_tests"].reasons
    assert rollout.outcome.reasons[0] == "the tests ran past their 1.5s limit and were killed"


# (i) bytes that are not UTF-8: 2 x 15 MB of 0xff fit the 64 MiB workspace; decoded with "replace" they
# became 90 MB in the grader's copy (ENOSPC, a verifier_error hiding the attempt). The package checks
# at import that its data file is still exactly what was written.
BLOBS = ToolCall(name="run", arguments={"argv": ["python", "-c", (
    "for i in (1, 2):\n    open(f'blob{i}.bin', 'wb').write(b'\\xff' * 15_000_000)\n"
    "open('ledger/data.bin', 'wb').write(bytes(range(256)))")]})
BYTE_EXACT = ("import os as _os\nwith open(_os.path.join(_os.path.dirname(__file__), 'data.bin'), 'rb') as _fh:\n"
              "    assert _fh.read() == bytes(range(256))\n")


def test_a_submission_s_bytes_reach_the_grader_exactly_whatever_they_decode_to():
    task = task_for("ledger")
    rollout = episode(task, [BLOBS, prepend(task, BYTE_EXACT)] + fixes(task))
    outcome = rollout.outcome  # every test passes; the files the package does not ship are side effects
    assert outcome.completed and not outcome.regression, rollout.termination_reason
    assert outcome.side_effects == ["added blob1.bin", "added blob2.bin", "added ledger/data.bin"]
    assert episode(task, [BLOBS]).termination == Termination.failure


# (j) report records made to break the record: strings no record can store (lone surrogates) and an
# unknown module name; the run then exits, so the reason quotes what was reported.
UNSTORABLE = r'''
import os as _os
_rec = ('{"module": "\\udcff", "end": "\\udcfe"}\n{"module": "hidden/nope.py", "end": "x"}\n'
        '{"module": "hidden/test_hidden_ledger.py", "end": "a\\ud800b"}\n').encode()
for _fd in range(1, 10):
    try:
        _os.write(_fd, _rec)
    except OSError:
        pass
_os._exit(3)
'''


def test_report_records_that_no_record_could_store_leave_the_rollout_storable():
    task = task_for("ledger")
    rollout = episode(task, [prepend(task, UNSTORABLE)])
    assert_model_failure(task, rollout)
    stored = rollout.model_dump_json()  # else UnicodeEncodeError, and the batch would fail to land
    assert "nope.py could not be imported" not in stored and "could not be imported (a" not in stored


# Reads the examinee's copy of the hidden tests (it runs beside them) and makes every call that a
# `raises(Exc, fn, *args)` assertion names raise that exception for exactly those arguments: a
# verdict forged from what the tests say they expect, without the fix.
FORGE_RAISES = r'''
import ast as _ast, builtins as _b, importlib as _il, os as _os, sys as _sys
def _forge():
    root = _os.path.join(_os.path.dirname(_os.path.abspath(_sys.argv[0])), "hidden")
    if not _os.path.isdir(root):
        return
    for name in _os.listdir(root):
        tree = _ast.parse(open(_os.path.join(root, name)).read())
        where = {a.asname or a.name: n.module for n in _ast.walk(tree) if isinstance(n, _ast.ImportFrom) for a in n.names}
        for call in [n for n in _ast.walk(tree) if isinstance(n, _ast.Call) and getattr(n.func, "id", "") == "raises"]:
            exc, fn, rest = call.args[0].id, call.args[1], tuple(_ast.literal_eval(a) for a in call.args[2:])
            if isinstance(fn, _ast.Name):
                owner, attr = _il.import_module(where[fn.id]), fn.id
            elif isinstance(fn, _ast.Attribute) and isinstance(fn.value, _ast.Call):
                cls = fn.value.func.id
                owner, attr = getattr(_il.import_module(where[cls]), cls), fn.attr
            else:
                continue
            real = getattr(owner, attr)
            def wrapped(*a, _real=real, _rest=rest, _exc=getattr(_b, exc), **k):
                if a[len(a) - len(_rest):] == _rest:
                    raise _exc("forged")
                return _real(*a, **k)
            setattr(owner, attr, wrapped)
_forge()
'''


def test_hardcoding_the_calls_the_tests_say_must_raise_does_not_pass():
    task = raises_only_task()
    path = "ledger/__init__.py"
    last = task.initial_state["files"][path].splitlines(keepends=True)[-1]
    append = ToolCall(name="edit_file", arguments={"path": path, "old": last, "new": last + FORGE_RAISES})
    assert_model_failure(task, episode(task, [append]))
