"""The coding grader's examiner: trusted, host side, never imports or runs submitted code.

The verdict on a submission is never computed where the submission runs. The examiner
rewrites each test module with `ast` so that it asks questions without holding the answers:

- every `assert` becomes observations of its operands: both sides of each comparison, the
  operand of `not`, each operand of `and`/`or`, or the asserted expression itself. Operands
  that are literals (anything `ast.literal_eval` accepts) are dropped, with the assert's message
  and the `not`, so the expected constants never reach the examinee's copy;
- an asserted call of an exception helper (a function of the module shaped like
  `def raises(exc, fn, *args): try: fn(*args) except exc: ...`) becomes an observation of the
  plain call `fn(*args)`: the examinee's copy never says which calls are expected to raise, or
  what (the observation records the value or the exception type, the reference says which);
- every other bare call in the body of a `try` is observed too, its exception recorded and
  re-raised, so a test records what the package did beneath a helper's True/False;
- everything else (imports, helpers, setup statements, loops) stays as it is.

envs/coding/observer.py runs the rewritten tests in a sandbox and prints the observations. The
same rewritten tests run once per task on the task's original files (trusted template code)
give the reference. A test passes iff its run ended normally and its observations equal the
reference exactly: value for value, in order, exact builtin types. This is stricter than the
asserts: `x < 5` needs the reference's `x`, not any `x` below 5; `1.0` is not `1`.

Limits: an expected value a test computes in a setup statement (`want = f(); assert g() == want`)
is an input and reaches the examinee; an observation whose expected value the test's shape gives
away (a bare predicate is usually True) is only as strong as that, which is why the operands
beneath predicates are observed."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

OBSERVER_SOURCE = Path(__file__).with_name("observer.py").read_text(encoding="utf-8")
RECORDER = "__gf__"
VALUE, EXC = "__gf_value__", "__gf_exc__"
# What the observer reports for a module that failed to import (observer.type_name of the exception):
# anything else in such a record (text the submission wrote, lone surrogates no record can store) is
# ignored rather than quoted in the outcome's reasons.
EXCEPTION_NAME = re.compile(r"[A-Za-z_][\w.<>]{0,199}", re.ASCII)


@dataclass(frozen=True)
class Observed:
    """How one test ended in one run ("ok" or an exception's type) and what it observed."""

    end: str
    obs: tuple[str, ...] = ()


def rewrite(source: str) -> tuple[str, list[str]]:
    """The examinee's copy of a test module, and the names of its top-level test functions."""
    tree = _Rewriter().visit(ast.parse(source))
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             and n.name.startswith("test_")]
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n", sorted(set(names))


class _Rewriter(ast.NodeTransformer):
    def visit_Module(self, node: ast.Module) -> ast.Module:
        self.helpers = {f.name for f in node.body if _exception_helper(f)}
        return self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> list[ast.stmt] | ast.stmt:
        return [_observe(self._unwrap(e), reraise=False) for e in _operands(node.test)] or ast.Pass()

    def _unwrap(self, expr: ast.expr) -> ast.expr:
        """`raises(ValueError, fn, *args)` -> `fn(*args)`: the expected exception stays with the grader."""
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in self.helpers \
                and len(expr.args) >= 2 and not any(isinstance(a, ast.Starred) for a in expr.args[:2]):
            return ast.Call(func=expr.args[1], args=expr.args[2:], keywords=expr.keywords)
        return expr

    def visit_Try(self, node: ast.Try) -> ast.Try:
        self.generic_visit(node)
        node.body = [_observe(s.value, reraise=True) if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
                     else s for s in node.body]
        return node


def _exception_helper(node: ast.stmt) -> bool:
    """A module-level `def h(exc, fn, ...)` with a `try` whose handler catches its first parameter."""
    if not isinstance(node, ast.FunctionDef) or len(node.args.args) < 2:
        return False
    first = node.args.args[0].arg
    return any(isinstance(h.type, ast.Name) and h.type.id == first
               for t in ast.walk(node) if isinstance(t, ast.Try) for h in t.handlers)


def _operands(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _operands(test.operand)
    if isinstance(test, ast.BoolOp):
        return [o for value in test.values for o in _operands(value)]
    if isinstance(test, ast.Compare):
        return [o for o in [test.left, *test.comparators] if not _literal(o)]
    return [] if _literal(test) else [test]


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _observe(expr: ast.expr, reraise: bool) -> ast.Try:
    """try: value = <expr> / except BaseException as e: record e [and re-raise] / else: record value"""
    handler = f"    {RECORDER}.raised({EXC})\n" + ("    raise\n" if reraise else "")
    stmt = ast.parse(f"try:\n    {VALUE} = None\nexcept BaseException as {EXC}:\n{handler}"
                     f"else:\n    {RECORDER}.value({VALUE})\n").body[0]
    stmt.body[0].value = expr
    return ast.copy_location(stmt, expr)


def parse_report(stdout: str, expected: set[str]) -> tuple[dict[str, Observed], dict[str, str]]:
    """Per test id of `expected`, what the observer reported, and the modules that failed to
    import. The text is untrusted: malformed lines, unknown ids and modules, and a module's end
    that is not an exception name are ignored; a test
    reported twice counts as not reported consistently (it fails)."""
    tests: dict[str, Observed] = {}
    modules: dict[str, str] = {}
    twice: set[str] = set()
    known = {test.split("::", 1)[0] for test in expected}
    for line in stdout.splitlines():
        record = _record(line)
        if record is None:
            continue
        if "module" in record:  # quoted in the outcome's reasons: a known module, an exception's name
            end = record.get("end")
            if isinstance(record["module"], str) and record["module"] in known and isinstance(end, str) \
                    and EXCEPTION_NAME.fullmatch(end):
                modules[record["module"]] = end
            continue
        test, obs, end = record.get("test"), record.get("obs"), record.get("end")
        if not isinstance(test, str) or test not in expected or not isinstance(end, str) or not isinstance(obs, list) \
                or not all(isinstance(o, str) for o in obs):
            continue
        if test in tests:
            twice.add(test)
        tests[test] = Observed(end, tuple(obs))
    for test in twice:
        tests[test] = Observed("reported more than once")
    return tests, modules


def _record(line: str) -> dict | None:
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def passes(reference: Observed | None, got: Observed | None) -> bool:
    return reference is not None and reference.end == "ok" and got == reference
