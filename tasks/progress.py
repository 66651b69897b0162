"""Progress of long work, as the stages report it, for whoever listens in this process: the
CLI's `rich` bars (flows/cli.py), tests. Plain Python, thread-safe, no Prefect (the flows keep
their own progress artifacts). A listener is called as `listener(event, label, n)` with event
"start" (n = the total), "advance" (n done more) or "finish"; it must be quick, and an error in
it never reaches the work."""

from __future__ import annotations

import threading
from collections.abc import Callable

Listener = Callable[[str, str, int], None]

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


def _emit(event: str, label: str, n: int) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(event, label, n)
        except Exception:  # a display problem never stops the work
            pass


def start(label: str, total: int) -> None:
    _emit("start", label, total)


def advance(label: str, n: int = 1) -> None:
    _emit("advance", label, n)


def finish(label: str) -> None:
    _emit("finish", label, 0)
