"""Observer of the coding grader. It runs inside the grading sandbox, in the same interpreter as
the submitted code, so it is untrusted from the moment that code is imported. Stdlib only.

    python -I observer.py WORKSPACE LABEL=DIR [LABEL=DIR ...]

It runs test modules that the grader rewrote (envs/coding/examiner.py): each `assert` became
records of the values the code computed, with the expected constants removed, so this process
never holds what the tests expect. It prints one JSON line per test to the stdout it started
with (the examinee's own prints go to stderr):

    {"test": "LABEL/test_x.py::test_y", "obs": ["<encoded value>", ...], "end": "ok" | "<exception type>"}

and for a module that cannot be imported {"module": "LABEL/test_x.py", "end": "<exception type>"}.
The grader treats all of it as data and compares it with the same run on the task's original
files; the submitted code can rewrite any of it, but cannot learn the values it would need."""

import hashlib
import importlib.util
import json
import os
import re
import sys

MAX_ENCODED = 200  # longer encodings are sent as their SHA-256 (both runs encode the same way)
MAX_DEPTH = 16
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
SCALARS = (type(None), bool, int, float, complex, str, bytes)


def type_name(kind):
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', '?')}"


def encode(value):
    text = _encode(value, 0)
    if len(text) > MAX_ENCODED:
        return "sha256:" + hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()
    return text


def _encode(value, depth):
    """Canonical text: exact builtin types only (a subclass, e.g. one whose __eq__ is always
    True, is encoded by its type name and repr), dicts and sets in sorted order."""
    kind = type(value)
    if depth > MAX_DEPTH:
        return "<too deep>"
    if kind in SCALARS:
        return repr(value)
    if kind is list or kind is tuple:
        items = [_encode(v, depth + 1) for v in value]
        return f"[{', '.join(items)}]" if kind is list else f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    if kind is dict:
        return "{" + ", ".join(sorted(f"{_encode(k, depth + 1)}: {_encode(v, depth + 1)}"
                                      for k, v in value.items())) + "}"
    if kind is set or kind is frozenset:
        return f"{kind.__name__}{{{', '.join(sorted(_encode(v, depth + 1) for v in value))}}}"
    try:
        shown = ADDRESS.sub("", repr(value))
    except BaseException as exc:  # a hostile __repr__ only spoils its own observation
        shown = f"<repr raised {type_name(type(exc))}>"
    return f"<{type_name(kind)}> {shown}"


class Recorder:
    """The `__gf__` global of every rewritten test module."""

    def __init__(self):
        self.obs = []

    def value(self, value):
        self.obs.append(encode(value))

    def raised(self, exc):
        self.obs.append("raised " + type_name(type(exc)))


def run_module(channel, label, directory, name):
    module_id = f"{label}/{name}"
    spec = importlib.util.spec_from_file_location(f"_gf_{label}_{name[:-3]}", os.path.join(directory, name))
    module = importlib.util.module_from_spec(spec)
    recorder = module.__gf__ = Recorder()
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        return emit(channel, {"module": module_id, "end": type_name(type(exc))})
    for attr in sorted(vars(module)):
        test = vars(module)[attr]
        if not (attr.startswith("test_") and callable(test)):
            continue
        recorder.obs = []
        try:
            test()
            end = "ok"
        except BaseException as exc:
            end = type_name(type(exc))
        emit(channel, {"test": f"{module_id}::{attr}", "obs": recorder.obs, "end": end})


def emit(channel, record):
    channel.write(json.dumps(record) + "\n")
    channel.flush()  # tests that finished stay reported if a later one kills the process


def main(argv):
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)  # a huge int is a value to compare, not an error
    workspace, targets = argv[0], argv[1:]
    sys.stdout.flush()
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # print() in the examinee's code cannot interleave with the records
    os.chdir(workspace)
    sys.path.insert(0, workspace)  # -I left the working directory off sys.path
    for target in targets:
        label, directory = target.split("=", 1)
        for name in sorted(os.listdir(directory)):
            if name.startswith("test_") and name.endswith(".py"):
                run_module(channel, label, directory, name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
