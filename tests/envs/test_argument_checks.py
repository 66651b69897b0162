"""The plain-Python check of tool arguments (`gymfoundry.envs.base.accepts`) never accepts what the strict
JSON-schema validator refuses, for every tool of every family, on arguments made to sit on each
keyword's edges; what it does not accept is left to jsonschema, whose message the agent sees."""

from __future__ import annotations

from gymfoundry import envs  # noqa: F401  registers the families
from gymfoundry.envs.base import STRICT, accepts, argument_problem
from gymfoundry.envs.family import families


class Str(str):
    pass


def candidates(prop: dict) -> list:
    """Values on and around each keyword's edges, of every JSON type and some that are not JSON."""
    values = ["", "a", "SKU-1", "x" * 33, "é" * 4, Str("a"), 0, 1, -1, 3.0, 2.5, True, False, None, [], {}, 10**20]
    for key in ("minLength", "maxLength"):
        if key in prop:
            values += ["y" * (prop[key] + d) for d in (-1, 0, 1) if prop[key] + d >= 0]
    for key in ("minimum", "maximum", "exclusiveMinimum"):
        if key in prop:
            values += [prop[key] + d for d in (-1, 0, 1)] + [float(prop[key]), prop[key] + 0.5]
    values += list(prop.get("enum", [])) + [str(e).upper() for e in prop.get("enum", [])]
    return values


def test_the_fast_check_accepts_only_what_the_validator_accepts():
    tools = fast = compared = 0
    for fam in families():
        for tool in fam.env.profile.tools:
            tools += 1
            validator = STRICT(tool.parameters)
            check = accepts(tool.parameters)
            fast += check is not None
            properties = tool.parameters.get("properties", {})
            required = tool.parameters.get("required", [])
            for name, prop in properties.items():
                base = {r: _valid(properties[r]) for r in required}
                for value in candidates(prop):
                    for arguments in ({**base, name: value}, {name: value}, {**base, name: value, "extra": 1}):
                        valid = not list(validator.iter_errors(arguments))
                        if check is not None:
                            compared += 1
                            assert not check(arguments) or valid, (fam.name, tool.name, arguments)
                        assert (argument_problem(validator, arguments) is None) == valid, (fam.name, tool.name, arguments)
    assert fast >= tools // 2 and compared > 1000  # most tools have the fast path; it was exercised


def test_the_fast_check_accepts_ordinary_valid_calls():
    for fam in families():
        task = fam.generate(0, fam.levels[0])
        for call in task.hidden.reference:
            spec = fam.env.profile.tool(call.name)
            check = accepts(spec.parameters)
            if check is not None:
                assert check(call.arguments), (fam.name, call)


def _valid(prop: dict):
    if "enum" in prop:
        return prop["enum"][0]
    kind = prop.get("type")
    if kind == "string":
        return "z" * max(1, prop.get("minLength", 1))
    if kind in ("integer", "number"):
        return max(1, prop.get("minimum", 1), prop.get("exclusiveMinimum", 0) + 1)
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    return None


