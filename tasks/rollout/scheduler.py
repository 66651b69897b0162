"""The episode scheduler: a batch of episodes played one after another in one thread (`play_watched`),
each step's time limit enforced by the calling thread, which sleeps until the deadline of the step in
progress and abandons a step that overruns it (the stack's `TimeLimit` then ends the episode as it
would itself). `run_watched` plays one episode so. The env stack (TimeLimit, Recorder, StepWorker)
is envs/wrappers.py's; this module drives it for the rollout machinery."""

from __future__ import annotations

import contextvars
import math
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from functools import partial
from typing import Any

from gymfoundry.envs.base import AgentEnv
from gymfoundry.envs.wrappers import Recorder, StepWorker, TimeLimit


class Abandoned(BaseException):
    """Raised in a watched episode's thread by a step that returns after its watcher abandoned it:
    the stack has already ended the episode at the deadline (and the plays left go on in another
    thread), so nothing more of this thread's work may run or be recorded. A BaseException, so no
    `except Exception` of the episode's loop takes it for the env's or the policy's error."""


def run_watched(env: AgentEnv, loop: Callable[[], Any]) -> tuple[bool, Any]:
    """Run `loop()` (one episode of `env`: the policy's turns and the stack's `step` calls) with the
    time limit enforced during each step as `TimeLimit` enforces it, without handing every step to
    another thread: one play of `play_watched`. (True, loop()'s value) when it ends (what it raised
    is raised here); (False, ts) when a step overran its deadline: that step is abandoned while it
    runs, the stack has ended the episode as `TimeLimit` does (`Recorder` recorded the overrun
    step) and `ts` is what `step` returned. `env` is `TimeLimit(...)` or `Recorder(TimeLimit(...))`
    (the standard stack); any other stack runs `loop()` in this thread (its TimeLimit, if any,
    hands each step over)."""
    if _watched(env)[0] is None:
        return True, loop()

    def play():
        return (yield env, loop)

    return play_watched([play])[0]


def _watched(env: AgentEnv) -> tuple[TimeLimit | None, Recorder | None]:
    """The TimeLimit and the Recorder (if any) of `TimeLimit(...)` or `Recorder(TimeLimit(...))`;
    (None, None) for another stack."""
    recorder = env if type(env) is Recorder else None
    limit = recorder.env if recorder is not None else env
    return (limit, recorder) if type(limit) is TimeLimit else (None, None)


def play_watched(plays: Iterable[Callable[[], Any]]) -> list[Any]:
    """Each `play()`'s result, in order, the plays run one after another in one `StepWorker` thread
    while this thread sleeps until the deadline of the step in progress. A play that returns a
    generator is played: each `(env, loop)` it yields is one episode whose loop runs at once in
    that thread, steps inline, its time limit enforced as `run_watched` says, and the generator
    gets back (True, loop()'s value), or what the loop raised thrown in, or (False, ts) when a step
    overran: the episode has ended with the stack's end for the overrun, its thread is abandoned while
    the step runs (`Abandoned` there if it ever returns), and the play, then the plays left, go on
    in a fresh thread. What the generator returns is the play's result. The first error a play
    raises is raised here; the plays after it do not run. Interrupted while watching (Ctrl-C),
    this thread closes the play whose episode is in progress (its env with it) and re-raises; the
    playing thread stops at its next step, or, if it was running a play's own code (setting up its
    next episode), closes that play as soon as the code yields, before the episode starts. So a
    batch of episodes costs one hand-off to another thread, not one each (the wake-ups cost more
    than a short episode's steps). Once this returns (or raises), a thread abandoned in a step
    that has not returned holds only its own episode (its play, stack and loop), not the batch.

    The plays run in one copy of this thread's `contextvars` context (the same one, entered by
    the fresh thread, after an overrun: a token a play set before an episode resets after it),
    each loop in a copy of that context as the loop starts, each step in an empty one. The
    watcher wakes only at the end, when a step's deadline comes before the time it meant to look
    next (once a batch, or for a step with a shorter limit), and at that time."""
    lane = _Lane(plays)
    return lane.watch()


class _Lane:
    """The state `play_watched` shares between the watching thread and the playing ones. A playing
    thread touches the batch (its plays, results, context) only under the lock while it still plays
    (`thread`), and `watch` lets go of all of it when it ends, so that a thread abandoned in a hung
    step, which holds this lane, holds nothing more of the batch than its own episode."""

    def __init__(self, plays: Iterable[Callable[[], Any]]):
        self.lock = threading.Lock()  # taken directly by each step (cheaper than the condition's)
        self.cond = threading.Condition(self.lock)
        self.plays: Iterator[Callable[[], Any]] | None = iter(plays)
        self.context: contextvars.Context | None = contextvars.copy_context()  # the plays'
        self.results: list[Any] | None = []
        self.shift = 0  # the number of the thread allowed to play (one more on each abandonment)
        self.thread: int | None = None  # the ident of the thread playing now; None once abandoned
        self.play: Generator | None = None  # the play suspended at the episode in progress
        self.episode: AgentEnv | None = None  # that episode's stack
        self.sent: Any = None  # what a fresh thread resumes `play` with (after an overrun)
        self.step: tuple[float, float, str] | None = None  # (deadline, timeout, kind) of the call in progress
        self.timeout = math.inf  # the time limit of the last call that started
        self.wake_at = math.inf  # when the watcher looks next (it sleeps until then)
        self.done = False
        self.error: BaseException | None = None

    def watch(self) -> list[Any]:
        """In the calling thread: start the plays, watch their steps until they are all played."""
        worker = StepWorker.take()
        try:  # from the start: an interrupt as the thread starts is one while watching
            job = worker.submit(partial(self._play_on, self.shift))
            while True:
                with self.cond:
                    while not self.done:
                        now = time.monotonic()
                        if self.step is not None and now >= self.step[0]:
                            break
                        # between steps: the next one's deadline, if its limit is the last one's
                        self.wake_at = self.step[0] if self.step is not None else now + self.timeout
                        self.cond.wait(min(max(self.wake_at - now, 0.0), threading.TIMEOUT_MAX))
                    if self.done:
                        break
                    _, timeout, kind = self.step
                    self._abandon()
                worker.abandon()  # its thread ends when the abandoned call returns, if ever
                limit, recorder = _watched(self.episode)
                ts = limit.overran(timeout, kind)
                if recorder is not None and kind in ("step", "verdict"):  # the step in progress ends here
                    ts = recorder.finish(ts)
                self.sent = (False, ts)
                worker = StepWorker.take()  # a fresh thread resumes `self.play` with `self.sent`
                job = worker.submit(partial(self._play_on, self.shift))
        except BaseException:  # interrupted while watching: the playing thread stops at its next step
            with self.cond:
                self._abandon()
                play, self.play = self.play, None
            worker.abandon()
            try:
                if play is not None:  # suspended at its episode (none of its code runs): closed here
                    self.context.run(play.close)
            finally:
                self._let_go()
            raise
        StepWorker.result(job)
        StepWorker.release(worker)
        results, error = self.results, self.error
        self._let_go()
        if error is not None:
            raise error
        return results

    def _let_go(self) -> None:
        """Drop the batch: a thread abandoned in a step that has not returned still holds this lane."""
        self.plays = self.context = self.results = self.play = self.episode = self.sent = self.error = None

    def _abandon(self) -> None:
        """(Holding the lock.) The thread playing now plays nothing more."""
        self.shift += 1
        self.thread = self.step = None

    def _play_on(self, shift: int) -> None:
        """(In a fresh thread.) Play on: `self.play` (if any) resumed with `self.sent`, then the plays
        left, unless the watcher gave up on this thread before it started."""
        me = threading.get_ident()
        with self.lock:
            if self.shift != shift:  # abandoned before it started (interrupted)
                return
            self.thread = me
            play, value, self.sent = self.play, self.sent, None
        error: BaseException | None = None  # what the last loop raised, thrown into its play
        failed: BaseException | None = None
        try:
            while True:
                if play is None:
                    with self.lock:
                        start = next(self.plays, None) if self.thread == me else None
                    if start is None:
                        break
                    out = self._context(me).run(start)
                    if not isinstance(out, Generator):
                        self._keep(me, out)
                        continue
                    play, value = out, None
                resume, arg = (play.throw, error) if error is not None else (play.send, value)
                error = None
                try:
                    env, loop, context = self._resume(me, play, resume, arg)
                except StopIteration as end:
                    self._keep(me, end.value)
                    play = None
                    continue
                try:
                    value = True, self._episode(env, loop, context)
                except BaseException as exc:  # thrown into the play (unless this thread was abandoned)
                    error = exc
        except BaseException as exc:  # Abandoned, or a play's error (the batch's if this thread plays)
            failed = exc
        with self.cond:
            if self.thread == me:
                self.error, self.done = failed, True
                self.cond.notify()

    def _context(self, me: int) -> contextvars.Context:
        """(In the playing thread, before running a play's code.) The plays' context; `Abandoned` if
        this thread plays no more. The play suspended at its episode (if any) is this thread's again."""
        with self.lock:
            if self.thread != me:
                raise Abandoned()
            self.play = None
            return self.context

    def _resume(self, me: int, play: Generator, resume: Callable[[Any], tuple], arg: Any) -> tuple:
        """`resume(arg)` (`play`'s send or throw) in the plays' context: the stack and loop of the
        episode it yields, and a copy of the context for the loop; `Abandoned` if this thread plays
        no more, before or after (then, interrupted meanwhile, `play` is closed here: no other
        thread resumes it)."""
        context = self._context(me)
        env, loop = context.run(resume, arg)
        with self.lock:
            if self.thread == me:
                self.play, self.episode = play, env
                return env, loop, context.copy()
        context.run(play.close)
        raise Abandoned()

    def _keep(self, me: int, result: Any) -> None:
        """A play's result, kept unless this thread plays no more."""
        with self.lock:
            if self.thread == me:
                self.results.append(result)

    def _episode(self, env: AgentEnv, loop: Callable[[], Any], context: contextvars.Context) -> Any:
        """Run one episode's loop here in `context`, its steps watched (through its TimeLimit's `_watch`)."""
        limit = _watched(env)[0]
        if limit is None:
            return context.run(loop)
        limit._watch = self
        try:
            return context.run(loop)
        finally:
            limit._watch = None

    def run_step(self, fn: Callable[[], Any], timeout: float, kind: str = "step") -> Any:
        """`fn()` (a step of the episode's stack, or grading: `TimeLimit._timed`'s `kind`) in this
        thread, in an empty `contextvars` context (as in a thread of its own), under the watcher's
        eye: `Abandoned` if the watcher gave up on this thread meanwhile."""
        me = threading.get_ident()
        deadline = time.monotonic() + timeout
        with self.lock:
            if self.thread != me:
                raise Abandoned()
            self.step, self.timeout = (deadline, timeout, kind), timeout
            if deadline < self.wake_at:  # the watcher sleeps past this deadline (a batch's first step)
                self.cond.notify()
        try:
            ts = contextvars.Context().run(fn)
        except BaseException:
            if self._end_step(me):
                raise Abandoned() from None
            raise
        if self._end_step(me):
            raise Abandoned()
        return ts

    def _end_step(self, me: int) -> bool:
        """Leave the step; whether the watcher abandoned this thread meanwhile."""
        with self.lock:
            if self.thread != me:
                return True
            self.step = None
            return False
