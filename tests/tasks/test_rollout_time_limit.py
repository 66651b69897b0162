"""A rollout's steps run in the episode's own thread, watched by the caller (tasks.rollout.scheduler.
run_watched): a step over its time limit is still cut off at its deadline, recorded as the
episode's timeout step, and nothing the abandoned thread does afterwards reaches the rollout."""

from __future__ import annotations

import json
import threading

import pytest

from gymfoundry.envs.records import Budget
from gymfoundry.envs.wrappers import Recorder, TimeLimit
from gymfoundry.tasks.rollout.episodes import run_episode
from gymfoundry.tasks.rollout.scheduler import run_watched
from tests.envs.counter_env import CounterEnv, HeldSleep, register

ENV_ID = "gymfoundry/counter-v0"


class Calls:
    """A policy that plays the given calls in order, counting its turns and their threads."""

    policy_id, version = "test-calls", "1"

    def __init__(self, *calls: dict):
        self.calls, self.turns, self.threads = [json.dumps(c) for c in calls], 0, set()

    def reset(self, seed=None):
        self.turns = 0

    def act(self, observation: str) -> str:
        self.threads.add(threading.current_thread())
        self.turns += 1
        return self.calls[min(self.turns - 1, len(self.calls) - 1)]


@pytest.mark.timeout(60)  # an episode that waited for the held tool would hang
def test_a_hanging_tool_is_cut_off_at_the_step_deadline_and_its_thread_changes_nothing_later(monkeypatch):
    held = HeldSleep(monkeypatch)
    register(ENV_ID, CounterEnv)
    task = CounterEnv.generate_task(3)
    policy = Calls({"name": "add", "arguments": {"n": 1}}, {"name": "sleep", "arguments": {"seconds": 1.5}},
                   {"name": "add", "arguments": {"n": 1}})
    rollout = run_episode(task, policy, seed=0, limits=Budget(step_timeout_s=0.3))
    assert held.holding()  # the rollout came back at the step's deadline while the tool still ran
    # the environment's time ran out: an environment fault, retried, never the model's outcome
    assert rollout.termination.value == "env_fault" and "step time limit" in rollout.termination_reason
    assert [s.error for s in rollout.steps] == [None, "timeout"] and policy.turns == 2
    assert rollout.steps[-1].latency_s >= 0.25  # waited for the 0.3 s deadline, not cut early (load only adds)
    assert threading.current_thread() not in policy.threads
    held.end()  # the hung step returns in its abandoned thread: nothing more is played or recorded
    assert policy.turns == 2 and len(rollout.steps) == 2


def test_an_episode_within_its_limits_plays_to_its_end():
    register(ENV_ID, CounterEnv)
    task = CounterEnv.generate_task(3)
    target = task.initial_state["target"]
    policy = Calls({"name": "add", "arguments": {"n": target}}, {"name": "finish", "arguments": {}})
    rollout = run_episode(task, policy, seed=0, limits=Budget(step_timeout_s=0.3, episode_timeout_s=5))
    assert [s.error for s in rollout.steps] == [None, None] and rollout.termination.value != "timeout"


def test_a_watched_loop_returns_or_raises_what_the_loop_does_and_other_stacks_play_in_the_caller():
    env = Recorder(TimeLimit(CounterEnv()))
    assert run_watched(env, lambda: 7) == (True, 7)
    try:
        run_watched(env, lambda: 1 / 0)
        raise AssertionError("the loop's error must reach the caller")
    except ZeroDivisionError:
        pass
    here = []
    assert run_watched(CounterEnv(), lambda: here.append(threading.current_thread())) == (True, None)
    assert here == [threading.current_thread()]


@pytest.mark.timeout(60)  # an episode that waited for the held tool would hang
def test_the_episode_limit_cuts_a_step_off_before_its_own_limit_on_the_agents_time(monkeypatch):
    held = HeldSleep(monkeypatch)
    register(ENV_ID, CounterEnv)
    policy = Calls({"name": "add", "arguments": {"n": 1}}, {"name": "sleep", "arguments": {"seconds": 1.5}})
    rollout = run_episode(CounterEnv.generate_task(4), policy, seed=0,
                          limits=Budget(step_timeout_s=30, episode_timeout_s=0.4))
    assert held.holding()  # cut off at the episode's deadline, long before the step's own 30 s
    held.end()
    # the step was within its own limit: the agent's sleep used the episode's time (counted)
    assert rollout.termination.value == "truncated"
    assert rollout.termination_reason.startswith("the episode's time ran out on the agent's own actions")
