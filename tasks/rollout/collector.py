"""The garbage collector during a batch of episodes or of scoring.

A full collection walks every object the process holds. A factory process holds its tasks (and
whatever else it made) for the whole run, and a batch of episodes makes enough objects to set off
several full collections: with 2,500 inventory tasks alive, about a seventh of a batch's time
went to walking objects that existed before the batch and outlive it.

`frozen_before()` takes what exists when a batch starts out of the collector's sight for the
batch (`gc.freeze`) and hands it back at the end (`gc.unfreeze`). Collections go on as ever over
what the batch makes, reference cycles included (an episode that makes cycles has them collected
during the batch, unlike with the collector paused); what existed before and became garbage
meanwhile is collected after the batch.

The freeze is the process's: batches nested or running side by side in threads share one (the
first to start makes it, the last to end lifts it). So while batches keep overlapping (families
side by side), what existed before the first of them stays frozen, and a reference cycle among it
that became garbage meanwhile is collected only once none runs; what the batches make is
collected as ever. A process that froze objects itself (before forking workers, say:
`gc.get_freeze_count()` is not 0 when the first batch starts) gets no freeze from here, and its
own is left as it is; one that calls `gc.freeze()` while a batch runs has that freeze lifted with
the batch's. A child forked during a batch starts with no batch and no freeze of ours. Wrap plain
functions (a generator function's body would run after the `with` had ended).
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_batches = 0  # batches inside frozen_before() now
_ours = False  # whether the freeze in place is the one the first of them made


@contextmanager
def frozen_before() -> Iterator[None]:
    """Within: the objects that existed when the first running batch started are frozen (see above)."""
    global _batches, _ours
    with _lock:
        if _batches == 0:
            _ours = gc.get_freeze_count() == 0
            if _ours:
                gc.freeze()
        _batches += 1
    try:
        yield
    finally:
        with _lock:
            _batches -= 1
            if _batches == 0 and _ours:
                gc.unfreeze()
                _ours = False


def _forked() -> None:
    """In a child forked during a batch: none of the parent's batches runs here (the lock may have
    been held by a thread the child does not have)."""
    global _lock, _batches, _ours
    _lock = threading.Lock()
    _batches = 0
    if _ours:
        gc.unfreeze()
        _ours = False


os.register_at_fork(after_in_child=_forked)
