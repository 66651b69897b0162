"""Stage: episodes played by an external agent harness, landed as ordinary rollouts.

A harness keeps its own loop, prompts and context management; gymfoundry gives it the env's tools
(over MCP: tasks/harness/mcp_server.py) and records its model calls (a recording proxy: tasks/harness/proxy.py).
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
import fcntl
import hashlib
import hmac
import json
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

from gymfoundry.envs.base import render_error
from gymfoundry.envs.errors import EnvFault
from gymfoundry.envs.harness import ModelCall, assemble_steps, inference_end, policy_of
from gymfoundry.envs.leaks import find_leaks
from gymfoundry.envs.records import Cost, Rollout, Step, TaskSpec, Termination, ToolCall
from gymfoundry.envs.family import family
from gymfoundry.envs.timestep import TimeStep
from gymfoundry.envs.wrappers import TimeLimit, standard_stack
from gymfoundry.tasks.rollout.build import build_rollout
from gymfoundry.tasks.rollout.classify import classify
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.stages.isolate import (HOLDOUT_FRACTION, LeakError, assert_no_leaks, isolate_tasks, landed_splits,
                           lock_holdout_fraction, row_texts)
from gymfoundry.tasks.stages.land import land_spool_file, land_spooled
from gymfoundry.tasks.rollout.episodes import _outcome, rollout_seed
from gymfoundry.tasks.stages.score import score_rollouts
from gymfoundry.tasks.stages.validate import validate_tasks
from gymfoundry.warehouse import Warehouse, spool

log = logging.getLogger("gymfoundry.harness")
EPISODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # also a file name: no separators
EPISODE_HEADER = "x-gymfoundry-episode"  # names the episode on the plain /mcp and /v1 addresses
EPISODE_OVER = "episode_over"
LANDING_WAIT_S = 120.0
LAND_LOCK_TIMEOUT_S = 10.0  # the lander tries again later: it need not wait long for a reader


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
        data = self.line(call)
        path = self.dir / f"{check_episode_name(call.episode_id)}.jsonl"
        with self._lock:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                size = os.fstat(fd).st_size
                torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
                os.write(fd, (b"\n" if torn else b"") + data)
                os.fsync(fd)
            finally:
                os.close(fd)

    @staticmethod
    def line(call: ModelCall) -> bytes:
        """The call's line as `append` writes it; UnreadableCall when `scan` could not read it back."""
        line = call.model_dump_json()
        try:
            ModelCall.model_validate_json(line)
        except ValueError as exc:
            raise UnreadableCall(f"the model call could not be read back: {unreadable(exc)}") from None
        return line.encode("utf-8") + b"\n"

    def read(self, episode: str) -> list[ModelCall]:
        """The episode's calls in order; a line that cannot be read is left out (see `scan`)."""
        return self.scan(episode)[0]

    def size(self, episode: str) -> int:
        """Where the next call of `episode` will start: an episode opened now owns what follows."""
        try:
            return (self.dir / f"{check_episode_name(episode)}.jsonl").stat().st_size
        except FileNotFoundError:
            return 0

    def scan(self, episode: str, offset: int = 0) -> tuple[list[ModelCall], list[str]]:
        """(the calls from byte `offset` on that could be read, in order; what could not: one reason
        per line). A last line without its newline is still being written, and is neither."""
        path = self.dir / f"{check_episode_name(episode)}.jsonl"
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                lines = fh.read().split(b"\n")[:-1]
        except FileNotFoundError:
            return [], []
        calls, bad = [], []
        for number, line in enumerate(lines, 1):  # numbered from `offset`
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
    run_id: str  # the server run that opened it (part of its rollout's identity)
    log_offset: int = 0  # where its model calls start in its name's call log (a name's earlier runs are before)
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
    spooled: Path | None = None  # the durable batch that lands it
    landed: threading.Event = field(default_factory=threading.Event)  # landed, or will never be

    @property
    def over(self) -> bool:
        return self.rollout is not None or self.ts.done or bool(self.env_error or self.env_bug)


@dataclass
class Name:
    """What this run keeps of every name it opened, in memory or not (a name is one episode per run)."""
    n: int  # the episode's number: task n % pool
    last_active: float = field(default_factory=time.monotonic)
    reply: dict[str, str] | None = None  # what finishing answers, once it ended
    closed: bool = False  # its token opens nothing any more


class EpisodeHub:
    """Episodes of `family` for harnesses: the n-th episode opened plays task n of the pool (its
    sample n // pool size, so every episode is a rollout of its own). `land=False` keeps the
    rollouts in memory only (`rollouts`). `idle_timeout_s` ends an episode no request touched for that
    long (a harness that never says it is done) and closes its name. `land_before_reply`: the call that
    ends an episode answers once it has landed (a stdio server lives only as long as its client wants).
    At most `max_open` episodes are open at once.

    Durable (with `land`): every tool call is appended to the episode's write-ahead log
    (`<data_dir>/harness/wal/<name>.jsonl`, fsynced) before it runs; an episode that ends is verified,
    scored and spooled (`gymfoundry.warehouse.spool`, fsynced) before the call that ended it answers, then its log
    is removed and a lander thread lands the spool, retrying while it fails. On start, spooled batches
    land, and an episode whose log is still there (open when the server stopped) is replayed into a
    fresh env and ended: as the env ended it if the replay ends it, else as an environment fault (the
    server failed the harness); every name open then is closed."""

    def __init__(self, family: str, data_dir: str | Path, *, tasks: int = 32, seed: int = 0,
                 holdout_fraction: float = HOLDOUT_FRACTION, land: bool = True, idle_timeout_s: float | None = None,
                 land_before_reply: bool = False, max_open: int = 1024):
        self.family, self.data_dir, self.seed, self.land = family, str(data_dir), seed, land
        self.land_before_reply, self.max_open, self.idle_timeout_s = land_before_reply, max_open, idle_timeout_s
        self.log = CallLog(self.data_dir)
        self._held_lock = self._hold_data_dir() if land else None
        try:
            if land:
                lock_holdout_fraction(self.data_dir, [family], holdout_fraction)
            valid, rejected = validate_tasks(generate_tasks(family, tasks, seed))
            known = landed_splits(self.data_dir, [family]) if land else {}
            self.tasks, isolated = isolate_tasks(valid, known, holdout_fraction)
            if not self.tasks:
                raise ValueError(f"no {family} task passed validation and isolation (of {tasks} generated)")
        except BaseException:
            if self._held_lock is not None:
                self._held_lock.close()
            raise
        self.rejections = rejected + isolated
        # Episodes are not reproducible from a seed: this server's run joins their identity, so a
        # name a harness uses again in a later run is another rollout, never a duplicate dropped.
        self.run_id = uuid.uuid4().hex[:16]
        self.started_at = time.time()
        self.rollouts: list[Rollout] = []  # land=False only: landed rollouts leave memory
        self.landed: dict[str, int] = {}  # {"rollouts": this run's episodes landed}
        self.unlanded = 0  # episodes whose batch stayed spooled at close (landed by a later landing)
        self._names: dict[str, Name] = {}
        self._episodes: dict[str, Future] = {}  # name -> its Episode, while opening, open or not yet landed
        self._shown: dict[int, tuple[str, list[dict[str, Any]]]] = {}  # task n -> (goal, tools), pool-sized
        self._opened = 0
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._rejections_spooled = False
        self._waiting = 0  # ended episodes whose batch has not landed yet
        self._closing_deadline = float("inf")
        self.wal_dir = Path(self.data_dir) / "harness" / "wal"
        if land:
            self.wal_dir.mkdir(parents=True, exist_ok=True)
            self._recover()
        for name in self.log.open_names():  # tokens of an earlier run open nothing in this one
            self.log.close(name)
        self._lander = threading.Thread(target=self._land_loop, name="harness-lander", daemon=True)
        self._lander.start()
        self._reaper = None
        if idle_timeout_s:
            self._reaper = threading.Thread(target=self._reap_loop, args=(idle_timeout_s,), name="harness-reaper",
                                            daemon=True)
            self._reaper.start()

    def _hold_data_dir(self):
        """One durable hub per data dir: another's start would close this one's open episodes."""
        path = Path(self.data_dir) / "harness" / "serve-env.lock"
        fh = open(path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise RuntimeError(f"{self.data_dir} is served by {holder} already; one serve-env per data dir") from None
        fh.truncate(0)
        fh.write(f"serve-env PID {os.getpid()}")
        fh.flush()
        return fh

    @property
    def held(self) -> int:
        """Episodes held in memory (open, or ended and not landed yet)."""
        return len(self._episodes)

    # -- who may ask -------------------------------------------------------------------------
    def open(self, name: str, token: str | None = None) -> str:
        """Open an episode (a fresh env, reset on its task) and return its token. EpisodeExists when
        the name is open or was used in this run; TooManyEpisodes past `max_open`. The env is built
        outside the hub's lock (a sandbox can take seconds): other episodes open meanwhile."""
        check_episode_name(name)
        with self._lock:
            if name in self._names or name in self._episodes:
                raise EpisodeExists(f"episode {name!r} was opened in this server run already; use another name")
            if self.open_episodes() >= self.max_open:  # each holds an env (a sandbox): a bound, not a leak
                raise TooManyEpisodes(f"{self.max_open} episodes are open; finish one before opening {name!r}")
            opened = self._episodes[name] = Future()
            n, self._opened = self._opened, self._opened + 1
        env = None
        try:
            task = self.tasks[n % len(self.tasks)]
            env = standard_stack(family(task.env_id).make())
            ts = env.reset(task=task)
            episode = Episode(name, task, rollout_seed(self.seed, task, n // len(self.tasks)), env, ts.observation, ts,
                              self.run_id, self.log.size(name))
            if self.land:
                self._wal_write(name, {"episode": name, "run": self.run_id, "seed": episode.seed,
                                       "log_offset": episode.log_offset, "task": task.model_dump(mode="json")}, "w")
            token = self.log.open(name, token)
        except BaseException as exc:
            with self._lock:
                del self._episodes[name]
            opened.set_exception(exc)
            if env is not None:
                with contextlib.suppress(Exception):
                    env.close()
            with contextlib.suppress(FileNotFoundError):
                (self.wal_dir / f"{name}.jsonl").unlink()
            raise
        self._shown.setdefault(n % len(self.tasks), (episode.goal, episode.env.available_tools))
        with self._lock:
            self._names[name] = Name(n % len(self.tasks))
        opened.set_result(episode)
        return token

    def authorize(self, name: str, token: str | None) -> None:
        """EpisodeNotOpen unless `name` is open in this run; WrongToken unless `token` opened it."""
        record = self._names.get(name) if isinstance(name, str) else None
        if record is None or record.closed:
            raise EpisodeNotOpen(f"no open episode {str(name)[:80]!r}; open one with POST /episodes/<name>/open")
        self.log.check(name, token)
        record.last_active = time.monotonic()

    def __contains__(self, name: object) -> bool:
        """Whether an episode of this name was opened in this run."""
        return isinstance(name, str) and name in self._names

    # -- what the harness sees ---------------------------------------------------------------
    def episode(self, name: str) -> Episode:
        """The episode called `name` while it is held (open, or ended and not landed yet)."""
        opened = self._episodes.get(name) if isinstance(name, str) else None
        if opened is None:
            raise EpisodeNotOpen(f"episode {str(name)[:80]!r} is not open")
        return opened.result()

    def open_episodes(self) -> int:
        return sum(1 for f in list(self._episodes.values())
                   if not f.done() or (f.exception() is None and f.result().rollout is None))

    def _record(self, name: str) -> Name:
        record = self._names.get(name) if isinstance(name, str) else None
        if record is None:
            raise EpisodeNotOpen(f"episode {str(name)[:80]!r} is not open")
        return record

    def goal(self, name: str) -> str:
        return self._shown[self._record(name).n][0]

    def tools(self, name: str) -> list[dict[str, Any]]:
        """The episode's tools as function schemas (name, description, JSON-schema parameters)."""
        return self._shown[self._record(name).n][1]

    def call(self, name: str, tool: str, arguments: dict[str, Any] | None) -> tuple[str, bool]:
        """(observation, is_error) of one tool call through the runtime stack. A bad call (unknown
        tool, bad arguments, refused permission) is an error observation and the episode goes on."""
        self._record(name).last_active = time.monotonic()
        opened = self._episodes.get(name)
        episode = opened.result() if opened is not None else None
        if episode is None:  # ended and landed: it left memory
            return render_error(None, EPISODE_OVER, "the episode is over; no further tool calls"), True
        with episode.lock:
            episode.last_active = time.monotonic()
            if episode.over:
                return render_error(None, EPISODE_OVER, "the episode is over; no further tool calls"), True
            arguments = arguments if arguments is not None else {}
            if self.land:  # write-ahead: on disk before it runs, so a restart replays it
                self._wal_write(name, {"tool": tool, "arguments": arguments})
            observation, is_error = self._step(episode, tool, arguments)
            over = episode.over
        if over:
            self._end(episode)
            if self.land_before_reply:
                episode.landed.wait(LANDING_WAIT_S)
        return observation, is_error

    def _step(self, episode: Episode, tool: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        action = ToolCall(name=tool, arguments=arguments, id=f"mcp-{episode.calls}")
        episode.calls += 1
        limit = _time_limit(episode.env)
        episode_bound = limit is not None and limit.deadline - time.monotonic() < limit.step_timeout_s
        try:
            episode.ts = ts = episode.env.step(action)
            episode.episode_deadline_hit |= episode_bound and ts.end.clock == Termination.timeout.value
            return ts.observation, ts.error is not None
        except EnvFault as exc:  # the env itself failed: the whole attempt is a fault (as in tasks/rollout/episodes.py)
            episode.env_error = f"environment fault {type(exc).__name__}: {exc}"
            return render_error(action, "env_fault", "the environment failed"), True
        except Exception as exc:
            episode.env_bug = f"environment bug {type(exc).__name__}: {exc}"
            return render_error(action, "env_bug", "the environment failed"), True

    def _wal_write(self, name: str, entry: dict[str, Any], mode: str = "a") -> None:
        with open(self.wal_dir / f"{name}.jsonl", mode, encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if mode == "w":
            fsync_dir(self.wal_dir)

    # -- the end -----------------------------------------------------------------------------
    def finish(self, name: str) -> Rollout | None:
        """End the episode (once) and close its name: its token opens nothing any more. The rollout,
        or None when it had ended and landed already (its ids: `reply`; land=False keeps it)."""
        record = self._record(name)
        opened = self._episodes.get(name)
        episode = opened.result() if opened is not None else None
        if episode is not None:
            self._end(episode)
        self._close_name(name, record)
        if episode is not None:
            return episode.rollout
        return next((r for r in reversed(self.rollouts) if r.env_info["harness"]["episode"] == name), None)

    def played(self, name: str) -> bool:
        """Whether the episode saw a tool call or a model call (a stdio client that only connected did not)."""
        opened = self._episodes.get(name)
        if opened is None or not opened.done() or opened.exception() is not None:
            return name in self._names
        episode = opened.result()
        return episode.calls > 0 or episode.rollout is not None or self.log.size(name) > episode.log_offset

    def abandon(self, name: str) -> None:
        """Close an episode that was never played, landing nothing."""
        record = self._record(name)
        opened = self._episodes.pop(name, None)
        if opened is not None and opened.done() and opened.exception() is None:
            with contextlib.suppress(Exception):
                opened.result().env.close()
        with contextlib.suppress(FileNotFoundError):
            (self.wal_dir / f"{name}.jsonl").unlink()
        self._close_name(name, record)

    def reply(self, name: str) -> dict[str, str]:
        """What finishing answers the harness: the rollout and task ids, never the class (a verdict
        shown for one episode would be the answer to another of the same task)."""
        return self._record(name).reply or {"episode": name}

    def _close_name(self, name: str, record: Name) -> None:
        record.closed = True
        self.log.close(name)

    def _end(self, episode: Episode) -> None:
        """The episode as a rollout, made durable (spooled) and queued for landing, once. Whatever
        fails here fails this episode alone."""
        with episode.lock:
            if episode.rollout is not None:
                return
            try:
                episode.rollout = self._rollout(episode)
            except Exception as exc:  # our own code failed on this episode: a fault, never the lander's or another's
                log.exception("harness episode %s could not be assembled", episode.name)
                episode.rollout = self._broken(episode, exc)
            records = self._prepare(episode)
            if records is not None and self.land:
                try:
                    episode.spooled = self._spool(records)
                except Exception as exc:
                    log.exception("harness episode %s could not be spooled", episode.name)
                    episode.landing_error = f"{type(exc).__name__}: {exc}"
            if episode.spooled is not None or records is None:  # spooled (or never to land): the log did its work
                with contextlib.suppress(FileNotFoundError):
                    (self.wal_dir / f"{episode.name}.jsonl").unlink()
            record = self._names.get(episode.name)
            if record is not None:
                record.reply = {"episode": episode.name, "rollout_id": episode.rollout.rollout_id,
                                "task_id": episode.rollout.task_id}
            self._queue.put(episode)

    def _broken(self, episode: Episode, exc: Exception) -> Rollout:
        task = episode.task
        with contextlib.suppress(Exception):
            episode.env.close()
        return build_rollout(task, [], Termination.env_bug,
                             f"serve-env could not assemble the episode: {type(exc).__name__}: {exc}",
                             policy_id="harness:unrecorded", policy_version="not assembled", seed=episode.seed,
                             cost=Cost(steps=0, tool_calls=episode.calls, tokens=0, wall_time_s=0.0),
                             env_info={"harness": {"episode": episode.name, "model_calls": 0, "records": 0}},
                             policy_params={"harness_episode": episode.name, "harness_run": episode.run_id})

    def _prepare(self, episode: Episode) -> dict[str, list] | None:
        """The leak scans (an env that showed hidden values is not landed; a harness that did lands as
        a violation, with the env's own steps) and the scores: what landing needs, or None."""
        task, rollout = episode.task, episode.rollout
        own = rollout.model_copy(update={"steps": episode.tool_steps})  # what the env itself showed
        try:
            assert_no_leaks([own], {task.task_id: task})
        except LeakError as exc:  # an env showing hidden values stops that episode, loudly (as in the factory)
            log.error("not landed: %s", exc)
            episode.landing_error = str(exc)
            return None
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
        if not self.land:
            return {}
        try:
            scores = score_rollouts([episode.rollout], [task], self.data_dir)
        except Exception:  # scoring can be redone (`gymfoundry rescore`); the rollout must not wait on it
            log.exception("harness episode %s lands unscored", episode.name)
            scores = []
        return {"tasks": [task], "rollouts": [episode.rollout], "scores": scores}

    def _spool(self, records: dict[str, list]) -> Path:
        """The batch, durable: warehouse.spool's file (fsynced by spool.save)."""
        with self._lock:
            rejections, self._rejections_spooled = ([] if self._rejections_spooled else self.rejections), True
        path = spool.save(self.data_dir, {**records, "rejections": rejections},
                          {"rollout_outcomes": True, "run_id": None, "flow_run_id": None})
        return path

    def _rollout(self, episode: Episode) -> Rollout:
        """The episode as a factory rollout: the same verifier, classes and cost as run_episode."""
        task, ts, env = episode.task, episode.ts, episode.env
        try:
            tool_steps = list(env.steps)
            env_info = env.unwrapped.runtime_info()
            outcome, verifier_error = _outcome(task, ts, tool_steps, env, family(task.env_id))
        finally:
            env.close()
        episode.tool_steps = tool_steps
        calls, unreadable_calls = self.calls_of(episode)
        steps, last = assemble_steps(tool_steps, calls)
        if ts.done and last is not None:  # what the harness asked after the env ended is not this episode's
            calls = calls[:last + 1]
        fault, context, own = inference_end(calls)
        termination, reason = classify(  # a request the harness got wrong is its own (a model outcome), no class
            steps, ts.end, outcome=outcome,
            env_error=episode.env_error, verifier_error=verifier_error, env_bug=episode.env_bug,
            inference_fault=fault, context_exceeded=context)
        if own:
            reason = f"{reason}; {own}"
        if termination == Termination.timeout and episode.episode_deadline_hit:
            termination, reason = self._own_time(episode, tool_steps, calls, reason)
        if unreadable_calls:
            # The harness's records (its requests, through the proxy) cannot be read: what the model saw
            # and sampled is unknown, so the episode fails, as the harness's own doing (in every statistic)
            termination = Termination.failure
            reason = (f"the harness's model call records could not be read ({len(unreadable_calls)}: "
                      f"{'; '.join(unreadable_calls[:3])}); {reason}")
        policy_id, policy_version = policy_of(calls)
        harness = {"episode": episode.name, "model_calls": len(calls), "records": records_of(calls)}
        if unreadable_calls:
            harness["unreadable_calls"] = len(unreadable_calls)
        episode.model_calls = calls
        return build_rollout(task, steps, termination, reason, policy_id=policy_id, policy_version=policy_version,
                             seed=episode.seed, started=episode.started, outcome=outcome,
                             env_info={**env_info, "harness": harness},
                             # a harness episode is not reproducible from a seed: its name is part of its identity
                             policy_params={"harness_episode": episode.name, "harness_run": episode.run_id})

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

    def calls_of(self, episode: Episode) -> tuple[list[ModelCall], list[str]]:
        """The episode's model calls (those its name's log got since it was opened: a name used again
        in a later run is a new episode, whatever the earlier one left there), and the lines of them
        that could not be read."""
        return self.log.scan(episode.name, episode.log_offset)

    def close(self, timeout_s: float = 300.0) -> dict[str, int]:
        """End every open episode, close every name, land what is spooled (retrying until `timeout_s`;
        what still fails stays spooled for the next landing), stop. {"rollouts": episodes landed}."""
        self._stop.set()  # first: the reaper ends nothing more
        for name, opened in list(self._episodes.items()):
            try:
                if opened.done() and opened.exception() is None:
                    self._end(opened.result())
            except Exception:  # one episode's failure never stops the others landing
                log.exception("harness episode %s could not be ended at shutdown", name)
        for name, record in list(self._names.items()):
            if not record.closed:
                with contextlib.suppress(Exception):
                    self._close_name(name, record)
        self._closing_deadline = time.monotonic() + timeout_s
        self._queue.put(None)
        self._lander.join(timeout_s + 5)
        if self._held_lock is not None:
            self._held_lock.close()
            self._held_lock = None
        return dict(self.landed)

    def wait_landed(self, timeout_s: float = 120.0) -> None:
        """Block until everything ended so far has landed (or stays spooled after failing to)."""
        deadline = time.monotonic() + timeout_s
        while (self._queue.unfinished_tasks or self._waiting) and time.monotonic() < deadline:
            time.sleep(0.02)

    # -- landing -----------------------------------------------------------------------------
    def _land_loop(self) -> None:
        """Land spooled episodes, oldest first, each batch on its own: a batch that fails stays spooled
        and is tried again (with a growing pause), and never holds up the others."""
        waiting: list[Episode] = []
        stopping, failures, first = False, 0, True
        while True:
            try:
                item = self._queue.get(timeout=min(30.0, 0.5 * 2 ** failures) if waiting else 0.5)
                items = [item]
                while True:  # everything ended meanwhile lands in the same catalog transaction
                    try:
                        items.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
            except queue.Empty:
                items = []
            for item in items:
                if item is None:
                    stopping = True
                else:
                    waiting.append(item)
            self._waiting = len(waiting)
            try:
                waiting = self._land_waiting(waiting, first)
                first, failures = False, 0 if not waiting else failures
            except Exception as exc:  # the catalog is locked or failing: all stays spooled, try again
                failures += 1
                if failures == 1 or failures % 10 == 0:
                    log.error("landing %d harness episodes failed (%s: %s); they stay spooled in %s and are "
                              "tried again", len(waiting), type(exc).__name__, str(exc)[:300],
                              Path(self.data_dir) / spool.SPOOL_DIR)
            finally:
                self._waiting = len(waiting)
                for _ in items:
                    self._queue.task_done()
            if stopping and (not waiting or time.monotonic() > self._closing_deadline):
                self.unlanded = len(waiting)
                if waiting:
                    log.error("%d harness episodes stay spooled in %s: the next landing lands them", len(waiting),
                              Path(self.data_dir) / spool.SPOOL_DIR)
                for episode in waiting:
                    episode.landed.set()
                return
            if stopping and waiting:
                time.sleep(0.5)

    def _land_waiting(self, waiting: list[Episode], first: bool) -> list[Episode]:
        """Land the spool (tasks.stages.land's rule: every spooled batch, oldest first; on the first pass also
        those a stopped server left), then let the landed episodes leave memory. What still waits."""
        mine = [e.spooled for e in waiting if e.spooled is not None and e.spooled.exists()]
        if self.land and ((first and spool.pending(self.data_dir)) or mine):
            with Warehouse(self.data_dir, lock_timeout_s=LAND_LOCK_TIMEOUT_S) as wh:
                if first:
                    land_spooled(wh)
                self._land_together(wh, [p for p in mine if p.exists()])
        still = []
        for episode in waiting:
            if episode.spooled is not None and episode.spooled.exists():
                still.append(episode)
                continue
            if episode.spooled is not None:  # its batch landed (here, or by any other landing), or was set aside
                aside = (episode.spooled.parent / spool.UNLANDABLE_DIR / episode.spooled.name).exists()
                key = "set_aside" if aside else "rollouts"
                self.landed[key] = self.landed.get(key, 0) + 1
            elif not self.land and episode.landing_error is None:
                self.rollouts.append(episode.rollout)
            with self._lock:
                self._episodes.pop(episode.name, None)
            episode.landed.set()
        return still

    def _land_together(self, wh: Warehouse, paths: list[Path]) -> None:
        """This hub's spooled episodes in one transaction (one set of lake files, not one per episode);
        if that batch fails, each on its own, so one episode's batch never keeps the others out."""
        if not paths:
            return
        try:
            merged: dict[str, list] = {}
            for path in paths:
                records, _ = spool.load(path)
                for key, rows in records.items():
                    merged.setdefault(key, []).extend(rows)
            landing = wh.land(**merged, rollout_outcomes=True)
            if landing.ok:
                for path in paths:
                    path.unlink()
                return
            log.error("a batch of %d harness episodes failed the quality gates (%s): landing each on its own",
                      len(paths), landing.quarantine)
        except Exception:
            log.exception("a batch of %d harness episodes did not land: landing each on its own", len(paths))
        for path in paths:
            try:  # tasks.stages.land's rule: an unlandable batch is set aside with its reason
                land_spool_file(wh, path)
            except Exception:  # a lock or a disk: this episode's batch alone stays spooled, tried again
                log.exception("the spooled batch %s did not land; it stays spooled", path.name)

    def _reap_loop(self, idle_s: float) -> None:
        while not self._stop.wait(min(1.0, idle_s / 4)):
            now = time.monotonic()
            for name, record in list(self._names.items()):
                try:  # one episode's failure never stops the reaper: it goes on for the others
                    if record.closed:
                        continue
                    opened = self._episodes.get(name)
                    episode = opened.result() if opened is not None and opened.done() and \
                        opened.exception() is None else None
                    active = max(record.last_active, episode.last_active if episode else 0.0)
                    if now - active > idle_s:
                        if episode is not None:
                            self._end(episode)
                        self._close_name(name, record)
                except Exception:
                    log.exception("ending idle harness episode %s failed", name)

    # -- a restart ---------------------------------------------------------------------------
    def _recover(self) -> None:
        """Episodes a stopped server left open (their write-ahead log is still there): replayed into
        a fresh env and ended, each on its own (one that cannot be read is set aside, loudly)."""
        for path in sorted(self.wal_dir.glob("*.jsonl")):
            try:
                episode = self._replay(path)
            except Exception:
                log.exception("the write-ahead log %s could not be replayed; set aside as %s.broken", path, path.name)
                with contextlib.suppress(OSError):
                    path.rename(path.with_name(path.name + ".broken"))
                continue
            if episode is None:
                path.unlink()
                continue
            self._episodes[episode.name] = done = Future()
            done.set_result(episode)
            self._end(episode)
            log.warning("harness episode %s, open when serve-env stopped, was replayed (%d tool calls) and ended",
                        episode.name, episode.calls)

    def _replay(self, path: Path) -> Episode | None:
        lines = path.read_bytes().split(b"\n")[:-1]  # a last line without its newline never ran
        if not lines:
            return None  # it stopped while opening: no harness had its token
        head = json.loads(lines[0])
        task = TaskSpec.model_validate(head["task"])
        env = standard_stack(family(task.env_id).make())
        ts = env.reset(task=task)
        episode = Episode(head["episode"], task, head["seed"], env, ts.observation, ts, head["run"], head["log_offset"])
        for line in lines[1:]:
            entry = json.loads(line)
            if episode.over:
                break
            self._step(episode, entry["tool"], entry["arguments"])
        if not episode.over:
            episode.env_error = (f"serve-env stopped while the episode was open (after {episode.calls} tool calls, "
                                 f"replayed at its restart): the harness lost its environment")
        return episode


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
