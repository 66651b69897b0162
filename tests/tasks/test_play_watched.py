"""A batch of episodes played in one thread (tasks.rollout.scheduler.play_watched: collect_rollouts, the
engine's serial path, the retry loop's attempts) keeps every guarantee of one episode watched
alone: a step over its limit is cut off at its deadline and recorded as its episode's timeout
step, the play and the plays after it go on in a fresh thread and play exactly what each would
have played alone, and nothing the abandoned thread does afterwards reaches anything; errors,
results, `stop` and `contextvars` behave as the plain loop over the items did."""

from __future__ import annotations

import contextvars
import gc
import json
import threading
import time
from functools import partial

import pytest

from gymfoundry.envs.records import Budget, RetryPolicy, TaskSpec, Termination
from gymfoundry.envs.wrappers import Recorder, StepWorker, TimeLimit
from gymfoundry.tasks.rollout.engine import run_concurrently
from gymfoundry.tasks.rollout.episodes import collect_rollouts, episode, run_episode
from gymfoundry.tasks.rollout.retry import collect_with_retries
from gymfoundry.tasks.rollout.scheduler import _Lane, play_watched
from tests.envs.counter_env import CounterEnv, HeldSleep, register

ENV_ID = "gymfoundry/counter-v0"
LIMITS = Budget(step_timeout_s=0.3)
HANG_S = 1.2
VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_play_watched", default="unset")


@pytest.fixture(autouse=True, scope="module")
def _counter_registered():
    register(ENV_ID, CounterEnv)


HUNG: list[threading.Thread] = []  # threads that played a hanging step


@pytest.fixture(autouse=True)
def _hung_steps_return():
    """Each test leaves no abandoned thread behind (whose end would free objects during a later test)."""
    yield
    while HUNG:
        HUNG.pop().join(5)


def call(name: str, **arguments) -> str:
    return json.dumps({"name": name, "arguments": arguments})


class Script:
    """Plays by the task's target (read from the goal, "Reach N."): for target 3, one unit then a
    step that hangs `HANG_S` seconds, else the target at once and finish. Records (target, thread)
    of every turn."""

    policy_id, version = "test-script", "1"

    def __init__(self) -> None:
        self.turns: list[tuple[int, threading.Thread]] = []
        self.script: list[str] | None = None

    def reset(self, seed=None) -> None:
        self.script = None

    def act(self, observation: str) -> str:
        if self.script is None:
            self.target = int(observation.split()[1].rstrip("."))
            self.script = ([call("add", n=1), call("sleep", seconds=HANG_S), call("add", n=1)] if self.target == 3
                           else [call("add", n=self.target), call("finish")])
        self.turns.append((self.target, threading.current_thread()))
        if "sleep" in self.script[0] and self.script[0] != call("sleep", seconds=0.2):
            HUNG.append(threading.current_thread())
        return self.script.pop(0)


def played(rollout) -> dict:
    """The rollout without its clocks."""
    return rollout.model_dump(mode="json", exclude={"cost": {"wall_time_s"}, "steps": {"__all__": {"latency_s"}}})


@pytest.mark.timeout(120)  # a batch that waited for the held tool would hang
def test_a_step_over_its_limit_mid_batch_ends_its_episode_and_the_rest_play_on_in_a_fresh_thread(monkeypatch):
    held = HeldSleep(monkeypatch)
    tasks = [CounterEnv.generate_task(seed) for seed in range(6)]  # targets 1..6; target 3 hangs
    policy = Script()
    batch = play_watched([partial(episode, task, policy, 7, limits=LIMITS) for task in tasks])
    assert held.holding()  # cut off at 0.3 s while the tool still ran, not waited for
    assert [r.task_id for r in batch] == [t.task_id for t in tasks]
    assert [[s.error for s in r.steps] for r in batch] == [[None, None]] * 2 + [[None, "timeout"]] + [[None, None]] * 3
    assert [r.termination.value for r in batch] == ["verifier_error"] * 2 + ["env_fault"] + ["verifier_error"] * 3
    assert batch[2].termination_reason == ("environment fault: the environment's step time limit of 0.3s reached "
                                           "during the step")
    assert batch[2].steps[-1].latency_s >= 0.25  # waited for the 0.3 s deadline, not cut early (load only adds)
    threads = [thread for _, thread in policy.turns]
    assert [target for target, _ in policy.turns] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]
    assert len(set(threads[:6])) == 1 and len(set(threads[6:])) == 1 and threads[0] is not threads[6]
    assert threading.current_thread() not in threads
    hung = threads[4]
    # each episode played alone gives exactly the same rollouts
    assert [played(r) for r in batch] == [played(run_episode(t, Script(), 7, limits=LIMITS)) for t in tasks]
    held.end()  # the hung steps return in their abandoned threads, which then end ...
    assert hung in held.threads and not hung.is_alive()
    # ... having played and recorded nothing more
    assert len(policy.turns) == 12 and len(batch[2].steps) == 2 and batch[2].cost.steps == 2


def test_collect_rollouts_plays_its_batch_after_one_hand_off(monkeypatch):
    submitted = []
    submit = StepWorker.submit
    monkeypatch.setattr(StepWorker, "submit", lambda self, fn: submitted.append(fn) or submit(self, fn))
    tasks = [CounterEnv.generate_task(seed) for seed in (0, 1, 3)]
    rollouts = collect_rollouts(tasks, Script(), 2, 5)
    assert len(submitted) == 1
    assert [r.task_id for r in rollouts] == [t.task_id for t in tasks for _ in range(2)]
    assert [played(r) for r in rollouts] == [played(run_episode(t, Script(), r.seed)) for t, r in
                                             zip([t for t in tasks for _ in range(2)], rollouts)]


def test_an_evaluation_plays_its_batch_after_one_hand_off(monkeypatch):
    from gymfoundry.tasks.ops.evaluate import SLACK_STEPS, evaluate_policy, evaluation_budget

    submitted = []
    submit = StepWorker.submit
    monkeypatch.setattr(StepWorker, "submit", lambda self, fn: submitted.append(fn) or submit(self, fn))
    tasks = [CounterEnv.generate_task(seed) for seed in (0, 1, 2)]
    rollouts = evaluate_policy(tasks, Script(), seed=4, samples_per_task=2)
    assert len(submitted) == 1
    assert [r.task_id for r in rollouts] == [t.task_id for t in tasks for _ in range(2)]
    assert [played(r) for r in rollouts] == [
        played(run_episode(t, Script(), r.seed, limits=evaluation_budget(t, SLACK_STEPS)))
        for t, r in zip([t for t in tasks for _ in range(2)], rollouts)]


def test_the_retry_loop_goes_on_in_the_fresh_thread_after_each_overrun():
    def short(seed):
        task = CounterEnv.generate_task(seed)
        return TaskSpec.model_validate({**task.model_dump(exclude={"task_id"}), "budget": {"step_timeout_s": 0.3}})

    tasks = [short(seed) for seed in (1, 2, 4)]  # the second hangs at every attempt
    retry = RetryPolicy(max_retries=1, backoff_s=0, retry_on=[Termination.env_fault])
    policy = Script()
    rollouts = collect_with_retries(tasks, policy, 1, 3, retry)
    assert [(r.task_id, r.attempt, r.termination.value) for r in rollouts] == [
        (tasks[0].task_id, 0, "verifier_error"), (tasks[1].task_id, 0, "env_fault"), (tasks[1].task_id, 1, "env_fault"),
        (tasks[2].task_id, 0, "verifier_error")]
    threads = [thread for _, thread in policy.turns]
    assert [target for target, _ in policy.turns] == [2, 2, 3, 3, 3, 3, 5, 5]
    assert threads[2] is not threads[4] and threads[4] is not threads[6] and threads[0] is threads[2]
    alone = [run_episode(tasks[1], Script(), r.seed, attempt=r.attempt) for r in rollouts[1:3]]
    assert [played(r) for r in rollouts[1:3]] == [played(r) for r in alone]


def test_an_abandoned_step_that_returns_while_its_play_goes_on_touches_nothing():
    """The hung step of a job's first attempt returns while its retry still plays (in another
    thread): the abandoned thread must not resume the job, nor record or play anything."""

    class HangsOnce(Script):
        def act(self, observation):
            if self.script is None and "Reach 3." in observation and any(t == 3 for t, _ in self.turns):
                self.target, self.script = 3, [call("add", n=1)] + [call("sleep", seconds=0.2)] * 5 + [call("finish")]
            elif self.script is None and "Reach 3." in observation:
                self.target, self.script = 3, [call("add", n=1), call("sleep", seconds=0.8)]
            return super().act(observation)

    task = TaskSpec.model_validate({**CounterEnv.generate_task(2).model_dump(exclude={"task_id"}),
                                    "budget": {"step_timeout_s": 0.3}})
    policy = HangsOnce()
    rollouts = collect_with_retries([task], policy, 1, 3, RetryPolicy(max_retries=1, backoff_s=0,
                                                                      retry_on=[Termination.env_fault]))
    assert [(r.attempt, r.termination.value, [s.error for s in r.steps]) for r in rollouts] == [
        (0, "env_fault", [None, "timeout"]), (1, "verifier_error", [None] * 7)]
    threads = [thread for _, thread in policy.turns]
    assert len(threads) == 9 and threads[1] is threads[0] and set(threads[2:]) == {threads[2]} != {threads[0]}
    time.sleep(0.2)
    assert len(policy.turns) == 9 and not threads[0].is_alive()


def test_what_a_loop_raises_is_thrown_into_its_play_and_a_plays_error_ends_the_batch():
    env = Recorder(TimeLimit(CounterEnv()))
    ran = []

    def catching():
        try:
            yield env, lambda: 1 / 0
        except ZeroDivisionError:
            return "caught"

    def uncaught():
        yield env, lambda: {}["missing"]
        ran.append("after the loop")

    def later():
        ran.append("later")
        return "later"

    assert play_watched([catching, lambda: 5, catching, later]) == ["caught", 5, "caught", "later"]
    ran.clear()
    with pytest.raises(KeyError, match="missing"):
        play_watched([catching, uncaught, later])
    assert ran == []  # neither the rest of the failing play nor a later one ran


def test_contextvars_plays_share_a_copy_of_the_callers_loops_a_copy_of_theirs_steps_none():
    class Seeing(CounterEnv):
        def step(self, action):
            seen.append(("step", VAR.get()))
            VAR.set("set by a step")
            return super().step(action)

    seen: list[tuple] = []
    task = CounterEnv.generate_task(0)

    def play(n):
        env = Recorder(TimeLimit(Seeing()))
        seen.append(("play", n, VAR.get()))

        def loop():
            seen.append(("loop", n, VAR.get()))
            VAR.set(f"set by loop {n}")
            env.reset(task=task)
            env.step(call("read"))
            seen.append(("loop after its step", n, VAR.get()))

        yield env, loop
        seen.append(("after", n, VAR.get()))
        VAR.set(f"set by play {n}")

    token = VAR.set("caller")
    try:
        play_watched([partial(play, 1), partial(play, 2)])
        assert seen == [("play", 1, "caller"), ("loop", 1, "caller"), ("step", "unset"),
                        ("loop after its step", 1, "set by loop 1"), ("after", 1, "caller"),
                        ("play", 2, "set by play 1"), ("loop", 2, "set by play 1"), ("step", "unset"),
                        ("loop after its step", 2, "set by loop 2"), ("after", 2, "set by play 1")]
        assert VAR.get() == "caller"
    finally:
        VAR.reset(token)


def test_after_an_overrun_the_play_goes_on_with_the_context_it_had():
    seen = []

    def play(task):
        VAR.set(f"before {task.initial_state['target']}")
        rollout = yield from episode(task, Script(), 1, limits=LIMITS)
        seen.append((VAR.get(), rollout.termination.value, threading.current_thread()))

    play_watched([partial(play, CounterEnv.generate_task(seed)) for seed in (2, 0)])
    assert [s[:2] for s in seen] == [("before 3", "env_fault"), ("before 1", "verifier_error")]
    assert VAR.get() == "unset"


def test_the_serial_engine_keeps_stop_order_and_errors():
    class Serial:
        policy_id, version = "test-serial-lane", "1"

    stop = threading.Event()
    env = Recorder(TimeLimit(CounterEnv()))

    def play(agent, item):
        value = yield env, lambda: item * 10
        if item == 2:
            stop.set()
        return value

    assert run_concurrently(Serial(), [1, 2, 3, 4], play, stop) == [(True, 10), (True, 20), None, None]

    ran = []

    def failing(agent, item):
        ran.append(item)
        yield env, lambda: item
        if item == 2:
            raise ValueError(f"item {item}")
        return item

    with pytest.raises(ValueError, match="item 2"):
        run_concurrently(Serial(), [1, 2, 3], failing)
    assert ran == [1, 2]


def test_the_concurrent_engine_plays_each_item_watched_and_answers_in_item_order():
    class Forking(Script):
        def fork(self):
            return Forking()

    tasks = [CounterEnv.generate_task(seed) for seed in range(4)]  # the third hangs

    def play(agent, task):
        return (yield from episode(task, agent, 7, limits=LIMITS))

    rollouts = run_concurrently(Forking(), tasks, play, concurrency=3)
    assert [r.termination.value for r in rollouts] == ["verifier_error"] * 2 + ["env_fault", "verifier_error"]
    assert [played(r) for r in rollouts] == [played(run_episode(t, Script(), 7, limits=LIMITS)) for t in tasks]

    def failing(agent, task):
        rollout = yield from episode(task, agent, 7, limits=LIMITS)
        if rollout.termination.value == "env_fault" or task.goal == "Reach 4.":
            raise ValueError(task.goal)
        return rollout

    with pytest.raises(ValueError, match="Reach 3."):
        run_concurrently(Forking(), tasks, failing, concurrency=3)


class InterruptedOnceStarted(threading.Condition):
    """A condition whose wait raises KeyboardInterrupt once `started` is set (Ctrl-C while the
    caller watches an episode in progress); until then it waits 10 ms at a time."""

    def __init__(self, lock, started: threading.Event):
        super().__init__(lock)
        self.started = started

    def wait(self, timeout=None):
        if self.started.is_set():
            raise KeyboardInterrupt
        return super().wait(min(timeout, 0.01))


def test_interrupted_while_watching_the_playing_thread_stops_at_its_next_step():
    started = threading.Event()

    class Lane(_Lane):
        def __init__(self, plays):
            super().__init__(plays)
            self.cond = InterruptedOnceStarted(self.lock, started)

    task = CounterEnv.generate_task(6)  # target 7
    turns, ran = [], []

    class Slow:
        policy_id, version = "test-slow", "1"

        def reset(self, seed=None):
            pass

        def act(self, observation):
            turns.append(threading.current_thread())
            started.set()
            return call("sleep", seconds=0.05)

    closed = []

    def play():
        try:
            return (yield from episode(task, Slow(), 1))
        finally:
            closed.append(threading.current_thread())

    lane = Lane([play, lambda: ran.append("later")])
    with pytest.raises(KeyboardInterrupt):
        lane.watch()
    assert closed == [threading.current_thread()]  # the play (and its env) closed at once, here
    time.sleep(0.5)
    assert 1 <= len(turns) <= 2 and ran == []  # it stopped at the step after the interrupt, if not at that one
    assert not turns[0].is_alive() and closed == [threading.current_thread()]


def test_rollout_batches_play_with_what_existed_before_out_of_the_collectors_sight():
    """collect_rollouts and the engine run in tasks.rollout.collector.frozen_before (its own tests say what
    that guarantees): the episodes, in their own thread, play with the freeze in place."""
    frozen = []

    class Looking(Script):
        def act(self, observation):
            frozen.append(gc.get_freeze_count())
            return super().act(observation)

    class Serial:
        policy_id, version = "test-frozen", "1"

    assert gc.get_freeze_count() == 0
    collect_rollouts([CounterEnv.generate_task(0)], Looking(), 1, 0)
    run_concurrently(Serial(), [1], lambda agent, item: frozen.append(gc.get_freeze_count()))
    assert len(frozen) == 3 and all(n > 0 for n in frozen) and gc.get_freeze_count() == 0


class Stuck(CounterEnv):
    """A counter whose `sleep` tool hangs until `release` is set (a step hung past the batch)."""

    family = "stuck"

    release = threading.Event()

    def tool_sleep(self, state, seconds):
        self.release.wait(10)
        return {"slept": seconds}


def test_a_thread_abandoned_in_a_hung_step_holds_none_of_the_batch_once_it_is_played():
    """Review F1: the abandoned thread, still in its step after collect_rollouts returned, held the
    lane, and with it the batch's results, plays and context: every rollout stayed alive."""
    import weakref

    register("gymfoundry/stuck-v0", Stuck)
    tasks = [TaskSpec.model_validate({**CounterEnv.generate_task(seed).model_dump(exclude={"task_id"}),
                                      "family": "stuck", "env_id": "gymfoundry/stuck-v0", "budget": {"step_timeout_s": 0.3}})
             for seed in (2, 0, 1, 3)]  # the first hangs
    policy = Script()
    Stuck.release.clear()
    try:
        rollouts = collect_rollouts(tasks, policy, 1, 5)
        assert [r.termination.value for r in rollouts] == ["env_fault"] + ["verifier_error"] * 3
        hung = policy.turns[1][1]
        refs = [weakref.ref(r) for r in rollouts]
        del rollouts
        gc.collect()
        assert [r() for r in refs] == [None] * 4  # its own episode's rollout too (built in the fresh thread)
        assert hung.is_alive()  # still in the hung step
    finally:
        Stuck.release.set()


class SlowToMake(CounterEnv):
    """A counter that logs its calls; the second one made is slow to make (`made` counts them)."""

    family = "slowmake"

    made = 0
    maker: threading.Thread | None = None  # the thread that made the second
    log: list = []
    making = threading.Event()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        SlowToMake.made += 1
        self.no = SlowToMake.made
        if self.no == 2:
            SlowToMake.maker = threading.current_thread()
            SlowToMake.making.set()
            time.sleep(0.1)

    def reset(self, task=None, seed=None):
        self.log.append(f"env{self.no}.reset")
        return super().reset(task=task, seed=seed)

    def step(self, action):
        self.log.append(f"env{self.no}.step")
        return super().step(action)

    def close(self):
        self.log.append((f"env{self.no}.close", threading.current_thread()))
        super().close()


class Logged:
    policy_id, version = "test-logged", "1"

    def reset(self, seed=None):
        SlowToMake.log.append("policy.reset")

    def act(self, observation):
        SlowToMake.log.append("policy.act")
        return call("finish")


def test_interrupted_while_the_next_episode_is_set_up_its_play_is_closed_before_the_episode_starts():
    """Review F2: Ctrl-C while the playing thread set up the next episode (its env slow to make):
    the caller closed the play before (already over), and the thread went on to play the new
    episode (the policy reset and asked to act) and dropped its play unclosed."""
    register("gymfoundry/slowmake-v0", SlowToMake)
    SlowToMake.made, SlowToMake.log = 0, []
    SlowToMake.making.clear()

    class Lane(_Lane):
        def __init__(self, plays):
            super().__init__(plays)
            self.cond = InterruptedOnceStarted(self.lock, SlowToMake.making)

    tasks = [TaskSpec.model_validate({**CounterEnv.generate_task(seed).model_dump(exclude={"task_id"}),
                                      "family": "slowmake", "env_id": "gymfoundry/slowmake-v0"}) for seed in (0, 1)]
    ran = []
    lane = Lane([partial(episode, task, Logged(), 1) for task in tasks] + [lambda: ran.append("later")])
    with pytest.raises(KeyboardInterrupt):
        lane.watch()
    playing = SlowToMake.maker
    playing.join(2)  # abandoned: it ends once the play is closed
    assert not playing.is_alive() and playing is not threading.current_thread() and ran == []
    assert SlowToMake.log == ["policy.reset", "env1.reset", "policy.act", "env1.step", ("env1.close", playing),
                              ("env2.close", playing)]


def test_interrupted_as_the_playing_thread_starts_it_plays_nothing_more(monkeypatch):
    """An interrupt that reaches the caller while it starts the playing thread is one while
    watching: that thread is abandoned (it used to play the whole batch unwatched)."""
    release = threading.Event()
    stepped, played, jobs, threads = [], [], [], []
    submit = StepWorker.submit

    def interrupted(self, fn):
        jobs.append(submit(self, lambda: threads.append(threading.current_thread()) or fn()))
        monkeypatch.setattr(StepWorker, "submit", submit)
        raise KeyboardInterrupt

    monkeypatch.setattr(StepWorker, "submit", interrupted)
    env = Recorder(TimeLimit(CounterEnv()))

    def loop():
        env.reset(task=CounterEnv.generate_task(0))
        release.wait(2)
        stepped.append(env.step(call("read")))

    def first():
        played.append("first")
        try:
            yield env, loop
        finally:
            played.append("closed")

    with pytest.raises(KeyboardInterrupt):
        play_watched([first, lambda: played.append("second")])
    release.set()
    StepWorker.result(jobs[0])  # the thread's play, over
    threads[0].join(2)
    assert not threads[0].is_alive() and stepped == [] and played in ([], ["first", "closed"])


def test_a_play_may_reset_after_its_episode_a_context_variable_it_set_before_even_after_an_overrun():
    """Review F3: after an overrun the play went on in a copy of its context, so a token it had
    set before its episode could not be reset after it (ValueError: created in a different Context)."""
    seen = []

    def play(agent, task):
        token = VAR.set(task.goal)
        try:
            rollout = yield from episode(task, agent, 7, limits=LIMITS)
            seen.append(VAR.get())
            return rollout
        finally:
            VAR.reset(token)
            seen.append(VAR.get())

    rollouts = run_concurrently(Script(), [CounterEnv.generate_task(seed) for seed in (2, 0)], play)
    assert [r.termination.value for r in rollouts] == ["env_fault", "verifier_error"]
    assert seen == ["Reach 3.", "unset", "Reach 1.", "unset"] and VAR.get() == "unset"


def test_the_engine_plays_any_generator_a_play_returns():
    """Review F4, decided: run_concurrently plays a generator that `play` returns (evaluate_policy
    returns `episode(...)`), as its docstring says loudly; a result that is a generator is wrapped."""
    class Forking(Script):
        def fork(self):
            return Forking()

    def handed_on(agent, item):
        def play():
            return (yield Recorder(TimeLimit(CounterEnv())), lambda: item * 3)
        return play()

    def wrapped(agent, item):
        return [(x for x in [item, item])]

    for concurrency in (1, 2):
        assert run_concurrently(Forking(), [1, 2], handed_on, concurrency=concurrency) == [(True, 3), (True, 6)]
        assert [list(out[0]) for out in run_concurrently(Forking(), [1, 2], wrapped, concurrency=concurrency)] == [
            [1, 1], [2, 2]]
