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
first to start makes it, the last to end lifts it). A process that froze objects itself (before
forking workers, say: `gc.get_freeze_count()` is not 0 when the first batch starts) gets no
freeze from here, and its own is left as it is.
"""

from __future__ import annotations

import gc
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
