"""Progress of long work, as the stages report it, for whoever listens in this process: the
CLI's `rich` bars (flows/progress_bars.py), the flows' Prefect logs and progress artifacts,
tests. Plain Python, thread-safe, no Prefect. A listener is called as
`listener(event, label, n, detail)` with event "start" (n = the total), "advance" (n done more),
"note" (`detail`: a line worth logging, e.g. a training loss) or "finish"; it must be quick, and
an error in it never reaches the work."""

from __future__ import annotations

import threading
from collections.abc import Callable

TRAINING = "training"  # the label of a training run's progress (tasks/training/progress.py)
PERMILLE = 1000        # its total: thousandths of the run's budget

Listener = Callable[[str, str, int, str | None], None]

_listeners: list[Listener] = []
_lock = threading.Lock()


def listen(listener: Listener) -> Callable[[], None]:
    """Add a listener; returns the function that removes it."""
    with _lock:
        _listeners.append(listener)
    return lambda: _remove(listener)


def _remove(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def _emit(event: str, label: str, n: int, detail: str | None = None) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(event, label, n, detail)
        except Exception:  # a display problem never stops the work
            pass


def start(label: str, total: int) -> None:
    _emit("start", label, total)


def advance(label: str, n: int = 1) -> None:
    _emit("advance", label, n)


def note(label: str, detail: str) -> None:
    _emit("note", label, 0, detail)


def finish(label: str) -> None:
    _emit("finish", label, 0)
