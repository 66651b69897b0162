"""The per-step machinery made cheap keeps its guarantees: one step thread per env stack that is
abandoned (never reused) when a step overruns, and a state copy equal to deepcopy's."""

from __future__ import annotations

import contextvars
import copy
import threading
import time

import pytest

from gymfoundry.envs.base import copy_state
from gymfoundry.envs.records import ToolCall
from gymfoundry.envs.wrappers import StepWorker, TimeLimit, standard_stack
from tests.envs.counter_env import CounterEnv, HeldSleep, reward_at_target

WHERE: list[threading.Thread] = []
MARK: contextvars.ContextVar[str] = contextvars.ContextVar("mark", default="unset")


class WhereEnv(CounterEnv):
    """Records the thread each step ran in."""

    def step(self, action):
        WHERE.append(threading.current_thread())
        return super().step(action)


def test_steps_of_one_stack_share_one_thread_not_the_callers():
    WHERE.clear()
    env = TimeLimit(WhereEnv(outcome_fn=reward_at_target))
    env.reset(seed=2)
    for _ in range(3):
        env.step(ToolCall(name="read"))
    ts = env.step(ToolCall(name="add", arguments={"n": 3}))
    ts = env.step(ToolCall(name="finish"))
    assert ts.terminated and ts.reward == 1.0
    assert len(WHERE) == 5 and all(t is WHERE[0] for t in WHERE) and WHERE[0] is not threading.current_thread()
    env.close()


@pytest.mark.timeout(60)  # a step that waited for the held tool would hang
def test_an_overrunning_step_is_abandoned_and_the_next_episode_gets_a_fresh_thread(monkeypatch):
    WHERE.clear()
    held = HeldSleep(monkeypatch)
    env = TimeLimit(WhereEnv(), step_timeout_s=0.2)
    env.reset(seed=1)
    env.step(ToolCall(name="read"))
    hung = env._worker
    ts = env.step(ToolCall(name="sleep", arguments={"seconds": 1.0}))
    assert held.holding()  # the step came back at its deadline while the tool still ran
    assert ts.truncated and ts.info["termination"] == "env_fault" and ts.info["error"]["kind"] == "timeout"
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(ToolCall(name="read"))
    assert hung.abandoned and env._worker is None and hung not in StepWorker._idle
    with pytest.raises(RuntimeError, match="abandoned"):
        hung.run(lambda: None, 1.0)
    held.end()  # the hung step ends in its own thread; the env is reset only now
    env.reset(seed=1)
    ts = env.step(ToolCall(name="read"))
    assert not ts.done and ts.info["error"] is None
    assert len(WHERE) == 3 and WHERE[0] is WHERE[1] and WHERE[2] is not WHERE[0]
    env.close()


def test_a_closed_stack_hands_its_thread_to_the_next_one():
    WHERE.clear()
    for seed in (1, 2):
        env = TimeLimit(WhereEnv())
        env.reset(seed=seed)
        env.step(ToolCall(name="read"))
        env.close()
    assert len(WHERE) == 2 and WHERE[0] is WHERE[1]


def test_what_a_step_raises_reaches_the_caller_and_the_worker_serves_on():
    worker = StepWorker()

    def boom():
        raise KeyError("inside")

    with pytest.raises(KeyError, match="inside"):
        worker.run(boom, 1.0)
    assert worker.run(lambda: 7, 1.0) == (True, 7)
    worker.close()
    with pytest.raises(RuntimeError, match="closed"):
        worker.run(lambda: 7, 1.0)


@pytest.mark.timeout(60)
def test_each_step_runs_in_an_empty_context_and_an_idle_worker_ends_and_restarts(monkeypatch):
    monkeypatch.setattr(StepWorker, "IDLE_S", 0.05)
    worker = StepWorker()

    def set_mark():
        before = MARK.get()
        MARK.set("set by a step")
        return before, threading.current_thread()

    (_, (first, thread)), (_, (second, _)) = worker.run(set_mark, 1.0), worker.run(set_mark, 1.0)
    assert first == second == "unset"
    thread.join()  # idle for IDLE_S, it ends (were it to serve on, the test's timeout would end it)
    finished, (_, again) = worker.run(set_mark, 1.0)
    assert finished and again is not thread


def test_a_fault_rolls_the_state_back_exactly_including_the_event_log():
    from gymfoundry.envs.family import family

    fam = family("inventory")
    task = fam.generate(3, 3)
    env = standard_stack(fam.env(outcome_fn=None))
    env.reset(task=task)
    *work, _submit = task.hidden.reference
    for call in work[:2]:
        env.step(call)
    world = env.unwrapped
    before = copy.deepcopy(world._state)

    def broken(state, **args):
        state["catalog"].clear()
        state.setdefault("events", []).append({"seq": 99})
        raise RuntimeError("a bug after writing")

    world.tool_get_stock = broken
    ts = env.step(ToolCall(name="get_stock", arguments={"sku": "SKU-1"}))
    assert ts.info["env_bug"] is True and world._state == before
    env.close()


def test_copy_state_equals_deepcopy_and_keeps_sharing():
    shared = {"n": [1, 2]}
    value = {"a": shared, "b": shared, "t": (1, [2]), "k": {(1, 2): 3.5}, "f": -0.0, "z": None, "y": True}
    out = copy_state(value)
    assert out == value == copy.deepcopy(value)
    assert out["a"] is out["b"] and out["a"] is not shared and out["t"][1] is not value["t"][1]
    assert type(out["y"]) is bool and str(out["f"]) == "-0.0"
    unpicklable = {"fn": lambda: 1, "v": [1]}  # pickle refuses a lambda; deepcopy keeps it
    out = copy_state(unpicklable)
    assert out["fn"] is unpicklable["fn"] and out["v"] == [1] and out["v"] is not unpicklable["v"]


def test_a_forked_child_runs_steps_on_a_thread_of_its_own():
    import os

    env = TimeLimit(CounterEnv(), step_timeout_s=5)
    env.reset(seed=1)
    env.step(ToolCall(name="read"))  # the parent's thread now serves this stack
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if its step ran in time
        code = 1
        try:
            ts = env.step(ToolCall(name="add", arguments={"n": 1}))
            code = 0 if ts.info["error"] is None and not ts.truncated else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    env.close()


def test_a_wait_interrupted_in_the_caller_abandons_the_worker():
    import signal

    class Interrupt(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupt()

    previous = signal.signal(signal.SIGALRM, interrupt)
    worker = StepWorker()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(Interrupt):
            worker.run(lambda: time.sleep(0.5), 5.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert worker.abandoned  # its thread is still in the step: it must serve no other stack
    StepWorker.release(worker)
    assert worker not in StepWorker._idle


def test_a_replayable_world_undoes_a_crash_by_replay_without_copying_before_each_call(monkeypatch):
    """Inventory is `replayable`: no copy before each live call; a crash (here in a tool that ran
    earlier in the episode, shadowed for this one call as fault injection does) is undone by
    replaying the episode's calls, refusals included, with the class's own tools."""
    import gymfoundry.envs.base as base
    from gymfoundry.envs.family import family

    fam = family("inventory")
    task = next(t for t in (fam.generate(seed, 3) for seed in range(50))
                if sum(c.name == "reserve" for c in t.hidden.reference) >= 2)
    world = fam.env(outcome_fn=None)
    assert world.replayable
    env = standard_stack(world)
    env.reset(task=task)
    *work, _submit = task.hidden.reference
    copies = []
    real_copy = base.copy_state
    monkeypatch.setattr(base, "copy_state", lambda value: copies.append(1) or real_copy(value))
    env.step(ToolCall(name="release", arguments={"reservation_id": "R-9"}))  # refused: logged, kept
    for call in work[:-1]:
        env.step(call)
    assert copies == []
    before = copy.deepcopy(world._state)
    done = work[-1]
    assert done.name == "reserve" and any(c.name == "reserve" for c in work[:-1])  # that tool ran before

    def broken(state, **args):
        state["reservations"].clear()
        state["events"].append({"seq": 99})
        raise RuntimeError("a bug after writing")

    setattr(world, f"tool_{done.name}", broken)
    ts = env.step(done)
    assert ts.info["env_bug"] is True and world._state == before
    delattr(world, f"tool_{done.name}")
    ts = env.step(done)  # the episode goes on from the restored state
    assert ts.info["error"] is None or ts.info["error"]["kind"] != "env_bug"
    env.close()
