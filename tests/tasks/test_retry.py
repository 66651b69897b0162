"""Failure taxonomy and retry policy under injected environment faults."""

from __future__ import annotations

from collections import defaultdict

import pytest

from gymfoundry import envs
from gymfoundry.envs.base import AgentEnv
from gymfoundry.envs.faults import FaultInjection
from gymfoundry.envs.records import (MODEL_OUTCOMES, Budget, FaultConfig, RetryPolicy, Rollout, Run, Termination, ToolCall,
                          content_hash)
from gymfoundry.envs.timestep import TimeStep
from gymfoundry.envs.wrappers import standard_stack
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.retry import RetryExhausted, collect_with_retries, run_counts
from gymfoundry.tasks.rollout.episodes import policy_params
from tests.envs.counter_env import CounterEnv, register



@pytest.fixture(autouse=True, scope="module")
def _counter_registered():
    """The counter env registered while these tests run, not when the module is imported: a
    registration at import time put it into the family lists other modules' tests are
    parametrized with when the whole suite is collected (test_fuzz, test_check_family)."""
    register("gymfoundry/counter-v0", CounterEnv)


def counter_episode(config: FaultConfig, seed: int, calls: list[ToolCall]):
    env = FaultInjection(envs.family("gymfoundry/counter-v0").make(), config, seed=seed)
    stack = standard_stack(env)
    task = CounterEnv.generate_task(3).model_dump(exclude={"task_id"})
    stack.reset(task={**task, "budget": {"max_steps": 50, "max_tool_calls": 50}})
    states = []
    for call in calls:
        stack.step(call)
        states.append(env.state()["value"])
    return env, stack.steps, states


def test_fault_injection_is_seeded_and_faults_change_nothing():
    calls = [ToolCall(name="add", arguments={"n": 1})] * 30
    config = FaultConfig(rate=0.3, seed=5)
    env, steps, values = counter_episode(config, seed=1, calls=calls)
    again, steps_again, _ = counter_episode(config, seed=1, calls=calls)
    assert env.injected == again.injected and [s.result for s in steps] == [s.result for s in steps_again]
    other, _, _ = counter_episode(config, seed=2, calls=calls)
    assert other.injected != env.injected
    faulted = {n for n, _ in env.injected}
    assert 3 <= len(faulted) <= 20 and {k for _, k in env.injected} == {"tool_crash", "timeout", "unavailable"}
    for step, value in zip(steps, values):
        assert (step.error == "env_fault") == (step.index in faulted)
    assert values[-1] == 30 - len(faulted)  # a faulted call changed no state
    messages = {step.result for step in steps if step.error}
    assert any("tool crashed: InjectedCrash" in m for m in messages)
    assert any("service unavailable" in m for m in messages) and any("timed out" in m for m in messages)
    none, _, _ = counter_episode(FaultConfig(rate=0.0), seed=1, calls=calls)
    assert none.injected == []


def test_fault_injection_wraps_any_env():
    class Echo(AgentEnv):
        touched = 0

        def reset(self, task=None, seed=None):
            return TimeStep("hi")

        def step(self, action):
            Echo.touched += 1
            return TimeStep("echo")

        @property
        def available_tools(self):
            return []

        def state(self):
            return {}

    env = FaultInjection(Echo(), FaultConfig(rate=1.0, kinds={"unavailable": 1.0}))
    env.reset()
    ts = env.step(ToolCall(name="anything"))
    assert ts.info["env_fault"] and "unavailable" in ts.observation and Echo.touched == 0
    assert env.step("not a tool call at all").observation == "echo"  # a malformed action meets no fault


def test_model_outcomes_are_never_retried():
    with pytest.raises(ValueError, match="never retried"):
        RetryPolicy(retry_on=[Termination.env_fault, Termination.constraint_violation])
    policy = RetryPolicy(backoff_s=0.5, backoff_factor=2, max_backoff_s=1.5)
    assert [policy.delay_s(k) for k in (1, 2, 3, 4)] == [0.5, 1.0, 1.5, 1.5]
    assert policy.delay_s(100_000) == 1.5  # 2 ** 99999 overflows a float: the cap, not a crashed run


def rollout(**fields):
    base = dict(task_id="t-1", family="inventory", env_id="gymfoundry/inventory-v0", env_version="0",
                policy_id="p", policy_version="1", seed=7, termination=Termination.success)
    return Rollout(**{**base, **fields})


def test_everything_that_changes_an_episode_is_in_its_identity():
    plain = rollout().rollout_id
    others = [rollout(faults=FaultConfig(rate=0.5)), rollout(faults=FaultConfig(rate=0.5, seed=1)),
              rollout(faults=FaultConfig(rate=0.5, timeout_s=2)), rollout(faults=FaultConfig(rate=0.2)),
              rollout(faults=FaultConfig(rate=0.5, kinds={"unavailable": 1.0})),
              rollout(policy_params={"temperature": 0.7}), rollout(policy_params={"max_new_tokens": 32}),
              rollout(limits=Budget(max_steps=5)), rollout(attempt=1), rollout(seed=8), rollout(policy_version="2")]
    ids = [r.rollout_id for r in others]
    assert plain not in ids and len(set(ids)) == len(ids)
    # what changes nothing is no new identity: a zero rate injects no fault, an outcome is content
    assert rollout(faults=FaultConfig(rate=0.0, seed=9)).rollout_id == plain
    assert rollout(faults=FaultConfig(rate=0.0)).faults is None
    assert rollout(termination=Termination.failure, termination_reason="x").rollout_id == plain
    assert plain == "r-" + content_hash(["t-1", "gymfoundry/inventory-v0", "0", "p", "1", 7, 0])  # ids of old dirs


def test_policy_knobs_are_read_from_the_policy():
    class Sampler:
        policy_id, version = "hf:m", "abc"
        temperature, max_new_tokens, system_prompt = 0.7, 64, "Be brief."

    params = policy_params(Sampler())
    assert params == {"temperature": 0.7, "max_new_tokens": 64, "system_prompt": content_hash("Be brief.")}
    assert policy_params(make_policy("scripted", "inventory", mistake_rate=0.2)) is None  # its version says it


def test_a_failed_run_says_why_and_is_not_the_completed_run():
    with pytest.raises(ValueError, match="error is required"):
        Run(params={}, retry_policy=RetryPolicy(), status="failed")
    failed = Run(params={}, retry_policy=RetryPolicy(), status="failed", error="boom")
    assert failed.run_id != Run(params={}, retry_policy=RetryPolicy()).run_id
    assert Run.model_validate({"params": {}, "retry_policy": {}, "status": None}).status == "completed"


@pytest.fixture(scope="module")
def faulty_run():
    tasks = generate_tasks("inventory", 12, seed=4)
    retry = RetryPolicy(max_retries=2, backoff_s=0.01, backoff_factor=3)
    delays: list[float] = []
    policy = make_policy("scripted", "inventory", mistake_rate=0.2)
    rollouts = collect_with_retries(tasks, policy, 2, 4, retry, FaultConfig(rate=0.2, seed=4), sleep=delays.append)
    return tasks, retry, rollouts, delays


def test_injected_faults_are_env_faults_never_model_failures(faulty_run):
    _, _, rollouts, _ = faulty_run
    faulted = [r for r in rollouts if any(s.error == "env_fault" for s in r.steps)]
    assert len(faulted) >= len(rollouts) // 3  # 20% of tool calls: most episodes meet a fault
    for r in faulted:  # whatever the verifier said: a faulted success would bias the success rate
        assert r.termination == Termination.env_fault, (r.termination, r.termination_reason)
    assert any(r.outcome is not None and r.outcome.success for r in faulted)
    for r in rollouts:
        if r.termination in MODEL_OUTCOMES:
            assert not any(s.error == "env_fault" for s in r.steps)
    assert {Termination.env_fault, Termination.success} <= {r.termination for r in rollouts}


def test_env_faults_are_retried_per_policy_with_backoff(faulty_run):
    tasks, retry, rollouts, delays = faulty_run
    attempts = defaultdict(list)
    for r in rollouts:
        attempts[(r.task_id, r.seed)].append(r)
    assert len(attempts) == len(tasks) * 2
    expected_delays = []
    for chain in attempts.values():
        assert [r.attempt for r in chain] == list(range(len(chain))) and len(chain) <= retry.max_retries + 1
        assert len({r.rollout_id for r in chain}) == len(chain)
        for earlier in chain[:-1]:
            assert earlier.termination == Termination.env_fault  # only env faults are retried
        expected_delays += [retry.delay_s(k) for k in range(1, len(chain))]
    assert delays == expected_delays and set(delays) <= {0.01, 0.03}
    assert any(len(chain) > 1 for chain in attempts.values())


def test_run_counts_add_up_to_rollouts_attempted(faulty_run):
    tasks, retry, rollouts, _ = faulty_run
    counts = run_counts(rollouts, retry)
    assert counts["attempted"] == len(rollouts) == sum(counts["by_class"].values())
    assert sum(counts["by_family"]["inventory"].values()) == len(rollouts)
    assert counts["retries"] == sum(r.attempt > 0 for r in rollouts) == len(rollouts) - len(tasks) * 2
    exhausted = [r for r in rollouts if r.attempt == retry.max_retries and r.termination == Termination.env_fault]
    assert counts["skips"] == len(exhausted) > 0


def test_fail_after_n_retries():
    tasks = generate_tasks("inventory", 3, seed=4)
    policy = make_policy("scripted", "inventory", mistake_rate=0.0)
    with pytest.raises(RetryExhausted, match="3 attempts ended in env_fault") as failure:
        collect_with_retries(tasks, policy, 1, 4, RetryPolicy(max_retries=2, on_exhausted="fail"),
                             FaultConfig(rate=1.0), sleep=lambda s: None)
    # what was collected up to the failure travels with it, for the factory to land
    assert [(r.task_id, r.attempt) for r in failure.value.rollouts] == [(tasks[0].task_id, k) for k in range(3)]


def test_factory_run_with_20_percent_faults_reports_every_rollout(tmp_path, prefect_harness):
    from gymfoundry.flows.factory import factory
    from gymfoundry.warehouse import Warehouse

    retry = RetryPolicy(max_retries=1, backoff_s=0.0)
    faults = FaultConfig(rate=0.2, seed=9)
    report = factory(families=["inventory"], tasks_per_family=8, seed=9, data_dir=str(tmp_path), retry=retry,
                     faults=faults)
    run = report["run"]
    assert run["attempted"] == sum(run["by_class"].values()) == report["landed"]["rollouts"]
    assert run["by_class"].get("env_fault", 0) > 0 and run["retries"] > 0
    with Warehouse(tmp_path, read_only=True) as wh:
        by_class = {r["termination"]: r["n"] for r in
                    wh.sql("select termination, count(*) as n from rollouts group by 1").to_pylist()}
        assert by_class == run["by_class"]
        (stored,) = wh.load("runs")
        faulty_model_failures = wh.sql("""
            select count(*) as n from rollouts r where termination in ('failure', 'constraint_violation', 'truncated')
            and exists (select 1 from steps s where s.rollout_id = r.rollout_id and s.error = 'env_fault')
        """).to_pylist()[0]["n"]
    assert faulty_model_failures == 0
    assert stored.retry_policy == retry and stored.faults == faults and stored.run_id == run["run_id"]
    assert stored.retries == run["retries"] and stored.skips == run["skips"]
