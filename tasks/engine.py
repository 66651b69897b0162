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
before the next starts.
Results come back in the order of the items, whatever order the episodes finished in."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from envs.records import PolicySpec
from tasks.policies import Policy

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


_held = threading.local()  # the slots this thread holds


@contextmanager
def _holding(limit: threading.BoundedSemaphore):
    """Hold one of `limit`'s slots, or go on with the one this thread holds already (a play that
    plays episodes of the same policy through the engine must not wait for itself)."""
    held = _held.__dict__.setdefault("slots", set())
    if id(limit) in held:
        yield
        return
    with limit:
        held.add(id(limit))
        try:
            yield
        finally:
            held.discard(id(limit))


def run_concurrently(policy: Policy, items: Sequence[Item], play: Callable[[Policy, Item], Result],
                     stop: threading.Event | None = None, concurrency: int | None = None) -> list[Result | None]:
    """`play(agent, item)` for every item, up to `concurrency` (default: `concurrency_of(policy)`)
    at once, each with an agent of its own (a fork of `policy`; `policy` itself when serial).
    Once `stop` is set, items not yet started are not played (their result is None). An
    exception raised by a `play` sets it; the first (in item order) is raised here once the
    episodes in flight have ended."""
    n = concurrency or concurrency_of(policy)
    stop = stop or threading.Event()
    limit = slots(policy, n)
    if n <= 1 or len(items) <= 1:
        # One slot for all of them: the batches of a serial policy in one process take turns
        # whole (one episode in flight, as max_concurrency 1 says; episodes in threads side by
        # side would only fight over the interpreter lock), and a lone episode holds one of N.
        with _holding(limit):
            return [None if stop.is_set() else play(policy, item) for item in items]
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
                return play(agent, item)
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
