"""Test runner of the coding family's `run_tests` tool. It runs inside the sandbox and needs only the stdlib.

    python runner.py DIR_OR_FILE [...]

Imports every test_*.py in each DIR (sorted), or the given test file, with the working directory on sys.path, calls
each top-level function named test_*, and prints one line per test plus a summary. A
failing plain `assert a == b` also shows both sides. It is for the agent to read; grading never
depends on it (envs/coding/verifier.py compares observations, see envs/coding/examiner.py)."""

import ast
import importlib.util
import linecache
import os
import sys
import traceback


def describe_failure(exc, tb):
    frames = [f for f in traceback.extract_tb(tb) if not f.filename.endswith("runner.py")]
    lines = [f'  File "{_short(f.filename)}", line {f.lineno}, in {f.name}: {(f.line or "").strip()}'
             for f in frames[-4:]]
    message = f"{type(exc).__name__}: {exc}".rstrip(": ")
    if isinstance(exc, AssertionError) and not str(exc) and frames:
        sides = _assert_sides(tb, frames[-1])
        if sides:
            message = f"AssertionError: {sides}"
    return lines + [f"  {message}"]


def _assert_sides(tb, frame_summary):
    """Re-evaluate both sides of a failing `assert left <op> right` in the test's frame."""
    while tb.tb_next is not None:
        tb = tb.tb_next
    source = linecache.getline(frame_summary.filename, frame_summary.lineno).strip()
    try:
        node = ast.parse(source).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(node, ast.Assert) or not isinstance(node.test, ast.Compare) or len(node.test.ops) != 1:
        return None
    scope = tb.tb_frame
    try:
        left = eval(compile(ast.Expression(node.test.left), "<assert>", "eval"), scope.f_globals, scope.f_locals)
        right = eval(compile(ast.Expression(node.test.comparators[0]), "<assert>", "eval"),
                     scope.f_globals, scope.f_locals)
    except Exception:
        return None
    return f"got {left!r}, expected {right!r}"


def _short(path):
    cwd = os.getcwd() + os.sep
    return path[len(cwd):] if path.startswith(cwd) else path


def run(directories):
    results = {}
    for number, target in enumerate(directories):
        if os.path.isfile(target):
            directory, names = os.path.dirname(target) or ".", [os.path.basename(target)]
        else:
            directory = target
            names = sorted(n for n in os.listdir(directory) if n.startswith("test_") and n.endswith(".py"))
        label = os.path.basename(os.path.normpath(os.path.abspath(directory)))
        for name in names:
            test_file = f"{label}/{name}"
            spec = importlib.util.spec_from_file_location(f"_gf_tests_{number}_{name[:-3]}",
                                                          os.path.join(directory, name))
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except BaseException as exc:  # an import error fails every test of the file
                if isinstance(exc, KeyboardInterrupt):
                    raise
                results[f"{test_file}::<import>"] = False
                print(f"ERROR {test_file} (import failed)")
                print("\n".join(describe_failure(exc, exc.__traceback__)))
                continue
            for attr in sorted(vars(module)):
                test = getattr(module, attr)
                if not (attr.startswith("test_") and callable(test)):
                    continue
                test_id = f"{test_file}::{attr}"
                try:
                    test()
                except Exception as exc:
                    results[test_id] = False
                    print(f"FAIL {test_id}")
                    print("\n".join(describe_failure(exc, exc.__traceback__)))
                else:
                    results[test_id] = True
                    print(f"PASS {test_id}")
    passed = sum(results.values())
    print(f"{passed} passed, {len(results) - passed} failed")
    return results


def main(argv):
    sys.path.insert(0, os.getcwd())
    sys.stdout.reconfigure(line_buffering=True)
    results = run(argv)
    return 0 if results and all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
