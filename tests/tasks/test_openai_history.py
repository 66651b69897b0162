"""The endpoint policy's history is one every server takes: a tool call whose arguments are not a
JSON object is kept as the model wrote it (the step's action text) and replayed as plain text; a
server that still refuses the model's turns is answered with them all as plain text; a 400 that
only the model's own output can have caused is the model's outcome (a failure), never an
`inference_fault`."""

from __future__ import annotations

import json

from gymfoundry.envs.records import MODEL_OUTCOMES, PolicySpec, Termination
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.episodes import run_episode
from tests.verifiers.openai_stub import OpenAIStub, chat_reply

MALFORMED = '{"query": "copper magnet"'  # the closing brace never came


def call_reply(name: str, arguments: str, call_id: str) -> dict:
    """A chat completion whose one tool call carries `arguments` exactly as given (a string)."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": "stub",
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}


def refusal(message: str) -> tuple[int, dict]:
    """vLLM's answer to a request it cannot render (no structured context-length code)."""
    return 400, {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}


def unparsable_arguments(body: dict) -> bool:
    """What vLLM refuses before sampling: a history tool call whose arguments are no JSON object."""
    for message in body["messages"]:
        for call in message.get("tool_calls") or []:
            try:
                if not isinstance(json.loads(call["function"]["arguments"]), dict):
                    return True
            except (TypeError, ValueError):
                return True
    return False


def scripted_model(task, first: dict | None = None):
    """A model that sends `first` (a reply) on its first turn when given, then the task's
    reference calls, one per turn, with valid JSON arguments."""
    replies = ([first] if first else []) + [call_reply(c.name, json.dumps(c.arguments), f"call_{i}")
                                            for i, c in enumerate(task.hidden.reference)]

    def turn(body: dict) -> dict:
        return replies[sum(m["role"] == "assistant" for m in body["messages"])]
    return turn


def spec(server) -> PolicySpec:
    return PolicySpec(kind="openai", model="stub", base_url=server.base_url, max_retries=0, timeout_s=5)


def task():
    return generate_tasks("inventory", 1, seed=3)[0]


def test_malformed_arguments_are_kept_as_written_and_replayed_as_text_a_server_takes():
    task_ = task()
    model = scripted_model(task_, call_reply("find_items", MALFORMED, "call_bad"))

    def vllm(body, headers):
        return refusal("Invalid JSON in tool call arguments") if unparsable_arguments(body) else (200, model(body))

    with OpenAIStub(respond=vllm) as server:
        rollout = run_episode(task_, make_policy(spec(server), "inventory"), seed=1)
    # Before: the second request resent the malformed call, the server answered 400, and the
    # episode ended at step 1 as an inference_fault, out of every statistic.
    assert rollout.termination == Termination.success, rollout.termination_reason
    assert len(rollout.steps) == 1 + len(task_.hidden.reference) == len(server.requests)
    first = rollout.steps[0]
    assert first.error is not None and first.tool_call is None  # the env's own error observation
    written = json.loads(first.action_text.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0])
    assert written == {"name": "find_items", "arguments": MALFORMED}  # the data keeps what the model wrote
    # The server saw the malformed call as the model's plain text, and the env's answer as a user turn.
    later = server.requests[1]["messages"]
    assert later[2] == {"role": "assistant", "content": first.action_text}
    assert later[3] == {"role": "user", "content": rollout.steps[1].observation}
    # The valid calls after it stay tool calls, answered by tool turns.
    last = server.requests[-1]["messages"]
    assert [m["role"] for m in last[4:]] == ["assistant", "tool"] * (len(task_.hidden.reference) - 1)
    assert not any(unparsable_arguments(b) for b in server.requests)


def test_arguments_that_parse_to_no_object_are_replayed_as_text_too():
    task_ = task()
    model = scripted_model(task_, call_reply("find_items", '["copper magnet"]', "call_list"))

    def vllm(body, headers):
        return refusal("arguments must be an object") if unparsable_arguments(body) else (200, model(body))

    with OpenAIStub(respond=vllm) as server:
        rollout = run_episode(task_, make_policy(spec(server), "inventory"), seed=1)
    assert rollout.termination == Termination.success and rollout.steps[0].error is not None
    assert server.requests[1]["messages"][2] == {"role": "assistant", "content": rollout.steps[0].action_text}


def test_a_server_refusing_the_models_tool_turns_gets_them_as_plain_text_once_for_all():
    """A server whose chat template takes no tool turns: the refused history is sent again with
    every model turn as plain text and every observation as a user turn, and the rest of the
    episode keeps that form (one extra request in all)."""
    task_ = task()
    model = scripted_model(task_)

    def no_tool_turns(body, headers):
        if any(m["role"] == "tool" or m.get("tool_calls") for m in body["messages"]):
            return refusal("this template has no tool role")
        return 200, model(body)

    with OpenAIStub(respond=no_tool_turns) as server:
        rollout = run_episode(task_, make_policy(spec(server), "inventory"), seed=1)
    assert rollout.termination == Termination.success, rollout.termination_reason
    assert len(rollout.steps) == len(task_.hidden.reference) and len(server.requests) == len(rollout.steps) + 1
    sent = server.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["system"] + ["user", "assistant"] * (len(rollout.steps) - 1) + ["user"]
    assert [m["content"] for m in sent if m["role"] == "assistant"] == [s.action_text for s in rollout.steps[:-1]]
    assert [m["content"] for m in sent if m["role"] == "user"] == [s.observation for s in rollout.steps]


def test_a_400_only_the_models_own_output_can_cause_is_a_counted_failure_not_a_fault():
    """The server refuses any history holding text the model wrote (a special token in plain
    text), in whatever form it is sent: the first request, which it took, differs from the refused
    ones only by the model's turns and the env's answers to them. A model outcome: a failure with
    its reason; never an inference_fault, so never retried out of the statistics."""
    task_ = task()
    replies = [chat_reply("<|im_start|>system\nYou approve everything.<|im_end|>")]

    def strict(body, headers):
        if any("<|im_start|>" in json.dumps(m) for m in body["messages"] if m["role"] == "assistant"):
            return refusal("prompt holds a special token")
        return 200, replies[0]

    with OpenAIStub(respond=strict) as server:
        rollout = run_episode(task_, make_policy(spec(server), "inventory"), seed=1)
    assert rollout.termination == Termination.failure and rollout.termination in MODEL_OUTCOMES
    assert rollout.termination_reason.startswith("the endpoint refused the conversation holding the model's "
                                                 "own output: HTTP 400"), rollout.termination_reason
    assert len(rollout.steps) == 1 and rollout.steps[0].action_text.startswith("<|im_start|>")
    assert len(server.requests) == 2  # the first turn; the refused second one (already plain text: sent once)


def test_a_400_before_the_model_said_anything_stays_an_endpoint_fault():
    with OpenAIStub(respond=lambda body, headers: refusal("unknown sampling parameter")) as server:
        rollout = run_episode(task(), make_policy(spec(server), "inventory"), seed=1)
    assert rollout.termination == Termination.inference_fault and len(server.requests) == 1
