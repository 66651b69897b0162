"""Endpoint faults are not model outcomes: 500s and a closed port end the episode as
`inference_fault` (after the policy's own bounded retries), retried under the run's RetryPolicy,
counted in the run report and never in a dataset; a context-length rejection truncates; a reply
that is no valid tool call stays the model's."""

import pytest

from gymfoundry.envs.records import MODEL_OUTCOMES, PolicySpec, RetryPolicy, Termination
from gymfoundry.flows.factory import factory
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.episodes import run_episode
from tests.tasks.policy_endpoint import always, closed_port_url
from tests.verifiers.openai_stub import OpenAIStub, chat_reply
from gymfoundry.warehouse import Warehouse


def spec(base_url: str, retries: int = 1) -> PolicySpec:
    return PolicySpec(kind="openai", model="stub", base_url=base_url, max_retries=retries, timeout_s=5,
                      options={"retry_backoff_s": 0.0})


def test_the_default_retry_policy_retries_inference_faults():
    assert Termination.inference_fault in RetryPolicy().retry_on and Termination.inference_fault not in MODEL_OUTCOMES


@pytest.mark.usefixtures("prefect_harness")
def test_a_failing_endpoint_gives_inference_faults_retried_and_never_in_a_dataset(tmp_path):
    retry = RetryPolicy(max_retries=1, backoff_s=0.0)
    with OpenAIStub(respond=always(500)) as server:
        report = factory(families=["inventory"], tasks_per_family=3, samples_per_task=1, seed=6,
                         data_dir=str(tmp_path), policy=spec(server.base_url), retry=retry)
    run = report["run"]
    episodes = run["attempted"] // 2
    assert episodes >= 1 and run["by_class"] == {"inference_fault": 2 * episodes}
    assert run["retries"] == episodes and run["skips"] == episodes
    assert len(server.requests) == 2 * 2 * episodes  # the policy's own retry, within each of the run's attempts
    # no SFT row or DPO pair from a faulted attempt (GRPO rows are task prompts, no rollout in them)
    assert report["datasets"]["sft"]["rows"] == 0 and report["datasets"]["dpo"]["rows"] == 0
    with Warehouse(tmp_path, read_only=True) as wh:
        rows = wh.sql("select termination, termination_reason, attempt from rollouts").to_pylist()
    assert {r["termination"] for r in rows} == {"inference_fault"} and {r["attempt"] for r in rows} == {0, 1}
    assert all("HTTP 500" in r["termination_reason"] for r in rows)


def test_a_closed_port_and_429_are_inference_faults_after_bounded_retries():
    task = generate_tasks("inventory", 1, seed=3)[0]
    rollout = run_episode(task, make_policy(spec(closed_port_url(), retries=2), "inventory"), seed=1)
    assert rollout.termination == Termination.inference_fault and "after 3 request(s)" in rollout.termination_reason
    with OpenAIStub() as server:
        server.script.extend(["429"] * 3)
        rollout = run_episode(task, make_policy(spec(server.base_url, retries=2), "inventory"), seed=1)
    assert rollout.termination == Termination.inference_fault and len(server.requests) == 3


def test_context_length_rejection_truncates_and_other_400s_are_faults():
    task = generate_tasks("inventory", 1, seed=3)[0]
    full = {"error": {"message": "too long", "type": "invalid_request_error", "code": "context_length_exceeded"}}
    with OpenAIStub(respond=always(400, full)) as server:
        rollout = run_episode(task, make_policy(spec(server.base_url), "inventory"), seed=1)
    assert rollout.termination == Termination.truncated and len(server.requests) == 1  # not retried
    # the same words without the structured code are not read: an endpoint fault, conservatively
    prose = {"error": {"message": "This model's maximum context length is 4096 tokens", "code": 400}}
    with OpenAIStub(respond=always(400, prose)) as server:
        rollout = run_episode(task, make_policy(spec(server.base_url), "inventory"), seed=1)
    assert rollout.termination == Termination.inference_fault


def test_a_reply_that_is_no_tool_call_stays_a_model_outcome():
    task = generate_tasks("inventory", 1, seed=3)[0]
    with OpenAIStub(respond=lambda body, headers: (200, chat_reply("I think the answer is 42."))) as server:
        rollout = run_episode(task, make_policy(spec(server.base_url), "inventory"), seed=1)
    assert rollout.termination in MODEL_OUTCOMES and rollout.steps and rollout.steps[0].error
