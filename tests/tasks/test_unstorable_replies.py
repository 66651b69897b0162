"""Values no record can store are the reply's fault, never a crash: an endpoint's token id outside
int64, a logprob that is no finite number or a lone surrogate makes its reply unreadable (an
`inference_fault`, no step keeps it); a number the model writes in its call is its own text, stored
as written (the env answers an integer beyond 64 bits with an error observation).
Behind that, a rollout holding such a value anyway (another policy kind) is quarantined at staging
with its reason and the rest of the run lands."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from gymfoundry.envs.records import MODEL_OUTCOMES, PolicySpec, RetryPolicy, Termination
from gymfoundry.flows.factory import factory
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.policies.base import PolicyOutput
from gymfoundry.tasks.policies.registry import make_policy, register_policy
from gymfoundry.tasks.rollout.episodes import run_episode
from tests.tasks.policy_endpoint import inventory_agent
from tests.verifiers.openai_stub import OpenAIStub
from gymfoundry.warehouse import Warehouse


def spec(base_url: str) -> PolicySpec:
    return PolicySpec(kind="openai", model="stub", base_url=base_url, max_retries=0, timeout_s=10,
                      options={"request_token_ids": True, "retry_backoff_s": 0.0})


def garbled(kind: str, value, first_only: bool = False):
    """The inventory agent's replies carrying `value` in the field `kind` names (only in the very
    first reply with `first_only`: one episode among several)."""
    lock, sent = threading.Lock(), []

    def respond(body, headers):
        status, payload = inventory_agent(body, headers)
        with lock:
            hostile = not (first_only and sent)
            sent.append(1)
        if not hostile:
            return status, payload
        choice = payload["choices"][0]
        call = choice["message"]["tool_calls"][0]["function"]
        if kind == "token_ids":
            choice["token_ids"] = [5, value]
        elif kind == "token_id_text":
            choice["logprobs"] = {"content": [{"token": f"token_id:{value}", "logprob": -0.5}]}
        elif kind == "logprob":
            choice["logprobs"] = {"content": [{"token": "x", "logprob": value}]}
        elif kind == "content":
            choice["message"]["content"] = value
        elif kind == "name":
            call["name"] = value
        elif kind == "arguments":
            call["arguments"] = json.dumps({"query": value})
        return status, payload
    return respond


@pytest.mark.parametrize("kind, value, why", [
    ("token_ids", 2**63, "token id 9223372036854775808 is outside int64"),
    ("token_ids", 2**64 + 5, "token id 18446744073709551621 is outside int64"),
    ("token_id_text", 2**63, "token id 9223372036854775808 is outside int64"),
    ("logprob", float("nan"), "logprob nan is no finite number"),
    ("logprob", float("-inf"), "logprob -inf is no finite number"),
    ("logprob", 10**400, "OverflowError: int too large to convert to float"),
    ("content", "thinking \udc80", r"a lone surrogate '\udc80' in the reply"),
    ("name", "find_\ud800items", r"a lone surrogate '\ud800' in the reply"),
    ("arguments", "cl\udfffamp", r"a lone surrogate '\udfff' in the reply"),
], ids=["id-2^63", "id-2^64+5", "token_id-text-2^63", "logprob-nan", "logprob-inf", "logprob-10^400",
        "surrogate-content", "surrogate-name", "surrogate-arguments"])
def test_an_unstorable_value_in_a_reply_is_an_inference_fault_and_no_step_keeps_it(kind, value, why, tmp_path):
    task = generate_tasks("inventory", 1, seed=3)[0]
    with OpenAIStub(respond=garbled(kind, value)) as server:
        rollout = run_episode(task, make_policy(spec(server.base_url), "inventory"), seed=1)
    assert rollout.termination == Termination.inference_fault
    assert why in rollout.termination_reason and "unreadable reply" in rollout.termination_reason
    assert rollout.steps == []  # no step took any of it
    with Warehouse(tmp_path) as wh:
        assert wh.land(tasks=[task], rollouts=[rollout]).checked() == {"tasks": 1, "rollouts": 1, "steps": 0}


def test_a_number_the_model_writes_in_its_call_is_stored_as_written(tmp_path):
    task = generate_tasks("inventory", 1, seed=3)[0]

    def respond(body, headers):
        status, payload = inventory_agent(body, headers)
        call = payload["choices"][0]["message"]["tool_calls"][0]["function"]
        call["arguments"] = json.dumps({**json.loads(call["arguments"]), "limit": 2**70})
        return status, payload

    with OpenAIStub(respond=respond) as server:
        rollout = run_episode(task, make_policy(spec(server.base_url), "inventory"), seed=1)
    # the env's answer to an integer its tools cannot take: an error observation, the model's outcome
    step = rollout.steps[0]
    assert rollout.termination in MODEL_OUTCOMES and step.tool_call is None and step.error == "invalid_arguments"
    assert "integer out of range (64 bits)" in step.result and '\\"limit\\": 1180591620717411303424' in step.action_text
    with Warehouse(tmp_path) as wh:
        assert wh.land(tasks=[task], rollouts=[rollout]).checked()["steps"] == len(rollout.steps)
        [stored] = wh.load_rollouts()
    assert stored.steps == rollout.steps


@pytest.mark.usefixtures("prefect_harness")
def test_a_2_63_token_id_from_the_endpoint_fails_that_episode_and_the_run_lands_the_rest(tmp_path):
    retry = RetryPolicy(max_retries=1, backoff_s=0.0)
    with OpenAIStub(respond=garbled("token_ids", 2**63, first_only=True)) as server:
        report = factory(families=["inventory"], tasks_per_family=4, samples_per_task=1, seed=6,
                         data_dir=str(tmp_path), policy=spec(server.base_url), retry=retry)
    run = report["run"]
    assert run["status"] == "completed" and run["by_class"]["inference_fault"] == 1 and run["retries"] == 1
    assert report["quarantined"] == []
    with Warehouse(tmp_path, read_only=True) as wh:
        rows = wh.sql("select task_id, termination, termination_reason, attempt from rollouts").to_pylist()
        runs = wh.sql("select run_id, status from runs").to_pylist()
    faulted = [r for r in rows if r["termination"] == "inference_fault"]
    assert len(faulted) == 1 and "token id 9223372036854775808 is outside int64" in faulted[0]["termination_reason"]
    # every episode landed: the faulted attempt and its retry, and each other task's episode
    assert len(rows) == run["attempted"] and len({r["task_id"] for r in rows}) == run["attempted"] - 1
    assert {(r["task_id"], r["attempt"]) for r in rows if r["termination"] != "inference_fault"} >= \
           {(faulted[0]["task_id"], 1)}
    assert runs == [{"run_id": run["run_id"], "status": "completed"}]


class HugeIds:
    """The family's scripted policy, its first episode reporting a token id outside int64: a policy
    kind with no check of its own, as a custom one may be."""

    def __init__(self, inner, episodes: list):
        self.inner, self.episodes = inner, episodes
        self.policy_id, self.version = "huge-ids", "1"

    def reset(self, seed=None):
        self.inner.reset(seed)
        self.episodes.append(self)
        self.first = self.episodes[0] is self

    def act(self, observation):
        out = self.inner.act(observation)
        text = out.text if isinstance(out, PolicyOutput) else out
        return PolicyOutput(text=text, token_ids=[2**63] if self.first else [7], logprobs=[-0.5])


@pytest.mark.usefixtures("prefect_harness")
def test_a_rollout_no_column_can_hold_is_quarantined_with_why_and_the_run_lands_the_rest(tmp_path):
    episodes: list = []
    register_policy("huge-ids", lambda s, family: HugeIds(make_policy("scripted", family), episodes))
    report = factory(families=["inventory"], tasks_per_family=4, samples_per_task=1, seed=6, data_dir=str(tmp_path),
                     policy=PolicySpec(kind="huge-ids", model="x"))
    run = report["run"]
    assert run["status"] == "completed" and len(report["quarantined"]) == 1
    [folder] = report["quarantined"]
    [failure] = json.loads((Path(folder) / "report.json").read_text())["failures"]
    assert (failure["table"], failure["column"], failure["expectation"]) == ("steps", "token_ids", "storable")
    assert "OverflowError" in failure["error"]
    refused_id = failure["meta"]["rollout_id"]
    kept = [json.loads(line) for line in (Path(folder) / "steps.jsonl").read_text().splitlines()]
    assert {s["rollout_id"] for s in kept} == {refused_id} and kept[0]["token_ids"] == [2**63]  # nothing lost
    with Warehouse(tmp_path, read_only=True) as wh:
        landed = [r["rollout_id"] for r in wh.sql("select rollout_id from rollouts").to_pylist()]
        runs = wh.sql("select run_id, quarantined from runs").to_pylist()
        held = wh.sql("select path, tables from quarantine").to_pylist()
    assert refused_id not in landed and len(landed) == run["attempted"] - 1 == len(episodes) - 1
    assert runs == [{"run_id": run["run_id"], "quarantined": [folder]}]
    assert held == [{"path": Path(folder).relative_to(tmp_path.resolve()).as_posix(),
                     "tables": ["rollouts", "step_scores", "steps"]}]
