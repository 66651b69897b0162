"""An external agent harness's episode, as records: the model calls a recording proxy saw
(`ModelCall`) and how they join the env's own tool-call steps into the steps of one rollout.

A harness keeps its own loop: it calls the model through the proxy and the env's tools over MCP.
The env's `Recorder` sees the tool calls; the proxy sees the model calls. `assemble_steps` aligns
the two by order, name and arguments (MCP carries no model call id), and takes from the matched
model call what the model saw (the recorded request, never re-rendered history), what it emitted,
its token ids and logprobs as sampled, and the call's id. However many conversations ("records")
the harness split an episode into (context summaries, branches, retries), they make one rollout.

Plain pydantic and stdlib: usable without Prefect, DuckDB or torch."""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import Field

from gymfoundry.envs.parsing import storable_text
from gymfoundry.envs.records import Record, Step


class ModelCall(Record):
    """One chat-completions request a harness sent through the proxy, and what came back.
    `status`: ok; `fault` (the upstream failed: no connection, a timeout, 429, 5xx, an unreadable
    reply — an inference fault, never the model's); `context` (the upstream refused a context too
    long, by its structured code); `refused` (another 4xx, or a request the proxy cannot forward and
    record: the harness's request was malformed); `cancelled` (the harness closed a stream before
    its end). The last two are the harness's own doing: the examinee's, never a fault."""

    episode_id: str
    index: int = Field(ge=0)  # order in which the proxy received the episode's calls
    at: float = Field(default_factory=time.time)  # when the proxy received it (unix time)
    model: str = ""  # the model the upstream says answered (else the one requested)
    fingerprint: str | None = None  # the upstream's `system_fingerprint` (its serving configuration), if any
    upstream: str = ""  # the upstream's base URL, as the proxy forwards (redacted)
    messages: list[dict[str, Any]] = Field(default_factory=list)  # the request: the prefix the model saw
    tools: list[dict[str, Any]] | None = None
    response: dict[str, Any] | None = None  # the reply's message (role, content, tool_calls)
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    latency_s: float = 0.0
    status: Literal["ok", "fault", "context", "refused", "cancelled"] = "ok"
    error: str | None = None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return list((self.response or {}).get("tool_calls") or [])


def text_of(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def seen(messages: list[dict[str, Any]]) -> str:
    """What the model was shown anew in this request: the messages after its last own turn in the
    recorded prefix (all of them in a fresh or re-rendered conversation)."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    return "\n".join(text for m in messages[last + 1:] if (text := text_of(m.get("content"))))


def arguments_of(tool_call: dict[str, Any]) -> Any:
    raw = (tool_call.get("function") or {}).get("arguments")
    if isinstance(raw, str):
        try:
            return json.loads(raw or "{}")
        except ValueError:
            return raw
    return raw if raw is not None else {}


def action_text(thought: str, tool_call: dict[str, Any]) -> str:
    """The emitted call as the factory's endpoint policy writes it (tasks/policies/openai.py)."""
    function = tool_call.get("function") or {}
    return (thought + "\n" if thought else "") + "<tool_call>" + json.dumps(
        {"name": function.get("name"), "arguments": function.get("arguments") or "{}"}) + "</tool_call>"


def policy_of(calls: list[ModelCall]) -> tuple[str, str]:
    """(policy id, version) of a harness episode: the model the upstream named, and where it ran
    (with the upstream's fingerprint of its configuration where it gives one). An episode whose calls
    several models (or configurations) answered names them all, sorted, joined by '+': a harness
    that asks a stronger model for the hard turns must not credit the last one with the episode."""
    answered = [c for c in calls if c.status == "ok"] or calls
    if not answered:
        return "harness:unrecorded", "no model calls recorded"
    models = sorted({c.model or "unknown" for c in answered})
    versions = sorted({f"{c.upstream or 'unknown'}|{c.fingerprint}" if c.fingerprint else c.upstream or "unknown"
                       for c in answered})
    return "harness:" + "+".join(models), "+".join(versions)


def assemble_steps(tool_steps: list[Step], calls: list[ModelCall]) -> tuple[list[Step], int | None]:
    """The episode's steps: each env step joined to the model call that emitted its tool call
    (the next unmatched emitted call, in order, with the same name and arguments). A step no
    recorded call emitted stays as the env recorded it (no token ids: never guessed). Also the
    index in `calls` of the call behind the last matched step (None if none matched)."""
    version = policy_of(calls)[1] if calls else None
    emitted = [(n, tc, k == 0) for n, c in enumerate(calls) if c.status == "ok" for k, tc in enumerate(c.tool_calls)]
    steps, start, last = [], 0, None
    for step in tool_steps:
        call = step.tool_call
        found = next((m for m in range(start, len(emitted)) if call is not None
                      and (emitted[m][1].get("function") or {}).get("name") == call.name
                      and arguments_of(emitted[m][1]) == call.arguments), None)
        if found is None:
            steps.append(step)
            continue
        start = found + 1
        n, tool_call, first = emitted[found]
        record = calls[n]
        thought = text_of((record.response or {}).get("content"))
        update: dict[str, Any] = {
            "action_text": storable_text(action_text(thought, tool_call)), "thought": storable_text(thought) or None,
            "tool_call": call.model_copy(update={"id": tool_call.get("id") or call.id}), "policy_version": version}
        if first:  # the completion's tokens belong to its first call only: parallel calls share one sample
            update.update(observation=seen(record.messages) or step.observation, token_ids=record.token_ids,
                          logprobs=record.logprobs)
        steps.append(step.model_copy(update=update))
        last = n
    return steps, last


HARNESS_OWN = frozenset({"refused", "cancelled"})  # the harness's own doing, never the upstream's


def inference_end(calls: list[ModelCall]) -> tuple[str | None, str | None, str | None]:
    """How the harness's model calls ended: (inference fault, context exceeded, the harness's own
    failed request), each a reason or None. Any call the upstream failed (after the proxy's own
    retries) makes the episode an inference fault, whatever came after it: an attempt touched by a
    fault is in no statistic, or a harness that retried only while it was doing well would raise its
    success rate with the fault rate. A full context is read from the last call the upstream
    answered or failed. A request the harness itself got wrong
    (`refused`, `cancelled`) is the examinee's doing, as a malformed tool call is: it decides no
    class (a harness must not turn its failing episode into one outside every statistic by ending
    on a garbage request or a stream it closes); the third value only names it, for the reason."""
    own = calls[-1] if calls and calls[-1].status in HARNESS_OWN else None
    mine = (f"the harness's last model request was {own.status}: model call {own.index} through the proxy: "
            f"{own.error or own.status}") if own else None
    answered = [c for c in calls if c.status not in HARNESS_OWN]
    fault = next((c for c in answered if c.status == "fault"), None)
    if fault is not None:
        return f"inference endpoint failed: model call {fault.index} through the proxy: {fault.error or 'fault'}", \
            None, mine
    if not answered or answered[-1].status == "ok":
        return None, None, mine
    last = answered[-1]
    return None, f"the model's context is full: model call {last.index} through the proxy: {last.error or last.status}", \
        mine
