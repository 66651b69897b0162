"""Wrappers that the runtime uses to enforce what rewards only discourage.

`standard_stack` builds the order the factory uses:
Recorder(TimeLimit(ToolBudget(PermissionGuard(ObservationTruncation(env))))).
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from envs.base import AgentEnv, render_error
from envs.errors import ErrorKind
from envs.parsing import ActionError, parse_action, storable_text
from envs.records import Budget, Step, TaskSpec, ToolCall, ToolCategory, make_step
from envs.timestep import TimeStep

TIMEOUT = ErrorKind.timeout.value  # the runtime's clock: the step's error kind and the termination


class Wrapper(AgentEnv):
    def __init__(self, env: AgentEnv):
        self.env = env

    def reset(self, task: TaskSpec | dict | None = None, seed: int | None = None) -> TimeStep:
        return self.env.reset(task=task, seed=seed)

    def step(self, action: ToolCall | dict | str) -> TimeStep:
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()

    @property
    def available_tools(self) -> list[dict[str, Any]]:
        return self.env.available_tools

    def state(self) -> dict[str, Any]:
        return self.env.state()

    @property
    def unwrapped(self) -> AgentEnv:
        return self.env.unwrapped

    @property
    def task(self) -> TaskSpec | None:
        return self.unwrapped.task

    @property
    def env_id(self) -> str:  # type: ignore[override]
        return self.unwrapped.env_id

    @property
    def version(self) -> str:  # type: ignore[override]
        return self.unwrapped.version


def _end(observation: str, termination: str, reason: str, info: dict | None = None) -> TimeStep:
    info = {**(info or {}), "termination": termination, "termination_reason": reason}
    return TimeStep(observation, 0.0, False, True, info)


class TimeLimit(Wrapper):
    """Step limit and wall-clock limits (per step and per episode), defaulting to the task's
    budget. A step that overruns is abandoned while it runs: the caller gets a truncated
    TimeStep at the deadline and the episode is over."""

    def __init__(self, env: AgentEnv, max_steps: int | None = None, step_timeout_s: float | None = None,
                 episode_timeout_s: float | None = None):
        super().__init__(env)
        self._limits = (max_steps, step_timeout_s, episode_timeout_s)
        self._over = False
        self._worker: StepWorker | None = None  # taken from the idle ones at the first step

    def reset(self, task=None, seed=None) -> TimeStep:
        ts = self.env.reset(task=task, seed=seed)
        budget = self.task.budget
        max_steps, step_timeout, episode_timeout = self._limits
        self.max_steps = max_steps if max_steps is not None else budget.max_steps
        self.step_timeout_s = step_timeout if step_timeout is not None else budget.step_timeout_s
        self.deadline = time.monotonic() + (episode_timeout if episode_timeout is not None
                                            else budget.episode_timeout_s)
        self.steps_taken = 0
        self._over = False
        return ts

    def close(self) -> None:
        if self._worker is not None:
            StepWorker.release(self._worker)
            self._worker = None
        self.env.close()

    def step(self, action) -> TimeStep:
        if self._over:
            raise RuntimeError("the episode is over; call reset()")
        timeout = min(self.step_timeout_s, self.deadline - time.monotonic())
        if timeout <= 0:
            self._over = True
            reason = "episode time limit reached"
            return _end(render_error(None, TIMEOUT, reason), TIMEOUT, reason,
                        {"error": {"kind": TIMEOUT, "message": reason}})
        if self._worker is None:
            self._worker = StepWorker.take()
        finished, ts = self._worker.run(lambda: self.env.step(action), timeout)
        self.steps_taken += 1
        if not finished:
            self._over = True
            self._worker = None  # it may still be running the abandoned step: never reused
            which = "step" if timeout == self.step_timeout_s else "episode"
            reason = f"{which} time limit of {timeout:.3g}s reached during the step"
            return _end(render_error(None, TIMEOUT, reason), TIMEOUT, reason,
                        {"error": {"kind": TIMEOUT, "message": reason}})
        if not ts.done and self.steps_taken >= self.max_steps:
            ts.truncated = True
            ts.info.update(termination="truncated", termination_reason=f"step limit {self.max_steps} reached")
        self._over = ts.done
        return ts


class StepWorker:
    """The thread that runs one env stack's steps, so that a step overrunning its deadline can be
    abandoned while it runs: the caller waits at most `timeout` and gets control back.

    One daemon thread serves the steps handed to it one at a time (starting a thread per step,
    or per episode, cost more than the steps: thread start-up waits for the OS scheduler). Its
    thread starts on the first step and ends when idle for `IDLE_S` (restarted on demand) or
    closed. A stack takes a worker with `take()` and hands it back with `release()` when it is
    closed, for the next stack to reuse; a worker that abandoned a step is never reused (the
    step may still be running in it): `run` reports it and the caller drops the worker. Each
    step runs in an empty `contextvars` context, as it would in a fresh thread."""

    IDLE_S = 2.0
    KEEP = 64  # idle workers kept for reuse (more concurrent stacks than this start their own)
    _idle: ClassVar[list[StepWorker]] = []
    _idle_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def take(cls) -> StepWorker:
        """An idle worker released by a closed stack, or a new one."""
        with cls._idle_lock:
            if cls._idle:
                return cls._idle.pop()
        return cls()

    @classmethod
    def release(cls, worker: StepWorker) -> None:
        """Hand `worker` back for reuse (the caller must not use it again); a worker that abandoned
        a step, or one more than `KEEP`, is closed instead."""
        if not worker.abandoned:
            with cls._idle_lock:
                if len(cls._idle) < cls.KEEP:
                    cls._idle.append(worker)
                    return
        worker.close()

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards _alive against the worker retiring when idle
        self._alive = False
        self._pid = os.getpid()  # a forked child has none of its parent's threads
        self.abandoned = False  # or closed: it runs nothing more

    def run(self, fn: Callable[[], TimeStep], timeout: float) -> tuple[bool, TimeStep | None]:
        """(True, fn()) if fn returned within `timeout` seconds, (False, None) if not; what fn
        raised is re-raised here."""
        if self.abandoned:
            raise RuntimeError("this worker was closed or abandoned a step; use a fresh one")
        if self._pid != os.getpid():
            self.__init__()  # in a forked child: a new queue, lock and thread of its own
        done = threading.Lock()
        done.acquire()
        box: dict[str, Any] = {}
        with self._lock:
            self._jobs.put((fn, box, done))
            if not self._alive:
                self._alive = True
                threading.Thread(target=self._serve, name="gymfoundry-step", daemon=True).start()
        try:
            finished = done.acquire(timeout=min(timeout, threading.TIMEOUT_MAX))
        except BaseException:  # interrupted while waiting (KeyboardInterrupt): the step runs on
            finished = False
            raise
        finally:
            if not finished:
                self.abandoned = True
                self._jobs.put(None)  # the worker ends as soon as the abandoned step returns, if ever
        if not finished:
            return False, None
        if "error" in box:
            raise box["error"]
        return True, box["value"]

    def close(self) -> None:
        """End the thread once it is idle; a closed worker runs nothing more."""
        self.abandoned = True
        self._jobs.put(None)

    def _serve(self) -> None:
        jobs = self._jobs
        while True:
            try:
                job = jobs.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if jobs.empty():  # run() puts under the lock: nothing is left unserved
                        self._alive = False
                        return
                continue
            if job is None:
                return
            fn, box, done = job
            try:
                box["value"] = contextvars.Context().run(fn)
            except BaseException as exc:  # re-raised in the caller's thread
                box["error"] = exc
            finally:
                done.release()


class ToolBudget(Wrapper):
    """Truncates the episode once the task's tool-call budget is spent. Only actions that
    parsed into a call count; malformed text counts against the step limit instead."""

    def __init__(self, env: AgentEnv, max_tool_calls: int | None = None):
        super().__init__(env)
        self._max = max_tool_calls

    def reset(self, task=None, seed=None) -> TimeStep:
        ts = self.env.reset(task=task, seed=seed)
        self.max_tool_calls = self._max if self._max is not None else self.task.budget.max_tool_calls
        self.tool_calls = 0
        return ts

    def step(self, action) -> TimeStep:
        ts = self.env.step(action)
        if ts.info.get("tool_call") is not None:
            self.tool_calls += 1
        if not ts.done and self.tool_calls >= self.max_tool_calls:
            ts.truncated = True
            ts.info.update(termination="truncated",
                           termination_reason=f"tool-call budget {self.max_tool_calls} spent")
        return ts


class PermissionGuard(Wrapper):
    """Refuses calls to tool categories that need approval unless `approver(call)` says yes
    (by default the env's own `approves(call)`: grants the agent obtained inside the world).
    A refused call never reaches the environment: state is untouched."""

    def __init__(self, env: AgentEnv, require_approval: set[ToolCategory] | None = None,
                 approver: Callable[[ToolCall], bool] | None = None):
        super().__init__(env)
        profile = env.unwrapped.profile
        self.require_approval = set(require_approval if require_approval is not None
                                    else profile.approval_required)
        self.approver = approver or getattr(env.unwrapped, "approves", None)

    def step(self, action) -> TimeStep:
        if not self.require_approval:
            return self.env.step(action)
        try:
            call = parse_action(action, self.task.budget.max_action_chars).call
            check = getattr(self.unwrapped, "_check_call", None)
            if check is not None:  # a call the env refuses anyway is an input error, not a permission
                check(call)
        except ActionError:
            return self.env.step(action)  # the env reports the malformed action itself
        category = self.unwrapped.profile.category(call.name)
        if category in self.require_approval and not (self.approver and self.approver(call)):
            message = f"{call.name} is a {category.value} action and needs approval, which was not given"
            info = {"tool_call": call, "thought": None, "env_fault": False, "env_bug": False,
                    "error": {"kind": ErrorKind.permission_denied.value, "message": message}}
            return TimeStep(render_error(call, ErrorKind.permission_denied.value, message), 0.0, False, False, info)
        return self.env.step(action)


class ObservationTruncation(Wrapper):
    def __init__(self, env: AgentEnv, max_chars: int = 4000):
        super().__init__(env)
        self.max_chars = max_chars

    def _cut(self, ts: TimeStep) -> TimeStep:
        if len(ts.observation) > self.max_chars:
            dropped = len(ts.observation) - self.max_chars
            ts.observation = ts.observation[: self.max_chars] + f"...[truncated {dropped} chars]"
        return ts

    def reset(self, task=None, seed=None) -> TimeStep:
        return self._cut(self.env.reset(task=task, seed=seed))

    def step(self, action) -> TimeStep:
        return self._cut(self.env.step(action))


class Recorder(Wrapper):
    """Records every step as a `Step` record, with latency and, when the policy gives them,
    sampled token ids, logprobs and the policy version (never rebuilt from text)."""

    def reset(self, task=None, seed=None) -> TimeStep:
        ts = self.env.reset(task=task, seed=seed)
        self.steps: list[Step] = []
        self.last = ts
        return ts

    def step(self, action, *, thought: str | None = None, token_ids: list[int] | None = None,
             logprobs: list[float] | None = None, policy_version: str | None = None) -> TimeStep:
        started = time.perf_counter()
        ts = self.env.step(action)
        latency = time.perf_counter() - started
        info = ts.info
        error = info.get("error")
        self.steps.append(make_step(
            index=len(self.steps), observation=self.last.observation,
            action_text=storable_text(action) if isinstance(action, str) else None,
            thought=storable_text(thought) if thought is not None else info.get("thought"),
            tool_call=info.get("tool_call"), result=ts.observation,
            error=error["kind"] if error else None, reward=ts.reward, latency_s=latency,
            token_ids=token_ids, logprobs=logprobs, policy_version=policy_version))
        self.last = ts
        return ts


def standard_stack(env: AgentEnv, *, approver: Callable[[ToolCall], bool] | None = None,
                   max_observation_chars: int = 4000, limits: Budget | None = None) -> Recorder:
    """`limits` replaces the task's budget for this episode (an evaluation's tighter cap): the
    runtime's limit changes, the task and its id do not (reset refuses an edited task)."""
    guarded = PermissionGuard(ObservationTruncation(env, max_observation_chars), approver=approver)
    if limits is None:
        return Recorder(TimeLimit(ToolBudget(guarded)))
    return Recorder(TimeLimit(ToolBudget(guarded, limits.max_tool_calls), limits.max_steps,
                              limits.step_timeout_s, limits.episode_timeout_s))
