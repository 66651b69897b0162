"""The chat format: how a task's episode is written as chat messages (the system prompt, the
observation as the user turn, each step as an assistant turn calling a tool and the tool's result),
one owner for the policies that talk to a model and the datasets that train one, and the form of
tool-call arguments (a JSON string as stored, or a dict) a chat template wants."""

from __future__ import annotations

import json
from typing import Any

from gymfoundry.envs.records import Rollout, Step, ToolCall

SYSTEM_PROMPT = ("You are an agent that completes the user's task by calling tools. Call exactly one tool per "
                 "turn; the tool's result comes back as the next message.")
TOOL_ARGUMENTS = ("dict", "string")


def prompt_messages(rollout: Rollout) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": rollout.steps[0].observation if rollout.steps else ""}]


def step_messages(step: Step) -> list[dict[str, Any]]:
    """One step as an assistant turn and the observation it received."""
    call = step.tool_call
    if call is None:
        return [{"role": "assistant", "content": step.action_text or ""}, {"role": "user", "content": step.result}]
    call_id = call.id or f"call_{step.index}"
    return [assistant_call_message(call, step.thought, call_id),
            {"role": "tool", "name": call.name, "tool_call_id": call_id, "content": step.result}]


def assistant_call_message(call: ToolCall, thought: str | None, call_id: str) -> dict[str, Any]:
    """An assistant turn calling a tool, arguments as a JSON string (as chat templates and TRL expect)."""
    return {"role": "assistant", "content": thought or "",
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": call.name, "arguments": json.dumps(call.arguments, sort_keys=True)}}]}


def turn_messages(rollout: Rollout) -> list[dict[str, Any]]:
    """Assistant turns and the observations they received, in order."""
    return [m for step in rollout.steps for m in step_messages(step)]


def with_tool_arguments(messages: list[dict[str, Any]], form: str) -> list[dict[str, Any]]:
    """`messages` with the arguments of every assistant tool call as a dict or a JSON string."""
    if form not in TOOL_ARGUMENTS:
        raise ValueError(f"unknown tool_arguments {form!r}; use one of {TOOL_ARGUMENTS} (or None: as stored)")
    return [{**m, "tool_calls": [_call_with_arguments(c, form) for c in m["tool_calls"]]}
            if m.get("role") == "assistant" and m.get("tool_calls") else m for m in messages]


def _call_with_arguments(call: dict[str, Any], form: str) -> dict[str, Any]:
    arguments = call["function"]["arguments"]
    if form == "dict" and isinstance(arguments, str):
        arguments = json.loads(arguments)
    elif form == "string" and not isinstance(arguments, str):
        arguments = json.dumps(arguments, sort_keys=True)
    return {**call, "function": {**call["function"], "arguments": arguments}}
