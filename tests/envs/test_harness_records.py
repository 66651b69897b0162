"""Assembling a harness episode's steps from the env's tool calls and the proxy's model calls
(envs/harness.py): alignment by order, name and arguments; tokens kept as sampled, never shared
or guessed; how the model calls ended."""

from __future__ import annotations

import json

from gymfoundry.envs.harness import ModelCall, assemble_steps, inference_end, policy_of, seen
from gymfoundry.envs.records import Step, ToolCall


def env_step(index: int, name: str, arguments: dict, observation: str = "obs") -> Step:
    return Step(index=index, observation=observation, tool_call=ToolCall(name=name, arguments=arguments,
                                                                         id=f"mcp-{index}"), result="r")


def model_call(index: int, calls: list[tuple[str, dict]], messages=None, content=None, status="ok") -> ModelCall:
    ok = status == "ok"
    tool_calls = [{"id": f"call_{index}_{k}", "type": "function",
                   "function": {"name": n, "arguments": json.dumps(a)}} for k, (n, a) in enumerate(calls)]
    return ModelCall(episode_id="e", index=index, model="m", upstream="u", status=status,
                     messages=messages or [{"role": "user", "content": f"turn {index}"}],
                     response={"role": "assistant", "content": content, "tool_calls": tool_calls} if ok else None,
                     token_ids=[index, index] if ok else None, logprobs=[-1.0, -2.0] if ok else None)


def test_parallel_calls_of_one_completion_share_no_tokens():
    steps, last = assemble_steps([env_step(0, "a", {"x": 1}), env_step(1, "b", {})],
                                 [model_call(0, [("a", {"x": 1}), ("b", {})], content="both")])
    assert [s.tool_call.id for s in steps] == ["call_0_0", "call_0_1"]
    assert [s.token_ids for s in steps] == [[0, 0], None]  # one sample: its tokens once, on its first call
    assert [s.thought for s in steps] == ["both", "both"] and last == 0
    assert steps[0].observation == "turn 0" and steps[1].observation == "obs"


def test_alignment_skips_calls_the_harness_never_ran_and_keeps_steps_no_call_emitted():
    calls = [model_call(0, [("a", {"x": 1})]), model_call(1, [("a", {"x": 2})]), model_call(2, [("c", {})])]
    steps, last = assemble_steps([env_step(0, "a", {"x": 2}), env_step(1, "z", {}), env_step(2, "c", {})], calls)
    assert [s.tool_call.id for s in steps] == ["call_1_0", "mcp-1", "call_2_0"]
    assert [s.token_ids for s in steps] == [[1, 1], None, [2, 2]]  # never guessed for the unmatched step
    assert steps[1].action_text is None and steps[1].policy_version is None
    assert last == 2


def test_what_the_model_saw_is_the_recorded_request_after_its_last_turn():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "goal"},
                {"role": "assistant", "content": None, "tool_calls": []},
                {"role": "tool", "content": [{"type": "text", "text": "result 1"}]},
                {"role": "user", "content": "go on"}]
    assert seen(messages) == "result 1\ngo on"
    assert seen(messages[:2]) == "s\ngoal"


def test_a_fault_touches_the_episode_even_when_the_harness_retried_with_success():
    """The proxy retries the upstream itself; a fault it records is one its retries did not cure.
    A harness that then retries (or not) chooses nothing: the attempt is touched, in no statistic."""
    fault = model_call(1, [], status="fault").model_copy(update={"error": "HTTP 503 from u"})
    expected = ("inference endpoint failed: model call 1 through the proxy: HTTP 503 from u", None, None)
    assert inference_end([model_call(0, []), fault, model_call(2, [])]) == expected
    assert inference_end([model_call(0, []), fault]) == expected
    assert inference_end([model_call(0, []), model_call(1, [])]) == (None, None, None)
    assert inference_end([model_call(0, [], status="context")])[1].startswith("the model's context is full")
    refused = inference_end([model_call(0, [], status="refused")])
    assert refused[:2] == (None, None) and refused[2].startswith("the harness's last model request was refused")


def test_the_policy_is_the_model_the_upstream_named():
    assert policy_of([]) == ("harness:unrecorded", "no model calls recorded")
    assert policy_of([model_call(0, [])]) == ("harness:m", "u")
    assert policy_of([model_call(0, []).model_copy(update={"fingerprint": "fp_1"})]) == ("harness:m", "u|fp_1")
    big = model_call(1, []).model_copy(update={"model": "big", "fingerprint": "fp_2"})
    assert policy_of([big, model_call(2, []), model_call(3, [])]) == ("harness:big+m", "u+u|fp_2")


def test_a_request_the_harness_got_wrong_decides_no_class_and_hides_no_fault():
    """A malformed request or a stream the harness closed is the examinee's own doing: ending on one
    must not make a failing episode a fault (or a class outside every statistic), nor hide a fault."""
    fault = model_call(1, [], status="fault").model_copy(update={"error": "HTTP 503 from u"})
    for own in ("refused", "cancelled"):
        mine = model_call(2, [], status=own)
        fault_, context, named = inference_end([model_call(0, []), mine])
        assert (fault_, context) == (None, None) and named.startswith(f"the harness's last model request was {own}")
        assert inference_end([model_call(0, []), fault, mine])[0].startswith("inference endpoint failed: model call 1")
