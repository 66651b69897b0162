"""Wrappers that the runtime uses to enforce what rewards only discourage.

`standard_stack` builds the order the factory uses:
Recorder(TimeLimit(ToolBudget(PermissionGuard(ObservationTruncation(env))))).
"""

from __future__ import annotations

import contextvars
import math
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from gymfoundry.envs.base import AgentEnv, ToolEnv, render_error
from gymfoundry.envs.errors import ErrorKind
from gymfoundry.envs.parsing import ActionError, parse_action, storable_text
from gymfoundry.envs.records import Budget, Step, TaskSpec, ToolCall, ToolCategory, make_step
from gymfoundry.envs.timestep import OUTCOME, TERMINATION, TERMINATION_REASON, VERIFIER_ERROR, TimeStep

TIMEOUT = ErrorKind.timeout.value  # a clock of the runtime ran out (the step's error kind)
TOKEN_BUDGET = ErrorKind.token_budget.value
# Whose time ran out, as the episode's end says it (`TimeStep.end.clock`, read by tasks.rollout.classify).
ENV_FAULT, GRADER_FAULT, TRUNCATED = "env_fault", "grader_fault", "truncated"


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
    ts = TimeStep(observation, 0.0, False, True, {**(info or {})})
    ts.end_by(termination, reason)
    return ts


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)


class TimeLimit(Wrapper):
    """The episode's limits (defaulting to the task's budget), each charged to whoever spent it:

    - steps: past `max_steps` the episode is `truncated`.
    - the environment's time: each step within `step_timeout_s`, all steps together within
      `episode_timeout_s`. A step past either is abandoned while it runs and the caller gets the
      episode's end at the deadline. One step past its own limit is an environment fault
      (`env_fault`: retried, out of every statistic): the world hung, not the agent's doing. Steps
      that each finished within it but together used up the episode's time ran the agent's own
      actions (its commands, its sleeps): the episode ends `truncated`, a model outcome, so no
      agent leaves the statistics through the environment's clock.
    - the agent's own time: whatever passes outside the steps and the grading (a policy thinking,
      a harness between its calls), within `episode_timeout_s`; `deadline` is when it runs out
      (each step and grading moves it later by what they took, and `act` by what the policy
      reports it waited on failed inference: `inference_wait_s`). Past it, the next step is not
      run and the episode ends `truncated`, a model outcome: stalling never takes an attempt out
      of the statistics.
    - tokens, where the policy reports them (`step(action, tokens=n)`, as `Recorder` passes them):
      a turn over `max_turn_tokens`, or the episode over `max_episode_tokens`, is not run and the
      episode ends `truncated`.
    - grading: the verdict of the step that ends the episode (the env leaves it to this wrapper:
      `ToolEnv.defer_grading`) and whatever `grading(fn)` runs (the live progress potential, a
      verdict after the episode) get `grade_timeout_s` each, on a clock of their own, outside the
      two above. Past it, a grader fault (`grader_fault`: retried, out of every statistic), never
      the agent's."""

    GRADE_TIMEOUT_S = 120.0  # the grader's time per call where neither the limits nor the task say

    def __init__(self, env: AgentEnv, max_steps: int | None = None, step_timeout_s: float | None = None,
                 episode_timeout_s: float | None = None, *, max_turn_tokens: int | None = None,
                 max_episode_tokens: int | None = None, grade_timeout_s: float | None = None):
        super().__init__(env)
        self._limits = (max_steps, step_timeout_s, episode_timeout_s, max_turn_tokens, max_episode_tokens,
                        grade_timeout_s)
        self._over = False
        self._worker: StepWorker | None = None  # taken from the idle ones at the first step
        self._watch: Any = None  # set by the episode scheduler (`play_watched`) for its episode in progress
        self._graded: TimeStep | None = None  # the step whose verdict is being computed

    def reset(self, task=None, seed=None) -> TimeStep:
        ts = self.env.reset(task=task, seed=seed)
        budget = self.task.budget
        max_steps, step_timeout, episode_timeout, turn_tokens, episode_tokens, grade_timeout = self._limits
        self.max_steps = _first(max_steps, budget.max_steps)
        self.step_timeout_s = _first(step_timeout, budget.step_timeout_s)
        self.episode_timeout_s = _first(episode_timeout, budget.episode_timeout_s)
        self.max_turn_tokens = _first(turn_tokens, budget.max_turn_tokens, math.inf)
        self.max_episode_tokens = _first(episode_tokens, budget.max_episode_tokens, math.inf)
        self.grade_timeout_s = _first(grade_timeout, budget.grade_timeout_s, self.GRADE_TIMEOUT_S)
        self.env_time_left_s = self.episode_timeout_s
        self.deadline = time.monotonic() + self.episode_timeout_s
        self.steps_taken = self.tokens = 0
        self._over = False
        self._graded = None
        if isinstance(self.unwrapped, ToolEnv):
            self.unwrapped.defer_grading = True  # the verdict runs on the grader's clock (`_grade`)
        return ts

    def close(self) -> None:
        if self._worker is not None:
            StepWorker.release(self._worker)
            self._worker = None
        self.env.close()

    def step(self, action, tokens: int | None = None) -> TimeStep:
        if self._over:
            raise RuntimeError("the episode is over; call reset()")
        if time.monotonic() >= self.deadline:
            return self._refuse(TIMEOUT, f"the policy's own time ran out: its time limit of "
                                         f"{self.episode_timeout_s:.3g}s (outside the environment's steps and "
                                         "grading) was reached; this action was not run")
        if tokens is not None:
            self.tokens += tokens
            if tokens > self.max_turn_tokens:
                return self._refuse(TOKEN_BUDGET, f"the policy's turn of {tokens} tokens is over its budget of "
                                                  f"{self.max_turn_tokens} per turn; this action was not run")
            if self.tokens > self.max_episode_tokens:
                return self._refuse(TOKEN_BUDGET, f"the policy's {self.tokens} tokens are over its budget of "
                                                  f"{self.max_episode_tokens} per episode; this action was not run")
        timeout = min(self.step_timeout_s, self.env_time_left_s)
        if timeout <= 0:
            return self.overran(0.0)
        finished, ts = self._timed(lambda: self.env.step(action), timeout, "step")
        if not finished:
            return ts
        self.steps_taken += 1
        if ts.info.get("grade_pending"):
            ts = self._grade(ts)
            if self._over:
                return ts
        if not ts.done and self.steps_taken >= self.max_steps:
            ts.end_by(TRUNCATED, f"step limit {self.max_steps} reached")
        self._over = ts.done
        return ts

    def grading(self, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """(True, fn()) with `fn` (grader work: the live progress potential, a verdict asked after
        the episode) run on the grader's clock, outside the agent's; (False, the episode's end, a
        grader fault) when it ran past `grade_timeout_s`. In a watched episode the watcher ends it."""
        return self._timed(fn, self.grade_timeout_s, "grade")

    def _grade(self, ts: TimeStep) -> TimeStep:
        """The verdict of the step `ts` that ended the episode, on the grader's clock."""
        self._graded = ts
        _, graded = self._timed(lambda: self.unwrapped.grade(ts), self.grade_timeout_s, "verdict")
        self._graded = None
        return graded

    def _timed(self, fn: Callable[[], Any], timeout: float, kind: str) -> tuple[bool, Any]:
        """(True, fn()) if it returned within `timeout`, else (False, `overran(timeout, kind)`): run
        under the watcher's eye in a watched episode, else handed to this stack's worker thread. The
        time it took is not the agent's: the agent's deadline moves by it, and a step's comes off
        the environment's time."""
        started = time.monotonic()
        try:
            watch = self._watch
            if watch is not None:  # the watcher ends the episode itself (Abandoned here) if fn overruns
                return True, watch.run_step(fn, timeout, kind)
            if self._worker is None:
                self._worker = StepWorker.take()
            finished, value = self._worker.run(fn, timeout)
            if not finished:
                self._worker = None  # it may still be running the abandoned call: never reused
                return False, self.overran(timeout, kind)
            return True, value
        finally:
            spent = time.monotonic() - started
            self.deadline += spent
            if kind == "step":
                self.env_time_left_s -= spent

    def _refuse(self, kind: str, reason: str) -> TimeStep:
        """The end of an episode whose agent ran out of its own time or tokens: that action is not run."""
        self._over = True
        return _end(render_error(None, kind, reason), TRUNCATED, reason, {"error": {"kind": kind, "message": reason}})

    def overran(self, timeout: float, kind: str = "step") -> TimeStep:
        """The episode's end when the call in progress (`kind`: a "step", the "verdict" of the step
        that ended the episode, other "grade" work), given `timeout` seconds, is abandoned."""
        self._over = True
        if kind == "step":
            self.steps_taken += 1
            if timeout == self.step_timeout_s:  # this one step hung past its own limit
                reason = (f"environment fault: the environment's step time limit of {timeout:.3g}s reached during "
                          "the step")
                return _end(render_error(None, TIMEOUT, reason), ENV_FAULT, reason,
                            {"error": {"kind": TIMEOUT, "message": reason}})
            reason = (f"the episode's time ran out on the agent's own actions: the environment's time running them "
                      f"reached the episode's limit of {self.episode_timeout_s:.3g}s")
            return _end(render_error(None, TIMEOUT, reason), TRUNCATED, reason,
                        {"error": {"kind": TIMEOUT, "message": reason}})
        reason = f"grader fault: grading ran past its {timeout:.3g}s budget"
        if kind == "verdict":  # the step stands as the world answered it; its verdict never came
            ended = self._graded
            info = {k: v for k, v in ended.info.items() if k not in ("grade_pending", OUTCOME, VERIFIER_ERROR)}
            return TimeStep(ended.observation, 0.0, ended.terminated, ended.truncated,
                            {**info, TERMINATION: GRADER_FAULT, TERMINATION_REASON: reason})
        return _end(render_error(None, TIMEOUT, reason), GRADER_FAULT, reason)


def _time_limit(env: AgentEnv) -> TimeLimit | None:
    while not isinstance(env, TimeLimit):
        env = getattr(env, "env", None)
        if env is None:
            return None
    return env


def grading(env: AgentEnv, fn: Callable[[], Any]) -> tuple[bool, Any]:
    """`fn` (grader work during or after an episode of `env`) on the grader's clock of the
    stack's TimeLimit (`TimeLimit.grading`); run here, untimed, in a stack without one."""
    limit = _time_limit(env)
    return (True, fn()) if limit is None else limit.grading(fn)


def act(env: AgentEnv, policy: Any, observation: str) -> Any:
    """`policy.act(observation)` for an episode of `env`. The seconds the policy reports it spent
    waiting on inference infrastructure that failed (its cumulative `inference_wait_s`: failed
    requests and the backoff between them; absent, none) are not the model's: the agent's deadline
    of the stack's TimeLimit moves by them. Each request stays bounded by the endpoint's own
    deadline, and an endpoint that never answers is an inference fault, as the policy raises it."""
    waited = getattr(policy, "inference_wait_s", 0.0)
    try:
        return policy.act(observation)
    finally:
        excused = getattr(policy, "inference_wait_s", 0.0) - waited
        limit = _time_limit(env)
        if limit is not None and excused > 0:
            limit.deadline += excused


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
        job = self.submit(fn)
        done = job[1]
        try:
            finished = done.acquire(timeout=min(timeout, threading.TIMEOUT_MAX))
        except BaseException:  # interrupted while waiting (KeyboardInterrupt): the step runs on
            finished = False
            raise
        finally:
            if not finished:
                self.abandon()
        if not finished:
            return False, None
        return True, self.result(job, waited=True)

    def submit(self, fn: Callable[[], Any]) -> tuple[dict[str, Any], threading.Lock]:
        """Hand `fn` to the thread; the job, for `result`."""
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
        return box, done

    @staticmethod
    def result(job: tuple[dict[str, Any], threading.Lock], waited: bool = False) -> Any:
        """What the job's fn returned (waiting for it unless `waited`), or what it raised, raised here."""
        box, done = job
        if not waited:
            done.acquire()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def abandon(self) -> None:
        """Give up on the job in progress: the thread ends as soon as it returns, if ever."""
        self.abandoned = True
        self._jobs.put(None)

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
        if ts.tool_call is not None:
            self.tool_calls += 1
        if not ts.done and self.tool_calls >= self.max_tool_calls:
            ts.end_by(TRUNCATED, f"tool-call budget {self.max_tool_calls} spent")
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
    sampled token ids, logprobs and the policy version (never rebuilt from text). The token
    count of a turn goes to the TimeLimit below, which holds the policy's token budget."""

    def reset(self, task=None, seed=None) -> TimeStep:
        ts = self.env.reset(task=task, seed=seed)
        self.steps: list[Step] = []
        self.last = ts
        return ts

    def step(self, action, *, thought: str | None = None, token_ids: list[int] | None = None,
             logprobs: list[float] | None = None, policy_version: str | None = None) -> TimeStep:
        self._pending = pending = (action, thought, token_ids, logprobs, policy_version, time.perf_counter())
        if token_ids is not None and isinstance(self.env, TimeLimit):
            return self._record(pending, self.env.step(action, tokens=len(token_ids)))
        return self._record(pending, self.env.step(action))

    def finish(self, ts: TimeStep) -> TimeStep:
        """Record `ts` as what the step in progress returned (`run_watched`: the time limit ended
        the episode while that step still runs in the thread it abandoned)."""
        return self._record(self._pending, ts)

    def _record(self, pending: tuple, ts: TimeStep) -> TimeStep:
        action, thought, token_ids, logprobs, policy_version, started = pending
        latency = time.perf_counter() - started
        error = ts.error
        self.steps.append(make_step(
            index=len(self.steps), observation=self.last.observation,
            action_text=storable_text(action) if isinstance(action, str) else None,
            thought=storable_text(thought) if thought is not None else ts.thought,
            tool_call=ts.tool_call, result=ts.observation,
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
                              limits.step_timeout_s, limits.episode_timeout_s, max_turn_tokens=limits.max_turn_tokens,
                              max_episode_tokens=limits.max_episode_tokens, grade_timeout_s=limits.grade_timeout_s))
