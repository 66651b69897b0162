"""Turn whatever a policy emitted into a ToolCall, or a precise error.

Accepted: a ToolCall, a dict {"name", "arguments"}, or text holding one JSON object
{"name": ..., "arguments": {...}} either bare or inside <tool_call>...</tool_call>
(the Hermes / Qwen format). Text before the call is the agent's thought. `arguments`
may itself be a JSON string (the OpenAI wire format).

Whatever the path, the call must be plain JSON that can be stored and replayed exactly:
nesting at most MAX_DEPTH, finite numbers (Python's json accepts NaN / Infinity, which would
be stored as null), integers that fit 64 bits, strings that are valid Unicode (a lone
surrogate cannot be encoded), string keys, no other Python types. Anything else is an
`ActionError` of an agent-input kind (envs.errors)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from gymfoundry.envs.errors import ActionError, ErrorKind
from gymfoundry.envs.records import ToolCall, construct

__all__ = ["ActionError", "MAX_DEPTH", "ParsedAction", "parse_action", "replay_call", "storable_text"]

TOOL_CALL_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
SURROGATE = re.compile("[\ud800-\udfff]")
MAX_DEPTH = 32  # containers inside containers; tool arguments here are at most 3 deep
MAX_INT = 2**63


@dataclass
class ParsedAction:
    call: ToolCall
    thought: str | None


def parse_action(action: Any, max_chars: int = 8192) -> ParsedAction:
    if isinstance(action, ToolCall):
        action = {"name": action.name, "arguments": action.arguments, "id": action.id}
    if isinstance(action, dict):
        _check_plain(action, "action")
        _check_size(json.dumps(action), max_chars)
        return ParsedAction(_call_from_dict(action), None)
    if not isinstance(action, str):
        raise ActionError(ErrorKind.invalid_action, f"an action must be a ToolCall, a dict or text, "
                                                    f"not {type(action).__name__}")
    _check_size(action, max_chars)
    _check_text(action, "the action", ErrorKind.invalid_action)
    tagged = TOOL_CALL_TAG.findall(action)
    if len(tagged) > 1:
        raise ActionError(ErrorKind.multiple_tool_calls, "emit exactly one tool call per step")
    if tagged:
        thought = action[: action.index("<tool_call>")].strip() or None
        payload = tagged[0].strip()
    else:
        start = action.find("{")
        if start < 0:
            raise ActionError(ErrorKind.no_tool_call, "no tool call found; reply with "
                              '{"name": <tool>, "arguments": {...}}')
        thought = action[:start].strip() or None
        payload = action[start:].strip()
    obj = _loads(payload, "tool call")
    _check_plain(obj, "action")
    return ParsedAction(_call_from_dict(obj), thought)


def replay_call(action: Any, max_chars: int = 8192) -> ToolCall:
    """`parse_action(action, max_chars).call` for a caller that only reads the call (a replay): a
    ToolCall whose name, id and flat arguments are plain JSON is checked exactly as `parse_action`
    checks it (the same size of the same JSON) and returned itself instead of a copy; anything
    else goes through `parse_action`."""
    if type(action) is ToolCall:
        fields = action.__dict__
        name, arguments, call_id = fields.get("name"), fields.get("arguments"), fields.get("id")
        if type(name) is str and name and type(call_id) is str and type(arguments) is dict:
            form = {"name": name, "arguments": arguments, "id": call_id}
            if _shallow_plain(form):
                if _json_bound(form) > max_chars:  # else its JSON cannot be over the limit
                    _check_size(json.dumps(form), max_chars)
                return action
    return parse_action(action, max_chars).call


def storable_text(text: str) -> str:
    """`text` with lone surrogates written as \\udXXX escapes, so a record holding an agent's bad
    text can still be stored (UTF-8) without losing what it said."""
    if not SURROGATE.search(text):
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _loads(text: str, what: str) -> Any:
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:  # the parser's own stack: only this text's nesting can exhaust it here
        raise ActionError(ErrorKind.action_too_deep, f"{what} nests deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise ActionError(ErrorKind.invalid_json, f"{what} is not valid JSON: {exc.msg} at char {exc.pos}") from None
    except ValueError as exc:  # NaN / Infinity (below), or an integer of more digits than Python converts
        raise ActionError(ErrorKind.invalid_json, f"{what} is not valid JSON: {exc}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check_size(text: str, max_chars: int) -> None:
    if len(text) > max_chars:
        raise ActionError(ErrorKind.action_too_large, f"action has {len(text)} characters; the limit is {max_chars}")


def _check_text(text: str, where: str, kind: ErrorKind) -> None:
    bad = SURROGATE.search(text)
    if bad:
        raise ActionError(kind, f"{where} is not valid Unicode: lone surrogate U+{ord(bad.group()):04X} "
                                f"at char {bad.start()}")


def _check_plain(obj: Any, root: str) -> None:
    """Plain, storable JSON or ActionError; iterative, so no nesting can exhaust the stack. The
    path of a value (`root/key/...`, for the message) is only spelled out for a bad one."""
    if type(obj) is dict and _shallow_plain(obj):
        return
    stack = [(obj, None, root, 0)]
    while stack:
        value, parent, key, depth = stack.pop()
        kind = type(value)
        if kind is str:
            if SURROGATE.search(value):
                _check_text(value, _where(parent, key), ErrorKind.invalid_arguments)
        elif kind is int or kind is bool or value is None:
            if kind is int and not -MAX_INT <= value < MAX_INT:
                raise ActionError(ErrorKind.invalid_arguments, f"{_where(parent, key)}: integer out of range (64 bits)")
        elif isinstance(value, (dict, list)):
            where = (parent, key)
            if depth >= MAX_DEPTH:
                raise ActionError(ErrorKind.action_too_deep, f"{_where(*where)} nests deeper than {MAX_DEPTH} levels")
            if isinstance(value, dict):
                for k, item in value.items():
                    if not isinstance(k, str):
                        raise ActionError(ErrorKind.invalid_arguments, f"{_where(*where)}: keys must be strings, "
                                                                       f"not {type(k).__name__}")
                    if SURROGATE.search(k):
                        _check_text(k, f"a key in {_where(*where)}", ErrorKind.invalid_arguments)
                    stack.append((item, where, k, depth + 1))
            else:
                stack.extend((item, where, i, depth + 1) for i, item in enumerate(value))
        else:
            _check_scalar(value, _where(parent, key))


def _plain_scalar(value: Any) -> bool:
    """An exact str (valid Unicode), int (64 bits), bool, None or finite float: what `_check_plain`
    accepts without looking further."""
    kind = type(value)
    if kind is str:
        return value.isascii() or not SURROGATE.search(value)
    if kind is int:
        return -MAX_INT <= value < MAX_INT
    if kind is bool or value is None:
        return True
    return kind is float and math.isfinite(value)


def _shallow_plain(obj: dict) -> bool:
    """A dict of valid string keys whose values are plain scalars or dicts of them (a tool call
    and its flat arguments): plain JSON, as the walk in `_check_plain` would find it. False only
    means "walk it" (a deeper value, or something the walk reports)."""
    for key, value in obj.items():
        if type(key) is not str or not (key.isascii() or not SURROGATE.search(key)):
            return False
        if type(value) is dict:
            for k, v in value.items():
                if type(k) is not str or not (k.isascii() or not SURROGATE.search(k)) or not _plain_scalar(v):
                    return False
        elif not _plain_scalar(value):
            return False
    return True


def _json_bound(form: dict) -> int:
    """At least len(json.dumps(form)) for a form `_shallow_plain` accepted: each character of a
    string is written as at most 12 (a surrogate pair of \\u escapes), a number as at most 32
    characters, each entry adds a separator, a colon and quotes, each dict its braces."""
    total = 2
    for key, value in form.items():
        total += 12 * len(key) + 6
        if type(value) is dict:
            total += 2
            for k, v in value.items():
                total += 12 * len(k) + 6 + (12 * len(v) + 2 if type(v) is str else 32)
        else:
            total += 12 * len(value) + 2 if type(value) is str else 32
    return total


def _where(parent: tuple | None, key: Any) -> str:
    """`root/key/...` of a value from its parent's (parent, key) chain."""
    parts = [str(key)]
    while parent is not None:
        parent, key = parent
        parts.append(str(key))
    return "/".join(reversed(parts))


def _check_scalar(value: Any, where: str) -> None:
    """A value that is not an exact str, int, bool, None, dict or list (a float, a subclass, or no JSON at all)."""
    if isinstance(value, str):
        _check_text(value, where, ErrorKind.invalid_arguments)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ActionError(ErrorKind.invalid_json, f"{where}: {value} is not a JSON number")
    elif isinstance(value, int) and not isinstance(value, bool) and not -MAX_INT <= value < MAX_INT:
        raise ActionError(ErrorKind.invalid_arguments, f"{where}: integer out of range (64 bits)")
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise ActionError(ErrorKind.invalid_arguments, f"{where}: {type(value).__name__} is not a JSON value")


def _call_from_dict(obj: Any) -> ToolCall:
    if not isinstance(obj, dict):
        raise ActionError(ErrorKind.invalid_tool_call, "a tool call must be a JSON object")
    if isinstance(obj.get("function"), dict):  # {"type": "function", "function": {...}}
        obj = {**obj["function"], "id": obj.get("id", "")}
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ActionError(ErrorKind.invalid_tool_call, 'a tool call needs a string "name"')
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        arguments = _loads(arguments, "arguments") if arguments.strip() else {}
        _check_plain(arguments, "arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ActionError(ErrorKind.invalid_arguments, '"arguments" must be a JSON object')
    call_id = obj.get("id", "")
    call_id = call_id if isinstance(call_id, str) else str(call_id)
    if type(name) is str and type(call_id) is str:
        # Every field is checked above (a str name, plain JSON arguments in a dict, a str id): the
        # record is built without validating them again. The new dict is the one validation makes,
        # so the call never shares its top level with the caller's dict.
        return construct(ToolCall, {"name": name, "arguments": dict(arguments), "id": call_id})
    return ToolCall(name=name, arguments=arguments, id=call_id)
