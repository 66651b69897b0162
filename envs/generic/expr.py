"""The expression language of YAML domains: data, never code. Nothing here calls eval or exec,
imports a name, or reads an attribute of a Python object: a path walks dict keys and list
indices only, and every operator is one entry of `OPS` (or `DRAWS`, generation only).

An expression is a YAML value:

- a number, a boolean, null, or a string: itself;
- a string starting with `$`: a path, `$root(.key | .$name | [index])*`, where root is a name in
  scope (a tool argument, a task parameter, `state`, `initial`, `result`, `item`, `key`, `index`),
  `.key` a dict key, `.$name` the key that the value of `$name` is (`$state.rooms.$room.floor`;
  YAML-friendly inside `[...]`), and `[index]` a list index, a 'quoted key' or another path
  (`"$state.rooms[$room]"`, quoted in YAML);
- a string holding `{$path}` placeholders: a template, rendered to text (`"room {$room} is taken"`);
- a list: its elements, evaluated;
- a mapping of one key that names an operator: that operator (`{eq: [$a, 1]}`); any other mapping
  is a literal mapping whose values are evaluated (`{room: $room}`), and `{lit: ...}` quotes a value.

Operators: eq ne lt le gt ge, and or not, in, add sub mul, len keys first sorted range get, if,
filter map count any all (each `{in: collection, where: predicate, to: value}`, with `$item` and
`$key` bound per element), lit. Draws (task generation only, from the family's seeded RNG): int
`[lo, hi]`, choice `list`, sample `[list, k]`, shuffle `list`, table `{keys, let, row}`.

`check(...)` finds what is outside the grammar when a domain loads (`ExprProblem`s naming the place
in the file); `evaluate(...)` raises `EvalError` for what only shows at run time (a missing key, a
comparison of a number with text): in a tool that is the domain's bug, never the agent's."""

from __future__ import annotations

import copy
import json
import math
import random
import re
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import Any

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PLACEHOLDER = re.compile(r"\{(\$[^{}]*)\}")
MAX_DEPTH = 60
# Evaluation steps one task's generation, one tool call or one top-level expression may take: each
# element iterated (by a loop, `and`, `or`, a table), each value a list, mapping, map or table builds
# (counted as its values, shared ones once per use) and each value compared or rendered. Loops
# nested in a domain file, or a value doubled again and again, end in an EvalError, never a hang.
MAX_STEPS = 1_000_000  # the shipped domains take about 1,000 to make a task
Scope = dict[str, Any]
_BUDGET = threading.local()


class EvalError(Exception):
    """An expression that cannot be evaluated on these values (a domain bug where it happens)."""


class ExprProblem(ValueError):
    """An expression outside the grammar, found when the domain loads."""


# -- paths --------------------------------------------------------------------------------------
@lru_cache(maxsize=4096)
def parse_path(text: str) -> tuple[str, tuple]:
    """`$a.b[0][$c]['d e']` -> ("a", (("key", "b"), ("key", 0), ("path", <parsed $c>), ("key", "d e")))."""
    root, rest = _name(text, 1)
    segments, pos = [], rest
    while pos < len(text):
        if text[pos] == "." and text[pos + 1:pos + 2] == "$":  # `.$name`: the key is that value
            key, pos = _name(text, pos + 2)
            segments.append(("path", (key, ())))
            continue
        if text[pos] == ".":
            key, pos = _name(text, pos + 1)
            segments.append(("key", key))
            continue
        if text[pos] != "[":
            raise ExprProblem(f"bad path {text!r}: unexpected {text[pos]!r} at {pos}")
        end = _closing(text, pos)
        inner = text[pos + 1:end].strip()
        if re.fullmatch(r"\d+", inner):
            segments.append(("key", int(inner)))
        elif len(inner) >= 2 and inner[0] == inner[-1] == "'":
            segments.append(("key", inner[1:-1]))
        elif inner.startswith("$"):
            segments.append(("path", parse_path(inner)))
        else:
            raise ExprProblem(f"bad path {text!r}: index [{inner}] is not a number, a 'quoted key' or a $path")
        pos = end + 1
    for kind, value in segments:
        if kind == "key" and isinstance(value, str) and value.startswith("__"):
            raise ExprProblem(f"bad path {text!r}: {value!r} is not allowed (paths read data, not objects)")
    return root, tuple(segments)


def _name(text: str, pos: int) -> tuple[str, int]:
    match = NAME.match(text, pos)
    if match is None:
        raise ExprProblem(f"bad path {text!r}: a name must follow at {pos}")
    return match.group(), match.end()


def _closing(text: str, pos: int) -> int:
    depth = 0
    for i in range(pos, len(text)):
        depth += {"[": 1, "]": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ExprProblem(f"bad path {text!r}: '[' at {pos} is never closed")


def path_roots(parsed: tuple[str, tuple]) -> list[str]:
    root, segments = parsed
    out = [root]
    for kind, value in segments:
        if kind == "path":
            out += path_roots(value)
    return out


def lookup(parsed: tuple[str, tuple], scope: Scope) -> Any:
    root, segments = parsed
    if root not in scope:
        raise EvalError(f"${root} is not defined here")
    value = scope[root]
    for kind, key in segments:
        if kind == "path":
            key = lookup(key, scope)
        value = _step(value, key)
    return value


def _step(value: Any, key: Any) -> Any:
    if isinstance(value, dict):
        if isinstance(key, (str, int)) and not isinstance(key, bool) and str(key) in value:
            return value[str(key)]
        raise EvalError(f"no key {key!r} (keys: {', '.join(map(str, list(value)[:8]))})")
    if isinstance(value, list):
        if isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(value):
            return value[key]
        raise EvalError(f"no index {key!r} in a list of {len(value)}")
    raise EvalError(f"cannot index {type(value).__name__} {value!r} by {key!r}")


# -- the budget of steps ------------------------------------------------------------------------
class budget:  # noqa: N801 (used as `with budget():`)
    """One budget of MAX_STEPS for every evaluation inside (reentrant: an inner `budget` shares the
    outer one). A top-level `evaluate`, `truth` or `render` outside any opens its own."""

    __slots__ = ("opened",)

    def __enter__(self) -> None:
        self.opened = getattr(_BUDGET, "open", 0)
        if not self.opened:
            _BUDGET.left = MAX_STEPS
        _BUDGET.open = self.opened + 1

    def __exit__(self, *exc: Any) -> None:
        _BUDGET.open = self.opened


def _charge(steps: int) -> None:
    _BUDGET.left -= steps
    if _BUDGET.left < 0:
        raise EvalError(f"the expression takes more than {MAX_STEPS:,} steps (a loop, or a value, too large)")


def charge_size(value: Any) -> None:
    """Charge a value's size: its values counted through every list and mapping, a shared one once
    per place it appears (what a copy, a comparison or JSON text of it costs). Stops at the budget."""
    kind = type(value)
    if kind is not list and kind is not dict:
        _charge(1)
        return
    left, count, stack = _BUDGET.left, 0, [value]
    while stack and count <= left:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            item = item.values()
        elif kind is not list:
            count += 1
            continue
        count += 1 + len(item)
        for v in item:
            if type(v) is list or type(v) is dict:
                stack.append(v)
    _charge(count)


# -- evaluation ---------------------------------------------------------------------------------
def evaluate(expr: Any, scope: Scope, rng: random.Random | None = None, depth: int = 0) -> Any:
    """The value of `expr` in `scope`; draws need `rng` (task generation)."""
    if depth or getattr(_BUDGET, "open", 0):
        return _evaluate(expr, scope, rng, depth)
    _BUDGET.left, _BUDGET.open = MAX_STEPS, 1
    try:
        return _evaluate(expr, scope, rng, 0)
    finally:
        _BUDGET.open = 0


def _evaluate(expr: Any, scope: Scope, rng: random.Random | None, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise EvalError("expression nested too deeply")
    if isinstance(expr, str):
        if expr.startswith("$"):
            try:
                return lookup(parse_path(expr), scope)
            except EvalError as exc:
                raise EvalError(f"{expr}: {exc}") from None
        if "{$" in expr:
            return render(expr, scope)
        return expr
    if isinstance(expr, list):
        out = [evaluate(e, scope, rng, depth + 1) for e in expr]
        charge_size(out)
        return out
    if isinstance(expr, dict):
        if len(expr) == 1:
            (op, arg), = expr.items()
            if op in OPS:
                return OPS[op](arg, scope, rng, depth + 1)
            if op in DRAWS:
                if rng is None:
                    raise EvalError(f"draw {op!r} outside task generation")
                return DRAWS[op](arg, scope, rng, depth + 1)
        out = {k: evaluate(v, scope, rng, depth + 1) for k, v in expr.items()}
        charge_size(out)
        return out
    return expr


def truth(expr: Any, scope: Scope, rng: random.Random | None = None, depth: int = 0) -> bool:
    value = evaluate(expr, scope, rng, depth)
    if not isinstance(value, bool):
        raise EvalError(f"a predicate gave {type(value).__name__} {value!r}, not true or false")
    return value


def render(template: str, scope: Scope) -> str:
    if not getattr(_BUDGET, "open", 0):
        with budget():
            return render(template, scope)
    return PLACEHOLDER.sub(lambda m: text_of(lookup(parse_path(m.group(1)), scope)), template)


def text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return str(value)
    if getattr(_BUDGET, "open", 0):  # JSON text costs the value's whole size
        charge_size(value)
    return json.dumps(value, sort_keys=True)


def _pair(arg: Any, scope: Scope, rng, depth: int) -> tuple[Any, Any]:
    a, b = arg
    return evaluate(a, scope, rng, depth), evaluate(b, scope, rng, depth)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _ordered(fn: Callable[[Any, Any], bool]) -> Callable:
    def op(arg, scope, rng, depth):
        a, b = _pair(arg, scope, rng, depth)
        if not ((_number(a) and _number(b)) or (isinstance(a, str) and isinstance(b, str))):
            raise EvalError(f"cannot order {a!r} and {b!r}: both must be numbers or both text")
        return fn(a, b)
    return op


INT_LIMIT = 2 ** 63  # what an action may hold (envs.parsing); a state value stays storable as the agent's


def bounded(value: Any, what: str) -> Any:
    """`value` if it is a finite number within 64 bits, else EvalError: a domain's arithmetic never
    stores Infinity, NaN (not JSON) or an integer no record could hold."""
    if isinstance(value, float) and not math.isfinite(value):
        raise EvalError(f"{what}: the result {value!r} is not a finite number")
    if isinstance(value, int) and not isinstance(value, bool) and not -INT_LIMIT <= value < INT_LIMIT:
        raise EvalError(f"{what}: the result is an integer past 64 bits")
    return value


def _arith(fn: Callable[[Any, Any], Any]) -> Callable:
    def op(arg, scope, rng, depth):
        a, b = _pair(arg, scope, rng, depth)
        if not (_number(a) and _number(b)):
            raise EvalError(f"arithmetic needs numbers, not {a!r} and {b!r}")
        return bounded(fn(a, b), "arithmetic")
    return op


def _in(arg, scope, rng, depth):
    x, coll = _pair(arg, scope, rng, depth)
    if isinstance(coll, list):
        _charge(len(coll))
        charge_size(x)
    if isinstance(coll, dict):
        return isinstance(x, str) and x in coll
    if isinstance(coll, list):
        return x in coll
    if isinstance(coll, str):
        return isinstance(x, str) and x in coll
    raise EvalError(f"'in' needs a mapping, list or text, not {coll!r}")


def _and(arg, scope, rng, depth):
    _charge(len(arg))
    return all(truth(e, scope, rng, depth) for e in arg)


def _or(arg, scope, rng, depth):
    _charge(len(arg))
    return any(truth(e, scope, rng, depth) for e in arg)


def _len(arg, scope, rng, depth):
    value = evaluate(arg, scope, rng, depth)
    if not isinstance(value, (list, dict, str)):
        raise EvalError(f"len of {value!r}")
    return len(value)


def _keys(arg, scope, rng, depth):
    value = evaluate(arg, scope, rng, depth)
    if not isinstance(value, dict):
        raise EvalError(f"keys of {value!r}, not a mapping")
    _charge(len(value))
    return list(value)


def _first(arg, scope, rng, depth):
    value = evaluate(arg, scope, rng, depth)
    if not isinstance(value, list):
        raise EvalError(f"first of {value!r}, not a list")
    return value[0] if value else None


def _sorted(arg, scope, rng, depth):
    value = evaluate(arg, scope, rng, depth)
    if not isinstance(value, list):
        raise EvalError(f"sorted of {value!r}, not a list")
    charge_size(value)
    try:
        return sorted(value, key=lambda v: (not _number(v), v if _number(v) else text_of(v)))
    except TypeError as exc:
        raise EvalError(f"cannot sort {value!r}: {exc}") from None


def _range(arg, scope, rng, depth):
    lo, hi = _pair(arg, scope, rng, depth)
    if not (isinstance(lo, int) and isinstance(hi, int)) or isinstance(lo, bool) or isinstance(hi, bool) \
            or hi - lo > 10_000:
        raise EvalError(f"range needs two integers at most 10000 apart, not {lo!r}, {hi!r}")
    _charge(max(0, hi - lo))
    return list(range(lo, hi))


def _get(arg, scope, rng, depth):
    coll, key, default = (evaluate(a, scope, rng, depth) for a in arg)
    try:
        return _step(coll, key)
    except EvalError:
        return default


def _if(arg, scope, rng, depth):
    cond, then, other = arg
    return evaluate(then if truth(cond, scope, rng, depth) else other, scope, rng, depth)


def _not(arg, scope, rng, depth):
    return not truth(arg, scope, rng, depth)


def _elements(arg: dict, scope: Scope, rng, depth) -> list[tuple[Any, Any, Scope]]:
    """(key, item, inner scope) of each element of `in` that satisfies `where`."""
    coll = evaluate(arg["in"], scope, rng, depth)
    if isinstance(coll, dict):
        pairs = list(coll.items())
    elif isinstance(coll, list):
        pairs = list(enumerate(coll))
    else:
        raise EvalError(f"cannot iterate over {coll!r}")
    _charge(len(pairs))
    out = []
    for key, item in pairs:
        inner = {**scope, "item": item, "key": key}
        if "where" not in arg or truth(arg["where"], inner, rng, depth):
            out.append((key, item, inner))
    return out


def _filter(arg, scope, rng, depth):
    coll = evaluate(arg["in"], scope, rng, depth)
    picked = _elements(arg, scope, rng, depth)
    return [k for k, _, _ in picked] if isinstance(coll, dict) else [item for _, item, _ in picked]


def _map(arg, scope, rng, depth):
    out = [evaluate(arg["to"], inner, rng, depth) for _, _, inner in _elements(arg, scope, rng, depth)]
    charge_size(out)
    return out


def _count(arg, scope, rng, depth):
    return len(_elements(arg, scope, rng, depth))


def _any(arg, scope, rng, depth):
    return bool(_elements(arg, scope, rng, depth))


def _all(arg, scope, rng, depth):
    everything = _elements({"in": arg["in"]}, scope, rng, depth)
    return len(_elements(arg, scope, rng, depth)) == len(everything)


OPS: dict[str, Callable] = {
    "eq": lambda a, s, r, d: _same(*_pair(a, s, r, d)), "ne": lambda a, s, r, d: not _same(*_pair(a, s, r, d)),
    "lt": _ordered(lambda a, b: a < b), "le": _ordered(lambda a, b: a <= b),
    "gt": _ordered(lambda a, b: a > b), "ge": _ordered(lambda a, b: a >= b),
    "and": _and, "or": _or, "not": _not, "in": _in,
    "add": _arith(lambda a, b: a + b), "sub": _arith(lambda a, b: a - b), "mul": _arith(lambda a, b: a * b),
    "len": _len, "keys": _keys, "first": _first, "sorted": _sorted, "range": _range, "get": _get, "if": _if,
    "filter": _filter, "map": _map, "count": _count, "any": _any, "all": _all,
    "lit": lambda a, s, r, d: _lit(a),
}


def _lit(value: Any) -> Any:
    charge_size(value)
    return copy.deepcopy(value)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1, 1 is 1.0."""
    if (type(a) is list or type(a) is dict) and getattr(_BUDGET, "open", 0):  # a comparison walks the values
        charge_size(a)
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


# -- draws (task generation only) ---------------------------------------------------------------
def _draw_int(arg, scope, rng, depth):
    lo, hi = _pair(arg, scope, rng, depth)
    if not (isinstance(lo, int) and isinstance(hi, int)) or isinstance(lo, bool) or lo > hi:
        raise EvalError(f"int needs [lo, hi] integers with lo <= hi, not {lo!r}, {hi!r}")
    return rng.randint(bounded(lo, "int"), bounded(hi, "int"))


def _pool(arg, scope, rng, depth) -> list:
    pool = evaluate(arg, scope, rng, depth)
    if not isinstance(pool, list) or not pool:
        raise EvalError(f"a draw needs a non-empty list, not {pool!r}")
    return pool


def _choice(arg, scope, rng, depth):
    return copy.deepcopy(rng.choice(_pool(arg, scope, rng, depth)))


def _sample(arg, scope, rng, depth):
    pool, k = _pool(arg[0], scope, rng, depth), evaluate(arg[1], scope, rng, depth)
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= len(pool):
        raise EvalError(f"sample of {k!r} from {len(pool)} values")
    return copy.deepcopy(rng.sample(pool, k))


def _shuffle(arg, scope, rng, depth):
    pool = list(_pool(arg, scope, rng, depth))
    rng.shuffle(pool)
    return pool


def _table(arg, scope, rng, depth):
    keys = evaluate(arg["keys"], scope, rng, depth)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
        raise EvalError(f"table keys must be distinct strings, not {keys!r}")
    out = {}
    for index, key in enumerate(keys):
        inner = {**scope, "key": key, "index": index}
        _charge(1 + len(arg.get("let") or {}))
        for name, expr in (arg.get("let") or {}).items():
            inner[name] = evaluate(expr, inner, rng, depth)
        out[key] = evaluate(arg["row"], inner, rng, depth)
        charge_size(out[key])
    return out


DRAWS: dict[str, Callable] = {"int": _draw_int, "choice": _choice, "sample": _sample, "shuffle": _shuffle,
                              "table": _table}

# -- the grammar, checked when a domain loads ---------------------------------------------------
PAIR_OPS = {"eq", "ne", "lt", "le", "gt", "ge", "in", "add", "sub", "mul", "range", "int", "sample"}
LIST_PREDICATES = {"and", "or"}
ONE_OPS = {"len", "keys", "first", "sorted", "choice", "shuffle"}
LOOP_OPS = {"filter", "map", "count", "any", "all"}
PREDICATE_OPS = {"eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "in", "any", "all", "if", "lit", "get",
                 "first"}


def check(expr: Any, where: str, names: set[str], *, draws: bool = False, predicate: bool = False,
          depth: int = 0) -> list[str]:
    """Problems of `expr` at `where` (a place in the file): unknown operators, malformed operands,
    bad paths, names not in scope, draws outside generation."""
    if depth > MAX_DEPTH:
        return [f"{where}: nested more than {MAX_DEPTH} levels"]
    if isinstance(expr, str):
        if predicate and not expr.startswith("$"):
            return [f"{where}: a predicate must be an operator or a $path, not the text {expr!r}"]
        paths = [expr] if expr.startswith("$") else PLACEHOLDER.findall(expr)
        if not expr.startswith("$") and "{$" in expr and len(paths) != expr.count("{$"):
            return [f"{where}: template {expr!r} has a malformed {{$...}} placeholder"]
        return [p for path in paths for p in _check_path(path, where, names)]
    if isinstance(expr, list):
        if predicate:
            return [f"{where}: a predicate must be an operator or a $path, not a list"]
        return [p for i, e in enumerate(expr) for p in check(e, f"{where}[{i}]", names, draws=draws, depth=depth + 1)]
    if isinstance(expr, dict):
        if len(expr) == 1 and next(iter(expr)) in OPS.keys() | DRAWS.keys():
            (op, arg), = expr.items()
            return _check_op(op, arg, f"{where}.{op}", names, draws, predicate, depth)
        if predicate:
            ops = ", ".join(sorted(k for k in expr))
            return [f"{where}: unknown op {ops!r} (operators: {', '.join(sorted(OPS))})"]
        bad = [k for k in expr if not isinstance(k, str)]
        if bad:
            return [f"{where}: mapping keys must be text, not {bad[0]!r}"]
        return [p for k, v in expr.items() for p in check(v, f"{where}.{k}", names, draws=draws, depth=depth + 1)]
    if predicate and not isinstance(expr, bool):
        return [f"{where}: a predicate must be an operator, a $path or true/false, not {expr!r}"]
    if expr is not None and not isinstance(expr, (bool, int, float)):
        return [f"{where}: {type(expr).__name__} is not a YAML value an expression can hold"]
    return _number_problems(expr, where)


def _number_problems(value: Any, where: str) -> list[str]:
    """A literal number no record can hold (Infinity, NaN, an integer past 64 bits), anywhere in `value`."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        else:
            try:
                bounded(item, "a literal")
            except EvalError as exc:
                return [f"{where}: {exc}"]
    return []


def _check_path(path: str, where: str, names: set[str]) -> list[str]:
    try:
        parsed = parse_path(path)
    except ExprProblem as exc:
        return [f"{where}: {exc}"]
    unknown = [r for r in path_roots(parsed) if r not in names]
    if unknown:
        return [f"{where}: bad path {path!r}: ${unknown[0]} is not defined here "
                f"(known: {', '.join('$' + n for n in sorted(names)) or 'none'})"]
    return []


def _check_op(op: str, arg: Any, where: str, names: set[str], draws: bool, predicate: bool, depth: int) -> list[str]:
    if op in DRAWS and not draws:
        return [f"{where}: draw {op!r} is only allowed where tasks are generated (params, state, then)"]
    if predicate and op not in PREDICATE_OPS:
        return [f"{where}: {op!r} does not give true or false, so it cannot be a predicate"]
    sub = lambda e, w, pred=False, inner=names: check(e, w, inner, draws=draws, predicate=pred, depth=depth + 1)  # noqa: E731
    if op == "lit":
        return _number_problems(arg, where)
    if op in PAIR_OPS:
        if not (isinstance(arg, list) and len(arg) == 2):
            return [f"{where}: takes a list of two operands, not {arg!r}"]
        return sub(arg[0], f"{where}[0]") + sub(arg[1], f"{where}[1]")
    if op in LIST_PREDICATES:
        if not isinstance(arg, list) or not arg:
            return [f"{where}: takes a non-empty list of predicates"]
        return [p for i, e in enumerate(arg) for p in sub(e, f"{where}[{i}]", True)]
    if op == "not":
        return sub(arg, where, True)
    if op in ONE_OPS:
        return sub(arg, where)
    if op in ("if", "get"):
        if not (isinstance(arg, list) and len(arg) == 3):
            return [f"{where}: takes a list of three operands"]
        first = sub(arg[0], f"{where}[0]", op == "if")
        return first + sub(arg[1], f"{where}[1]", predicate and op == "if") + \
            sub(arg[2], f"{where}[2]", predicate and op == "if")
    if op in LOOP_OPS:
        allowed = {"in", "where", "to"} if op == "map" else {"in", "where"}
        needed = {"in", "to"} if op == "map" else {"in"}
        return _check_fields(arg, where, allowed, needed) or (
            sub(arg["in"], f"{where}.in")
            + (sub(arg["where"], f"{where}.where", True, names | {"item", "key"}) if "where" in arg else [])
            + (sub(arg["to"], f"{where}.to", False, names | {"item", "key"}) if "to" in arg else []))
    if op == "table":
        problems = _check_fields(arg, where, {"keys", "let", "row"}, {"keys", "row"})
        if problems:
            return problems
        inner = names | {"key", "index"}
        problems = sub(arg["keys"], f"{where}.keys")
        lets = arg.get("let") or {}
        if not isinstance(lets, dict):
            return problems + [f"{where}.let: must be a mapping of name: value"]
        for name, expr in lets.items():
            problems += sub(expr, f"{where}.let.{name}", False, inner)
            inner = inner | {name}
        return problems + sub(arg["row"], f"{where}.row", False, inner)
    return [f"{where}: unknown op {op!r}"]


def _check_fields(arg: Any, where: str, allowed: set[str], needed: set[str]) -> list[str]:
    if not isinstance(arg, dict):
        return [f"{where}: takes a mapping with {', '.join(sorted(needed))}"]
    extra, missing = sorted(set(arg) - allowed), sorted(needed - set(arg))
    return ([f"{where}: unknown field {extra[0]!r} (fields: {', '.join(sorted(allowed))})"] if extra else []) + \
        ([f"{where}: missing field {missing[0]!r}"] if missing else [])


def plain_param(expr: Any) -> str | None:
    """The name of a `$name` path without segments, else None."""
    if isinstance(expr, str) and expr.startswith("$"):
        try:
            root, segments = parse_path(expr)
        except ExprProblem:
            return None
        return None if segments else root
    return None


# -- effects on the state (tools) ---------------------------------------------------------------
EFFECTS = ("set", "add", "append", "remove")


def check_effect(effect: Any, where: str, names: set[str]) -> list[str]:
    """`{set: [$state.path, value]}`, `{add: [...]}`, `{append: [...]}` or `{remove: [...]}`."""
    if not isinstance(effect, dict) or len(effect) != 1:
        return [f"{where}: an effect is one of {', '.join(EFFECTS)}: [$state.path, value], not {effect!r}"]
    (op, arg), = effect.items()
    if op not in EFFECTS:
        return [f"{where}: unknown op {op!r} (effects: {', '.join(EFFECTS)})"]
    if not (isinstance(arg, list) and len(arg) == 2):
        return [f"{where}.{op}: takes [$state.path, value], not {arg!r}"]
    target = arg[0]
    problems = check(target, f"{where}.{op}[0]", names) if isinstance(target, str) and target.startswith("$") \
        else [f"{where}.{op}[0]: bad path {target!r}: the target must be a $state path"]
    if not problems:
        root, segments = parse_path(target)
        if root != "state" or not segments:
            problems.append(f"{where}.{op}[0]: bad path {target!r}: effects change $state.<something> only")
    return problems + check(arg[1], f"{where}.{op}[1]", names)


def apply_effect(effect: dict, scope: Scope) -> None:
    if not getattr(_BUDGET, "open", 0):
        with budget():
            return apply_effect(effect, scope)
    (op, (target, value_expr)), = effect.items()
    value = evaluate(value_expr, scope)
    charge_size(value)  # what the copy costs, and the state it grows
    value = copy.deepcopy(value)
    root, segments = parse_path(target)
    container = lookup((root, segments[:-1]), scope)
    kind, key = segments[-1]
    if kind == "path":
        key = lookup(key, scope)
    if op == "set":
        if isinstance(container, dict) and isinstance(key, str):
            container[key] = value
        elif isinstance(container, list) and isinstance(key, int) and not isinstance(key, bool) \
                and 0 <= key < len(container):
            container[key] = value
        else:
            raise EvalError(f"set {target}: cannot set {key!r} in {type(container).__name__}")
        return
    current = _step(container, key)
    if op == "add":
        if not (_number(current) and _number(value)):
            raise EvalError(f"add {target}: needs numbers, not {current!r} and {value!r}")
        container[key if isinstance(container, list) else str(key)] = bounded(current + value, f"add {target}")
    elif op == "append":
        if not isinstance(current, list):
            raise EvalError(f"append {target}: {current!r} is not a list")
        current.append(value)
    elif isinstance(current, list):  # remove every element equal to the value
        current[:] = [v for v in current if not _same(v, value)]
    elif isinstance(current, dict):  # remove the key
        if isinstance(value, str):
            current.pop(value, None)
    else:
        raise EvalError(f"remove {target}: {current!r} is neither a list nor a mapping")
