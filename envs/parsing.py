"""Turn whatever a policy emitted into a ToolCall, or a precise error.

Accepted: a ToolCall, a dict {"name", "arguments"}, or text holding one JSON object
{"name": ..., "arguments": {...}} either bare or inside <tool_call>...</tool_call>
(the Hermes / Qwen format). Text before the call is the agent's thought. `arguments`
may itself be a JSON string (the OpenAI wire format)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from envs.records import ToolCall

TOOL_CALL_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


class ActionError(Exception):
    """A bad action: becomes an error observation, never a crash."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass
class ParsedAction:
    call: ToolCall
    thought: str | None


def parse_action(action: Any, max_chars: int = 8192) -> ParsedAction:
    if isinstance(action, ToolCall):
        _check_size(json.dumps(action.arguments, default=str), max_chars)
        return ParsedAction(action, None)
    if isinstance(action, dict):
        _check_size(json.dumps(action, default=str), max_chars)
        return ParsedAction(_call_from_dict(action), None)
    if not isinstance(action, str):
        raise ActionError("invalid_action", f"an action must be a ToolCall, a dict or text, "
                                            f"not {type(action).__name__}")
    _check_size(action, max_chars)
    tagged = TOOL_CALL_TAG.findall(action)
    if len(tagged) > 1:
        raise ActionError("multiple_tool_calls", "emit exactly one tool call per step")
    if tagged:
        thought = action[: action.index("<tool_call>")].strip() or None
        payload = tagged[0].strip()
    else:
        start = action.find("{")
        if start < 0:
            raise ActionError("no_tool_call", "no tool call found; reply with "
                              '{"name": <tool>, "arguments": {...}}')
        thought = action[:start].strip() or None
        payload = action[start:].strip()
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise ActionError("invalid_json", f"tool call is not valid JSON: {exc.msg} at char {exc.pos}") from None
    return ParsedAction(_call_from_dict(obj), thought)


def _check_size(text: str, max_chars: int) -> None:
    if len(text) > max_chars:
        raise ActionError("action_too_large", f"action has {len(text)} characters; the limit is {max_chars}")


def _call_from_dict(obj: Any) -> ToolCall:
    if not isinstance(obj, dict):
        raise ActionError("invalid_tool_call", "a tool call must be a JSON object")
    if isinstance(obj.get("function"), dict):  # {"type": "function", "function": {...}}
        obj = {**obj["function"], "id": obj.get("id", "")}
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ActionError("invalid_tool_call", 'a tool call needs a string "name"')
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ActionError("invalid_json", f"arguments are not valid JSON: {exc.msg}") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ActionError("invalid_arguments", '"arguments" must be a JSON object')
    call_id = obj.get("id", "")
    return ToolCall(name=name, arguments=arguments, id=call_id if isinstance(call_id, str) else str(call_id))
