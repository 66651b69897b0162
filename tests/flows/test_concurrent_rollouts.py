"""Many episodes in flight against an OpenAI-protocol server (tasks/rollout/engine.py): the CLI run the
issue names lands every rollout of `openai:stub` with dozens of requests in flight at once, the
rollouts are the ones a serial run collects, and a failing endpoint under concurrency still
gives inference faults only."""

from __future__ import annotations

import threading
import time

import pytest

from gymfoundry.envs.records import PolicySpec, RetryPolicy, Termination
from gymfoundry.flows.cli import main
from gymfoundry.tasks.rollout.engine import run_concurrently
from gymfoundry.tasks.ops.evaluate import evaluate_policy
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.retry import RetryExhausted, collect_with_retries
from tests.tasks.policy_endpoint import always, inventory_agent
from tests.verifiers.openai_stub import OpenAIStub
from gymfoundry.warehouse import Warehouse


def delayed(respond, delay_s: float):
    def reply(body, headers):
        time.sleep(delay_s)
        return respond(body, headers)
    return reply


def spec(base_url: str, concurrency: int) -> PolicySpec:
    return PolicySpec(kind="openai", model="stub", base_url=base_url, max_concurrency=concurrency, timeout_s=10,
                      max_retries=0)


@pytest.mark.usefixtures("prefect_harness")
def test_cli_run_lands_80_rollouts_with_dozens_of_requests_in_flight(tmp_path, capsys):
    data_dir = tmp_path / "data"
    with OpenAIStub(respond=delayed(inventory_agent, 0.3)) as server:
        code = main(["run", "--policy", "openai", "--model", "stub", "--base-url", server.base_url,
                     "--concurrency", "64", "--tasks", "40", "--samples", "2", "--data-dir", str(data_dir)])
    assert code == 0, capsys.readouterr().err
    assert server.max_in_flight >= 32
    with Warehouse(data_dir, read_only=True) as wh:
        rows = wh.sql("select policy_id, termination, count(*) n from rollouts group by all").to_pylist()
        tasks = wh.sql("select count(*) n from tasks").to_pylist()[0]["n"]
    assert tasks == 40
    assert sum(r["n"] for r in rows) == 80 and {r["policy_id"] for r in rows} == {"openai:stub"}
    assert not any(r["termination"] in ("inference_fault", "policy_error") for r in rows)
    # the stub's agent always looks once and submits: two requests per episode
    assert len(server.requests) == 160


def test_concurrent_rollouts_are_the_serial_ones_in_the_same_order():
    tasks = generate_tasks("inventory", 6, seed=11)
    with OpenAIStub(respond=delayed(inventory_agent, 0.05)) as server:
        serial = collect_with_retries(tasks, make_policy(spec(server.base_url, 1), "inventory"), 2, 3, RetryPolicy())
        assert server.max_in_flight == 1
        concurrent = collect_with_retries(tasks, make_policy(spec(server.base_url, 12), "inventory"), 2, 3,
                                          RetryPolicy())
        assert server.max_in_flight >= 6
        evaluated = evaluate_policy(tasks, make_policy(spec(server.base_url, 12), "inventory"), seed=3,
                                    samples_per_task=2)
    assert [r.rollout_id for r in concurrent] == [r.rollout_id for r in serial] and len(serial) == 12
    strip = lambda r: r.model_dump(exclude={"cost": {"wall_time_s"}, "steps": {"__all__": {"latency_s"}}})  # noqa: E731
    assert [strip(r) for r in concurrent] == [strip(r) for r in serial]
    assert len(evaluated) == 12 and all(r.termination != Termination.inference_fault for r in evaluated)


def test_a_failing_endpoint_under_concurrency_gives_only_inference_faults():
    tasks = generate_tasks("inventory", 5, seed=2)
    with OpenAIStub(respond=delayed(always(500), 0.05)) as server:
        rollouts = collect_with_retries(tasks, make_policy(spec(server.base_url, 8), "inventory"), 2, 1,
                                        RetryPolicy(max_retries=1, backoff_s=0.0))
    assert len(rollouts) == 20 and {r.termination for r in rollouts} == {Termination.inference_fault}
    assert [r.attempt for r in rollouts] == [0, 1] * 10 and server.max_in_flight >= 4


def test_on_exhausted_fail_stops_starting_episodes_and_keeps_those_in_flight():
    tasks = generate_tasks("inventory", 8, seed=2)
    with OpenAIStub(respond=delayed(always(500), 0.05)) as server:
        with pytest.raises(RetryExhausted, match="1 attempts ended in inference_fault") as failure:
            collect_with_retries(tasks, make_policy(spec(server.base_url, 4), "inventory"), 2, 1,
                                 RetryPolicy(max_retries=0, on_exhausted="fail"))
    kept = failure.value.rollouts
    assert 1 <= len(kept) < 16 and len(server.requests) == len(kept)  # the rest never started


class Counting:
    """A policy whose forks count how many act at once (no fork: played serially)."""

    policy_id, version = "counting", "1"

    def __init__(self, forkable: bool):
        self.lock, self.now, self.peak, self.forks = threading.Lock(), 0, 0, 0
        if forkable:
            self.fork = self._fork

    def _fork(self):
        with self.lock:
            self.forks += 1
        return self

    def play(self, agent, item):
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        time.sleep(0.02)
        with self.lock:
            self.now -= 1
        if item == "boom":
            raise ValueError("boom")
        return item * 2


def test_the_engine_bounds_what_is_in_flight_and_keeps_item_order():
    policy = Counting(forkable=True)
    assert run_concurrently(policy, list(range(40)), policy.play, concurrency=7) == [i * 2 for i in range(40)]
    assert policy.peak == 7 and policy.forks == 7
    serial = Counting(forkable=False)
    assert run_concurrently(serial, [1, 2, 3], serial.play) == [2, 4, 6] and serial.peak == 1
    with pytest.raises(ValueError, match="boom"):
        run_concurrently(policy, [1, "boom", 3], policy.play, concurrency=3)


def test_batches_of_a_serial_policy_in_one_process_take_turns_whole():
    """max_concurrency 1 holds per process: two batches played from two threads (as the thread
    task runner plays rollout batches) never interleave their episodes."""
    from concurrent.futures import ThreadPoolExecutor

    serial, order = Counting(forkable=False), []

    def play(agent, item):
        order.append(item[0])
        return serial.play(agent, item[1])

    batches = [[("a", i) for i in range(5)], [("b", i) for i in range(5)]]
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda items: run_concurrently(serial, items, play), batches))
    assert outs == [[0, 2, 4, 6, 8], [0, 2, 4, 6, 8]] and serial.peak == 1
    assert order in (["a"] * 5 + ["b"] * 5, ["b"] * 5 + ["a"] * 5)


def test_a_serial_play_may_play_the_same_policy_through_the_engine_again():
    """The slot a serial batch holds is its thread's: a nested call does not wait for itself."""
    serial = Counting(forkable=False)

    def outer(agent, item):
        return sum(run_concurrently(serial, [item, item + 1], serial.play))

    done = []
    worker = threading.Thread(target=lambda: done.append(run_concurrently(serial, [1, 2], outer)), daemon=True)
    worker.start()
    worker.join(10)
    assert done == [[6, 10]]
    # and the slot is free again: another thread's batch runs
    assert run_concurrently(serial, [3], serial.play) == [6]


def test_a_lone_episode_holds_one_of_the_process_slots():
    from concurrent.futures import ThreadPoolExecutor

    policy = Counting(forkable=True)
    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda i: run_concurrently(policy, [i], policy.play, concurrency=3), range(6)))
    assert outs == [[0], [2], [4], [6], [8], [10]] and policy.peak <= 3


@pytest.mark.usefixtures("prefect_harness")
def test_cli_evaluate_runs_held_out_episodes_concurrently_from_a_spec(tmp_path, capsys):
    data_dir = str(tmp_path / "data")
    assert main(["run", "--tasks", "30", "--samples", "1", "--data-dir", data_dir]) == 0
    with OpenAIStub(respond=delayed(inventory_agent, 0.1)) as server:
        code = main(["evaluate", "--policy", "openai", "--model", "stub", "--base-url", server.base_url,
                     "--concurrency", "16", "--samples", "2", "--data-dir", data_dir])
    out = capsys.readouterr().out
    assert code == 0 and "pass@2" in out
    with Warehouse(data_dir, read_only=True) as wh:
        heldout = wh.sql("select count(*) n from tasks where split in ('test', 'val')").to_pylist()[0]["n"]
        played = wh.sql("select count(*) n from rollouts where policy_id = 'openai:stub'").to_pylist()[0]["n"]
    assert heldout >= 2 and played == 2 * heldout and len(server.requests) == 2 * played
    assert server.max_in_flight == min(16, 2 * heldout)


@pytest.mark.usefixtures("prefect_harness")
def test_the_python_example_of_docs_models_runs_against_a_local_server(tmp_path, monkeypatch):
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    (snippet,) = re.findall(r"```python\n(.*?)```", doc, re.DOTALL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key-for-the-doc-example")
    with OpenAIStub(respond=inventory_agent) as server:
        code = snippet.replace("http://127.0.0.1:8000/v1", server.base_url).replace("tasks_per_family=200",
                                                                                      "tasks_per_family=40")
        exec(compile(code, "docs/models.md", "exec"), {})
    with Warehouse(tmp_path / ".gymfoundry", read_only=True) as wh:
        rows = wh.sql("select policy_id, count(*) n from rollouts group by 1").to_pylist()
    assert rows == [{"policy_id": "openai:Qwen/Qwen2.5-7B-Instruct", "n": rows[0]["n"]}] and rows[0]["n"] > 80
    assert all(h["Authorization"] == "Bearer sk-test-key-for-the-doc-example" for h in server.headers)
