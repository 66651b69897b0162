"""The rollout engine: many episodes in flight at once, over the same env stack, wrappers,
retry policy and records as a single episode.

Each in-flight episode runs in a thread of its own with a policy instance of its own, made by
`policy.fork()` (same weights, client, knobs, id and version; a fresh episode state). An
endpoint policy then has up to N requests in flight; the `hf` policy's forks share a batcher
that decodes their turns in one batched forward. N is the spec's `max_concurrency` and holds
per worker process: every batch of one run in one process draws from the same N slots
(`slots`), so N is what the endpoint sees however many Prefect batch tasks run side by side.

A policy that cannot fork (a custom policy without `fork`), or whose N is 1, plays its episodes
one after another, and its batches in one process take turns, each playing all of its episodes
before the next starts. A serial batch is played in one thread, watched by the caller's for the
step time limit (tasks.rollout.scheduler.play_watched: one hand-off per batch, not per episode).
Results come back in the order of the items, whatever order the episodes finished in."""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import TypeVar

from gymfoundry.envs.records import PolicySpec
from gymfoundry.tasks.rollout.collector import frozen_before
from gymfoundry.tasks.rollout.scheduler import play_watched
from gymfoundry.tasks.policies.base import Policy

Item = TypeVar("Item")
Result = TypeVar("Result")

_SLOTS: dict[tuple, threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def concurrency_of(policy: Policy) -> int:
    """How many episodes of `policy` may be in flight: its spec's `max_concurrency`, or 1."""
    spec = getattr(policy, "spec", None)
    n = spec.max_concurrency if isinstance(spec, PolicySpec) else 1
    return n if n > 1 and callable(getattr(policy, "fork", None)) else 1


def slots(policy: Policy, n: int) -> threading.BoundedSemaphore:
    """The process-wide `n` slots of one policy (by id, version and endpoint)."""
    # a policy object without the protocol's id and version shares its slots with no other
    ident = (policy.policy_id, policy.version) if hasattr(policy, "policy_id") and hasattr(policy, "version") \
        else ("object", id(policy))
    key = (*ident, getattr(policy, "base_url", None), n)
    with _SLOTS_LOCK:
        return _SLOTS.setdefault(key, threading.BoundedSemaphore(n))


# The slots held by the serial batch this code runs in: a context variable, so that the thread
# that plays a batch's items (which runs in a copy of the caller's context) sees them too.
_held: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("held_slots", default=frozenset())


@contextmanager
def _holding(limit: threading.BoundedSemaphore):
    """Hold one of `limit`'s slots, or go on with the one held already by the batch this code runs
    in (a play that plays episodes of the same policy through the engine must not wait for itself)."""
    held = _held.get()
    if id(limit) in held:
        yield
        return
    with limit:
        token = _held.set(held | {id(limit)})
        try:
            yield
        finally:
            _held.reset(token)


@frozen_before()  # what exists before is out of the garbage collector's sight while it runs
def run_concurrently(policy: Policy, items: Sequence[Item], play: Callable[[Policy, Item], Result],
                     stop: threading.Event | None = None, concurrency: int | None = None) -> list[Result | None]:
    """`play(agent, item)` for every item, up to `concurrency` (default: `concurrency_of(policy)`)
    at once, each with an agent of its own (a fork of `policy`; `policy` itself when serial).
    Once `stop` is set, items not yet started are not played (their result is None). An
    exception raised by a `play` sets it (when concurrent); the first (in item order) is raised
    here once the episodes in flight have ended (when serial: at once, and the items after it
    are not played). A generator that `play` returns (a generator function's, or one it hands
    on, as evaluate_policy's `episode(...)`) is played, NOT returned: it is a play of
    tasks.rollout.scheduler.play_watched, its episodes yielded as `(env, loop)`, and what it returns is the
    item's result (a `play` whose result is a generator must wrap it, in a list say). Serial items
    are played one after another in one thread watched by this one (one hand-off per batch), a
    concurrent item in a thread of its own watched by the pool's."""
    n = concurrency or concurrency_of(policy)
    stop = stop or threading.Event()
    limit = slots(policy, n)
    if n <= 1 or len(items) <= 1:
        # One slot for all of them: the batches of a serial policy in one process take turns
        # whole (one episode in flight, as max_concurrency 1 says; episodes in threads side by
        # side would only fight over the interpreter lock), and a lone episode holds one of N.
        with _holding(limit):
            return play_watched([partial(_unless, stop, play, policy, item) for item in items])
    agents: queue.SimpleQueue[Policy] = queue.SimpleQueue()

    def one(item: Item) -> Result | None:
        with limit:
            if stop.is_set():
                return None
            agent = None
            try:
                try:
                    agent = agents.get_nowait()
                except queue.Empty:
                    agent = policy.fork()
                out = play(agent, item)
                return play_watched([lambda: out])[0] if isinstance(out, Generator) else out
            except BaseException:
                stop.set()  # an error ends the run: nothing further starts
                raise
            finally:
                if agent is not None:
                    agents.put(agent)

    with ThreadPoolExecutor(max_workers=min(n, len(items)), thread_name_prefix="episode") as pool:
        futures = [pool.submit(one, item) for item in items]
        errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error
    return [f.result() for f in futures]


def _unless(stop: threading.Event, play: Callable[[Policy, Item], Result], agent: Policy, item: Item) -> Result | None:
    """`play(agent, item)`, or None once `stop` is set."""
    return None if stop.is_set() else play(agent, item)
