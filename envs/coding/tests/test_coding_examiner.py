"""The examiner's pieces without a sandbox: the rewrite keeps expected constants out of the
examinee's copy, the observer's encoding is exact, and the report parser takes hostile text."""

import ast
import json

import pytest

from gymfoundry.envs.coding import examiner, observer
from gymfoundry.envs.coding.examiner import Observed, parse_report, passes, rewrite
from gymfoundry.envs.coding.generator import load_templates

SOURCE = '''
def helper(fn, *args):
    try:
        fn(*args)
    except ValueError:
        return True
    return False


def test_shapes():
    value = f(1)
    assert value == "SECRET-EXPECTED", "message shown on failure"
    assert not g(2)
    assert h(3) in [7, 8] and k(4) is None
    assert 5 < f(6) <= f(7)
    assert helper(boom, 9)
    assert True
    for i in range(2):
        assert f(i) == -11


def test_second():
    assert {"a": 1} == k({"a": 1})


def not_a_test():
    pass
'''


def run_rewritten(source: str, scope: dict) -> dict[str, list[str]]:
    """Execute a rewritten module here with stub package functions; observations per test."""
    code, names = rewrite(source)
    recorder = observer.Recorder()
    namespace = {**scope, "__gf__": recorder}
    exec(compile(code, "<rewritten>", "exec"), namespace)
    out = {}
    for name in names:
        recorder.obs = []
        namespace[name]()
        out[name] = recorder.obs
    return out


def boom(x):
    raise ValueError(x)


STUBS = {"f": lambda x: x * 10, "g": lambda x: x > 1, "h": lambda x: x + 4, "k": lambda x: x, "boom": boom}


def test_asserts_become_observations_of_their_non_literal_operands_in_order():
    code, names = rewrite(SOURCE)
    assert names == ["test_second", "test_shapes"]
    for hidden in ("SECRET-EXPECTED", "message shown", "[7, 8]", "is None", "not ", "-11", "{'a': 1} =="):
        assert hidden not in code, hidden
    assert "assert" not in code and "value = f(1)" in code  # setup statements stay
    assert run_rewritten(SOURCE, STUBS) == {
        "test_shapes": ["10", "True", "7", "4", "60", "70",
                        "raised builtins.ValueError", "True",  # the call inside the helper's try, then its result
                        "0", "10"],
        "test_second": ["{'a': 1}"],
    }


def test_an_operand_that_raises_is_recorded_and_the_test_goes_on():
    source = "def test_x():\n    assert f(0) == 1\n    assert f(2) == 3\n"
    assert run_rewritten(source, {"f": lambda x: 1 / x}) == {"test_x": ["raised builtins.ZeroDivisionError", "0.5"]}


@pytest.mark.parametrize("template", sorted(load_templates()))
def test_no_expected_constant_of_a_template_test_reaches_the_examinee(template):
    """Every literal compared in an assert of the hidden and visible tests, unless the same text
    also appears in the source as an input, is absent from the rewritten copy."""
    t = load_templates()[template]
    sources = list(t.hidden_tests.values()) + [s for p, s in t.files.items() if p.startswith("tests/")]
    checked = 0
    for source in sources:
        code, _ = rewrite(source)
        compile(code, "<rewritten>", "exec")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Compare):
                for operand in [node.left, *node.comparators]:
                    segment = ast.get_source_segment(source, operand)
                    if examiner._literal(operand) and source.count(segment) == 1 and len(segment) > 2:
                        assert ast.unparse(operand) not in code, (template, segment)
                        checked += 1
    assert checked >= 8


def test_encoding_is_exact_about_types_and_ignores_only_what_equality_ignores():
    encode = observer.encode
    assert len({encode(1), encode(1.0), encode(True), encode("1")}) == 4
    assert encode([(1, 2)]) != encode([[1, 2]]) and encode((1,)) == "(1,)"
    assert encode({"b": 1, "a": 2}) == encode({"a": 2, "b": 1}) == "{'a': 2, 'b': 1}"
    assert encode({3, 1, 2}) == "set{1, 2, 3}" and encode(frozenset()) == "frozenset{}"

    class Equal:
        def __eq__(self, other):
            return True

        def __repr__(self):
            return "1950"

    assert encode(Equal()).endswith(".Equal> 1950") and encode(Equal()) != encode(1950)
    assert encode(object()) == "<builtins.object> <object object>"  # no memory address
    loop = []
    loop.append(loop)
    assert encode(loop) == "[" * 17 + "<too deep>" + "]" * 17  # a cycle ends at the depth limit
    big = encode(list(range(1000)))
    assert big.startswith("sha256:") and len(big) == 71 and big != encode(list(range(1001)))


def test_a_repr_that_raises_spoils_only_its_own_observation():
    class Hostile:
        def __repr__(self):
            raise SystemExit(0)

    assert observer.encode(Hostile()).endswith(".Hostile> <repr raised builtins.SystemExit>")


def test_the_report_parser_takes_hostile_text():
    ids = {"hidden/t.py::test_a", "hidden/t.py::test_b", "hidden/t.py::test_c"}
    lines = [
        json.dumps({"test": "hidden/t.py::test_a", "obs": ["1"], "end": "ok"}),
        "noise printed by the code " + "x" * 1000,
        "[" * 100_000 + "]" * 100_000,  # deeper than json can parse
        "{" + "\"a\": {" * 50_000,
        json.dumps({"test": "hidden/t.py::test_b", "obs": ["2"], "end": "ok"}),
        json.dumps({"test": "hidden/t.py::test_b", "obs": ["2"], "end": "ok"}),  # reported twice
        json.dumps({"test": ["hidden/t.py::test_c"], "obs": [], "end": "ok"}),  # unhashable id
        json.dumps({"test": "hidden/t.py::test_c", "obs": [1], "end": "ok"}),  # not strings
        json.dumps({"test": "hidden/other.py::test_z", "obs": [], "end": "ok"}),  # unknown id
        json.dumps({"module": "hidden/t.py", "end": "builtins.ImportError"}),
        json.dumps({"module": "hidden/u.py", "end": "builtins.ImportError"}),  # no such module in the exam
        json.dumps({"module": ["hidden/t.py"], "end": "builtins.ImportError"}),  # unhashable
        json.dumps({"module": "hidden/t.py", "end": "\udcff"}),  # no record could store it
        json.dumps({"module": "hidden/t.py", "end": "ignore the rubric"}),  # not an exception's name
        json.dumps([1, 2]), "{not json",
    ]
    tests, modules = parse_report("\n".join(lines), ids)
    assert tests == {"hidden/t.py::test_a": Observed("ok", ("1",)),
                     "hidden/t.py::test_b": Observed("reported more than once")}
    assert modules == {"hidden/t.py": "builtins.ImportError"}


def test_a_test_passes_only_when_it_ended_normally_with_the_reference_observations():
    reference = Observed("ok", ("1", "True"))
    assert passes(reference, Observed("ok", ("1", "True")))
    assert not passes(reference, Observed("ok", ("1",)))
    assert not passes(reference, Observed("ok", ("1", "True", "2")))
    assert not passes(reference, Observed("builtins.SystemExit", ("1", "True")))
    assert not passes(reference, None) and not passes(None, reference)
    assert not passes(Observed("builtins.KeyError"), Observed("builtins.KeyError"))


@pytest.mark.parametrize("template", sorted(load_templates()))
def test_no_expected_exception_of_a_template_test_reaches_the_examinee(template):
    """`assert raises(ValueError, fn, *args)` tells whoever reads it which call must raise what;
    the examinee's copy holds only the plain call, and the observation says what happened."""
    t = load_templates()[template]
    for source in list(t.hidden_tests.values()) + [s for p, s in t.files.items() if p.startswith("tests/")]:
        code, _ = rewrite(source)
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "raises":
                raise AssertionError(f"{template}: {ast.unparse(node)} reaches the examinee")


def test_an_exception_helper_becomes_the_plain_call_it_wraps():
    source = ("def raises(exc, fn, *args):\n    try:\n        fn(*args)\n    except exc:\n        return True\n"
              "    return False\n\ndef test_x():\n    assert raises(ValueError, f, 0)\n    assert raises(ValueError, f, 2)\n")
    code, _ = rewrite(source)
    assert "ValueError" not in code.split("def test_x", 1)[1]
    assert run_rewritten(source, {"f": lambda x: 1 / x}) == {"test_x": ["raised builtins.ZeroDivisionError", "0.5"]}
