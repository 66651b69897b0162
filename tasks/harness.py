"""Stage: episodes played by an external agent harness, landed as ordinary rollouts.

A harness keeps its own loop, prompts and context management; gymfoundry gives it the env's tools
(over MCP: tasks/mcp_server.py) and records its model calls (a recording proxy: tasks/proxy.py).
`EpisodeHub` holds the episodes: one per name the harness uses (its MCP address / session), each
a task from the family's validated, isolated pool, played through the same runtime stack as a
factory rollout (`standard_stack`: permission guard, budgets, time limits, recorder). When the env
ends the episode, or the harness finishes it (or goes idle), the episode is verified, classified,
scanned for leaks, scored and landed by the factory's own stage functions, in batches by one
lander thread (one writer). Its steps join the proxy's records (envs/harness.py).

The proxy and the hub meet in `CallLog`: one JSON line per model call under
`<data_dir>/harness/calls/<episode>.jsonl`, written before the proxy answers, so every call that
led to a tool call is on disk before the tool call reaches the hub."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import queue
import re
import secrets
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envs.base import render_error
from envs.errors import EnvFault
from envs.harness import ModelCall, assemble_steps, inference_end, policy_of
from envs.leaks import find_leaks
from envs.records import Cost, Rollout, Step, TaskSpec, Termination, ToolCall
from envs.registry import make, spec
from envs.secrets import redact
from envs.timestep import TimeStep
from envs.wrappers import TimeLimit, standard_stack
from tasks.classify import classify
from tasks.generate import generate_tasks
from tasks.isolate import (HOLDOUT_FRACTION, LeakError, assert_no_leaks, isolate_tasks, landed_splits,
                           lock_holdout_fraction, row_texts)
from tasks.land import land_records
from tasks.rollout import _outcome, rollout_seed
from tasks.score import score_rollouts
from tasks.validate import validate_tasks

log = logging.getLogger("gymfoundry.harness")
EPISODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # also a file name: no separators
EPISODE_OVER = "episode_over"
LANDING_WAIT_S = 120.0


def check_episode_name(name: Any) -> str:
    if not isinstance(name, str) or not EPISODE_NAME.fullmatch(name):
        raise ValueError(f"an episode name is 1-64 letters, digits, '_', '.', '-' (starting with a letter or digit), "
                         f"not {str(name)[:80]!r}")
    return name


class TooManyEpisodes(RuntimeError):
    """A harness asked for more episodes at once than the server keeps open."""


class EpisodeExists(ValueError):
    """The name is open, or was already used in this server run."""


class EpisodeNotOpen(LookupError):
    """No episode of that name is open (never opened, or already closed)."""


class WrongToken(PermissionError):
    """The request did not carry the token its episode was opened with."""


class UnreadableCall(ValueError):
    """A model call record that the reader could not read back: never appended."""


def unreadable(exc: ValueError) -> str:
    """Why a record could not be read, in one short line (pydantic's own message is several)."""
    errors = exc.errors() if isinstance(exc, ValidationError) else None
    return (errors[0]["msg"] if errors else str(exc).splitlines()[0])[:160]


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in `path` survive a crash of the machine, not only of the process."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CallLog:
    """The model calls of each episode, one JSON line per call, appended by the proxy and read
    by the hub (possibly another process) when the episode ends; and which episodes are open, with
    the sha256 of each one's token (`<name>.open`), which both processes check."""

    def __init__(self, data_dir: str | Path):
        self.dir = Path(data_dir) / "harness" / "calls"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._next: dict[str, int] = {}

    # -- who owns an episode -----------------------------------------------------------------
    def open(self, name: str, token: str | None = None) -> str:
        """Open `name` and return its token (a fresh one unless given: a stdio launcher's). Only
        its sha256 is written. EpisodeExists when the name is open already."""
        path = self.dir / f"{check_episode_name(name)}.open"
        token = token or secrets.token_urlsafe(32)
        temp = self.dir / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(temp, "w", encoding="ascii") as fh:
            fh.write(token_digest(token))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(temp, path)  # unlike a rename, never replaces an episode opened meanwhile
        except FileExistsError:
            raise EpisodeExists(f"episode {name!r} is open already") from None
        finally:
            temp.unlink()
        fsync_dir(self.dir)
        return token

    def check(self, name: str, token: str | None) -> None:
        """EpisodeNotOpen unless `name` is open; WrongToken unless `token` is the one it was opened with."""
        if not isinstance(name, str) or not EPISODE_NAME.fullmatch(name):
            raise EpisodeNotOpen(f"no episode {str(name)[:80]!r}")
        try:
            digest = (self.dir / f"{name}.open").read_text(encoding="ascii").strip()
        except (FileNotFoundError, UnicodeDecodeError):
            raise EpisodeNotOpen(f"no open episode {name!r}") from None
        if not isinstance(token, str) or not hmac.compare_digest(token_digest(token), digest):
            raise WrongToken(f"the token of episode {name!r} is required (Authorization: Bearer <token>)")

    def close(self, name: str) -> None:
        """The episode's token opens nothing any more (the proxy records no more calls for it)."""
        with contextlib.suppress(FileNotFoundError):
            (self.dir / f"{check_episode_name(name)}.open").unlink()

    def is_open(self, name: str) -> bool:
        return isinstance(name, str) and bool(EPISODE_NAME.fullmatch(name)) and (self.dir / f"{name}.open").exists()

    def open_names(self) -> list[str]:
        return sorted(p.name[:-len(".open")] for p in self.dir.glob("*.open"))

    # -- the calls ---------------------------------------------------------------------------
    def next_index(self, episode: str) -> int:
        """The order of a new call of `episode` in this process (the proxy numbers at arrival)."""
        with self._lock:
            if episode not in self._next:  # a restarted proxy continues an episode's numbering
                self._next[episode] = max((c.index for c in self.read(episode)), default=-1) + 1
            self._next[episode] += 1
            return self._next[episode] - 1

    def append(self, call: ModelCall) -> None:
        """Append one call, on disk (fsynced) when this returns. A record the reader could not read
        back (JSON nested past its limit) raises UnreadableCall and is not written: a caller records
        a refusal instead. After a torn line (a full disk) the call starts a line of its own."""
        line = call.model_dump_json()
        try:
            ModelCall.model_validate_json(line)
        except ValueError as exc:
            raise UnreadableCall(f"the model call could not be read back: {unreadable(exc)}") from None
        path = self.dir / f"{check_episode_name(call.episode_id)}.jsonl"
        with self._lock:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                size = os.fstat(fd).st_size
                torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
                os.write(fd, (b"\n" if torn else b"") + line.encode("utf-8") + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)

    def read(self, episode: str) -> list[ModelCall]:
        """The episode's calls in order; a line that cannot be read is left out (see `scan`)."""
        return self.scan(episode)[0]

    def scan(self, episode: str) -> tuple[list[ModelCall], list[str]]:
        """(the calls that could be read, in order; what could not: one reason per line). A last
        line without its newline is still being written, and is neither."""
        path = self.dir / f"{check_episode_name(episode)}.jsonl"
        try:
            lines = path.read_bytes().split(b"\n")[:-1]
        except FileNotFoundError:
            return [], []
        calls, bad = [], []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                calls.append(ModelCall.model_validate_json(line))
            except ValueError as exc:  # malformed, too deep, not UTF-8, not a ModelCall
                bad.append(f"line {number} of {path.name}: {unreadable(exc)}")
        return sorted(calls, key=lambda c: c.index), bad


def records_of(calls: list[ModelCall]) -> int:
    """How many conversations ("records") the harness split the calls into: a call whose request does
    not continue the previous request starts a new one (a summary, a branch, a fresh context)."""
    records, previous = 0, None
    for call in calls:
        if previous is None or call.messages[:len(previous.messages)] != previous.messages:
            records += 1
        previous = call
    return records


@dataclass
class Episode:
    name: str
    task: TaskSpec
    seed: int
    env: Any  # the runtime stack (envs.wrappers.Recorder on top)
    goal: str
    ts: TimeStep
    started: float = field(default_factory=time.perf_counter)
    last_active: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: int = 0
    env_error: str | None = None
    env_bug: str | None = None
    rollout: Rollout | None = None  # set once the episode has ended
    landing_error: str | None = None
    episode_deadline_hit: bool = False  # a step ended by the episode's clock, not the step's own limit
    harness_leak: str | None = None  # the harness showed its model hidden values: landed as a violation
    tool_steps: list[Step] = field(default_factory=list)  # the env's own steps, as its recorder kept them
    model_calls: list[ModelCall] = field(default_factory=list)  # the model calls the rollout was built from
    landed: threading.Event = field(default_factory=threading.Event)  # landed, or failed to

    @property
    def over(self) -> bool:
        return self.rollout is not None or self.ts.done or bool(self.env_error or self.env_bug)


class EpisodeHub:
    """Episodes of `family` for harnesses: the n-th episode opened plays task n of the pool (its
    sample n // pool size, so every episode is a rollout of its own). `land=False` keeps the
    rollouts in memory only (`rollouts`). `idle_timeout_s` ends an episode no call touched for that
    long (a harness that never says it is done). `land_before_reply`: the call that ends an
    episode answers once it has landed (a stdio server lives only as long as its client wants).
    At most `max_open` episodes are open at once."""

    def __init__(self, family: str, data_dir: str | Path, *, tasks: int = 32, seed: int = 0,
                 holdout_fraction: float = HOLDOUT_FRACTION, land: bool = True, idle_timeout_s: float | None = None,
                 land_before_reply: bool = False, max_open: int = 1024):
        self.family, self.data_dir, self.seed, self.land = family, str(data_dir), seed, land
        self.land_before_reply, self.max_open = land_before_reply, max_open
        if land:
            lock_holdout_fraction(self.data_dir, [family], holdout_fraction)
        valid, rejected = validate_tasks(generate_tasks(family, tasks, seed))
        known = landed_splits(self.data_dir, [family]) if land else {}
        self.tasks, isolated = isolate_tasks(valid, known, holdout_fraction)
        if not self.tasks:
            raise ValueError(f"no {family} task passed validation and isolation (of {tasks} generated)")
        self.rejections = rejected + isolated
        self.log = CallLog(self.data_dir)
        # Episodes are not reproducible from a seed: this server's run joins their identity, so a
        # name a harness uses again in a later run is another rollout, never a duplicate dropped.
        self.run_id = uuid.uuid4().hex[:16]
        self.started_at = time.time()
        self.rollouts: list[Rollout] = []
        self.landed: dict[str, int] = {}
        self._episodes: dict[str, Future] = {}  # name -> its Episode, once opened
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._rejections_landed = False
        self._lander = threading.Thread(target=self._land_loop, name="harness-lander", daemon=True)
        self._lander.start()
        self._reaper = None
        if idle_timeout_s:
            self._reaper = threading.Thread(target=self._reap_loop, args=(idle_timeout_s,), name="harness-reaper",
                                            daemon=True)
            self._reaper.start()

    def __contains__(self, name: object) -> bool:
        """Whether an episode of this name was opened (and could be)."""
        opened = self._episodes.get(name) if isinstance(name, str) else None
        return opened is not None and opened.done() and opened.exception() is None

    # -- what the harness sees ---------------------------------------------------------------
    def episode(self, name: str) -> Episode:
        """The episode called `name`, opened (a fresh env, reset on its task) on first use. The
        env is built outside the hub's lock (a sandbox can take seconds to start): other episodes
        open meanwhile, and other requests for this one wait for it."""
        check_episode_name(name)
        n = None
        with self._lock:
            opened = self._episodes.get(name)
            if opened is None:
                if self.open_episodes() >= self.max_open:  # each holds an env (a sandbox): a bound, not a leak
                    raise TooManyEpisodes(f"{self.max_open} episodes are open; finish one before opening {name!r}")
                opened = self._episodes[name] = Future()
                n = len(self._episodes) - 1
        if n is None:
            return opened.result()
        try:
            task = self.tasks[n % len(self.tasks)]
            env = standard_stack(make(task.env_id))
            ts = env.reset(task=task)
            opened.set_result(Episode(name, task, rollout_seed(self.seed, task, n // len(self.tasks)), env,
                                      ts.observation, ts))
        except BaseException as exc:
            opened.set_exception(exc)
        return opened.result()

    def open_episodes(self) -> int:
        return sum(1 for f in self._episodes.values()
                   if not f.done() or (f.exception() is None and f.result().rollout is None))

    def goal(self, name: str) -> str:
        return self.episode(name).goal

    def tools(self, name: str) -> list[dict[str, Any]]:
        """The episode's tools as function schemas (name, description, JSON-schema parameters)."""
        return self.episode(name).env.available_tools

    def call(self, name: str, tool: str, arguments: dict[str, Any] | None) -> tuple[str, bool]:
        """(observation, is_error) of one tool call through the runtime stack. A bad call (unknown
        tool, bad arguments, refused permission) is an error observation and the episode goes on."""
        episode = self.episode(name)
        with episode.lock:
            episode.last_active = time.monotonic()
            if episode.over:
                return render_error(None, EPISODE_OVER, "the episode is over; no further tool calls"), True
            action = ToolCall(name=tool, arguments=arguments if arguments is not None else {},
                              id=f"mcp-{episode.calls}")
            episode.calls += 1
            limit = _time_limit(episode.env)
            episode_bound = limit is not None and limit.deadline - time.monotonic() < limit.step_timeout_s
            try:
                episode.ts = ts = episode.env.step(action)
                observation, is_error = ts.observation, ts.info.get("error") is not None
                episode.episode_deadline_hit |= episode_bound and ts.info.get("termination") == "timeout"
            except EnvFault as exc:  # the env itself failed: the whole attempt is a fault (as in tasks/rollout.py)
                episode.env_error = f"environment fault {type(exc).__name__}: {exc}"
                observation, is_error = render_error(action, "env_fault", "the environment failed"), True
            except Exception as exc:
                episode.env_bug = f"environment bug {type(exc).__name__}: {exc}"
                observation, is_error = render_error(action, "env_bug", "the environment failed"), True
            over = episode.over
        if over:
            self.finish(name)
            if self.land_before_reply:
                episode.landed.wait(LANDING_WAIT_S)
        return observation, is_error

    # -- the end -----------------------------------------------------------------------------
    def finish(self, name: str) -> Rollout:
        """End the episode (once: later calls return the same rollout) and queue it for landing."""
        episode = self.episode(name)
        with episode.lock:
            if episode.rollout is None:
                episode.rollout = self._rollout(episode)
                self._queue.put(episode)
            return episode.rollout

    def _rollout(self, episode: Episode) -> Rollout:
        """The episode as a factory rollout: the same verifier, classes and cost as run_episode."""
        task, ts, env = episode.task, episode.ts, episode.env
        try:
            tool_steps = list(env.steps)
            env_info = env.unwrapped.runtime_info()
            outcome, verifier_error = _outcome(task, ts, tool_steps, env)
        finally:
            env.close()
        calls = self.calls_of(episode)
        steps, last = assemble_steps(tool_steps, calls)
        if ts.done and last is not None:  # what the harness asked after the env ended is not this episode's
            calls = calls[:last + 1]
        fault, context, own = inference_end(calls)
        termination, reason = classify(  # a request the harness got wrong is its own (a model outcome), no class
            steps, terminated=ts.terminated, truncated=ts.truncated, end_info=ts.info, outcome=outcome,
            env_error=episode.env_error, verifier_error=verifier_error, env_bug=episode.env_bug,
            inference_fault=fault, context_exceeded=context)
        if own:
            reason = f"{reason}; {own}"
        if termination == Termination.timeout and episode.episode_deadline_hit:
            termination, reason = self._own_time(episode, tool_steps, calls, reason)
        policy_id, policy_version = policy_of(calls)
        cost = Cost(steps=len(steps), tool_calls=sum(s.tool_call is not None for s in steps),
                    tokens=sum(len(s.token_ids or []) for s in steps),
                    wall_time_s=round(time.perf_counter() - episode.started, 6))
        harness = {"episode": episode.name, "model_calls": len(calls), "records": records_of(calls)}
        episode.tool_steps, episode.model_calls = tool_steps, calls
        return Rollout(task_id=task.task_id, family=task.family, env_id=task.env_id,
                       env_version=spec(task.env_id).version, policy_id=policy_id, policy_version=policy_version,
                       seed=episode.seed, steps=steps, termination=termination,
                       termination_reason=redact(reason)[:2000], outcome=outcome, cost=cost,
                       env_info={**env_info, "harness": harness},
                       # a harness episode is not reproducible from a seed: its name is part of its identity
                       policy_params={"harness_episode": episode.name, "harness_run": self.run_id})

    @staticmethod
    def _own_time(episode: Episode, tool_steps: list[Step], calls: list[ModelCall],
                  reason: str) -> tuple[Termination, str]:
        """An episode's time limit reached in a harness episode: whose time was it? The env's is its
        steps', the upstream's its model calls' (as the proxy timed them); the rest is the harness's
        own, which it controls (it can sleep). If the env and the model together stayed within the
        limit, the harness's own time ran it out: a model outcome (truncated), never a `timeout`
        outside every statistic; else the runtime's `timeout` stands."""
        limit_s = episode.task.budget.episode_timeout_s  # the hub's stacks keep the task's budget
        env_s, model_s = sum(s.latency_s for s in tool_steps), sum(c.latency_s for c in calls)
        if env_s + model_s >= limit_s:
            return Termination.timeout, reason
        return Termination.truncated, (f"{reason}; the harness's own time ran it out (tool calls {env_s:.3g} s and "
                                       f"model calls {model_s:.3g} s of the {limit_s:g} s limit)")

    def calls_of(self, episode: Episode) -> list[ModelCall]:
        """The episode's model calls: those of its name since this server started (a name used again
        in a later run is a new episode; the calls of the earlier one stay on record, not in it)."""
        return [c for c in self.log.read(episode.name) if c.at >= self.started_at]

    def close(self, timeout_s: float = 300.0) -> dict[str, int]:
        """End every open episode, land what is queued, stop. The rows landed per table."""
        for name, opened in list(self._episodes.items()):
            if opened.done() and opened.exception() is None:
                self.finish(name)
        self._stop.set()
        self._lander.join(timeout_s)
        return dict(self.landed)

    def wait_landed(self, timeout_s: float = 120.0) -> None:
        """Block until everything finished so far has been landed (or failed to)."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)

    def _land_loop(self) -> None:
        while True:
            try:
                batch = [self._queue.get(timeout=0.1)]
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            while True:  # everything ended meanwhile lands in the same transaction
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._land(batch)
            except Exception as exc:  # never lose the lander: the error stays with each episode
                log.exception("landing %d harness episodes failed", len(batch))
                for episode in batch:
                    episode.landing_error = f"{type(exc).__name__}: {exc}"
            finally:
                for episode in batch:
                    episode.landed.set()
                    self._queue.task_done()

    def _land(self, batch: list[Episode]) -> None:
        kept = []
        for episode in batch:
            task, rollout = episode.task, episode.rollout
            own = rollout.model_copy(update={"steps": episode.tool_steps})  # what the env itself showed
            try:
                assert_no_leaks([own], {task.task_id: task})
            except LeakError as exc:  # an env showing hidden values stops that episode, loudly (as in the factory)
                log.error("not landed: %s", exc)
                episode.landing_error = str(exc)
                continue
            try:
                leak_check(rollout, task, episode.model_calls)
            except LeakError as exc:
                # Only the harness showed them (its messages, its tools): text the examinee wrote decides
                # no drop (a failing harness could otherwise spray candidate values to leave every
                # statistic). It lands as a violation, with the env's own steps only: no text of its own.
                log.error("landed as a constraint violation, with the env's steps only: %s", exc)
                episode.harness_leak = str(exc)
                episode.rollout = own.model_copy(update={
                    "termination": Termination.constraint_violation,
                    "termination_reason": "the harness showed its model hidden values of the task (not named here); "
                                          "the steps are the env's own",
                    "cost": rollout.cost.model_copy(update={"tokens": 0})})
            kept.append(episode)
        rollouts = [e.rollout for e in kept]
        self.rollouts += rollouts
        if not self.land or not rollouts:
            return
        tasks = list({e.task.task_id: e.task for e in kept}.values())
        rejections = [] if self._rejections_landed else self.rejections
        scores = score_rollouts(rollouts, tasks, self.data_dir)
        landing = land_records(self.data_dir, tasks, rejections, rollouts, scores)
        if landing.spooled:
            log.error("the catalog stayed locked: %d harness episodes wait in %s and land with the next landing",
                      len(rollouts), landing.spooled)
        counts = landing.checked()
        self._rejections_landed = True
        for table, n in counts.items():
            self.landed[table] = self.landed.get(table, 0) + n

    def _reap_loop(self, idle_s: float) -> None:
        while not self._stop.wait(min(1.0, idle_s / 4)):
            now = time.monotonic()
            for name, opened in list(self._episodes.items()):
                if opened.done() and opened.exception() is None:
                    if opened.result().rollout is None and now - opened.result().last_active > idle_s:
                        self.finish(name)


def _time_limit(env: Any) -> TimeLimit | None:
    """The runtime's clock in an episode's stack (standard_stack: Recorder over TimeLimit)."""
    while env is not None and not isinstance(env, TimeLimit):
        env = getattr(env, "env", None)
    return env


def leak_check(rollout: Rollout, task: TaskSpec, calls: list[ModelCall]) -> None:
    """The factory's scan of every observation, plus what the proxy recorded the model was shown
    (the harness's system, user and tool messages, and the tools it offered): a hidden value there is
    a leak. As in the factory, the model's own output is not scanned (a guess is not a leak)."""
    assert_no_leaks([rollout], {task.task_id: task})
    shown = [[m for m in c.messages if m.get("role") != "assistant"] + [c.tools] for c in calls]
    leaks = find_leaks(task, row_texts(shown))
    if leaks:
        raise LeakError(f"the model calls of harness episode {rollout.env_info['harness']['episode']} "
                        f"show hidden values {leaks}")
