"""The HTTP limits both harness servers (`gymfoundry serve-env`, `gymfoundry proxy`) run under:
uvicorn's h11 protocol with what it lacks against slow and many clients, and one rate limit on
the lines refused and cut connections write. Plain uvicorn/h11; no MCP, no app code."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import threading
import time
from collections.abc import Iterator
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import get_local_addr

# a request's headers and body must arrive within this from its first byte (slowloris); 8 MiB, the
# proxy's largest body, needs about 2 Mbit/s
READ_TIMEOUT_S = 30.0
KEEP_ALIVE_S = 10  # an idle kept-alive connection is closed after this (past httpx's 5 s: the client lets go first)
LOG_EVERY_S = 10.0
log = logging.getLogger("gymfoundry.http")


class RateLimited(logging.Filter):
    """Lets each warning through at most once per `every_s`, saying how many like it were held back:
    a flood of hostile clients must not become a flood of log lines. Lines are told apart by their
    text (a server's lines name its address, so two servers in one process do not share a clock)."""

    def __init__(self, every_s: float = LOG_EVERY_S):
        super().__init__()
        self.every_s, self.seen = every_s, {}  # text -> [when last let through, held back since]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        message, now = record.getMessage(), time.monotonic()
        if len(self.seen) > 256:  # texts a client chose must not grow this without bound
            self.seen.clear()
        seen = self.seen.setdefault(message, [now - self.every_s, 0])
        if now - seen[0] < self.every_s:
            seen[1] += 1
            return False
        if seen[1]:
            record.msg, record.args = f"{message} ({seen[1]} more since the last line)", None
        self.seen[message] = [now, 0]
        return True


LINES = RateLimited()


def default_max_connections() -> int:
    """Connections served at once by default: half the descriptors this process may open (the
    envs, sandboxes, logs, the upstream's connections and the warehouse need the rest), at most 1024."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = 4096 if soft == resource.RLIM_INFINITY else soft
    return max(8, min(1024, (soft - 64) // 2))


def check_limits(max_connections: int | None, read_timeout_s: float) -> int:
    """The connection cap to serve with (None: `default_max_connections`); ValueError naming the
    option when a limit is not positive."""
    if max_connections is not None and max_connections < 1:
        raise ValueError(f"--max-connections must be a positive number of connections, not {max_connections}")
    if not read_timeout_s > 0:
        raise ValueError(f"--read-timeout must be a positive number of seconds, not {read_timeout_s:g}")
    return max_connections or default_max_connections()


def guarded_protocol(max_connections: int, read_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol closing a connection past `max_connections` as it is accepted
    (uvicorn's own `limit_concurrency` answers 503 only once a request head is whole, so slow
    clients would hold every descriptor meanwhile), and cutting one whose request's headers and body
    have not all arrived `read_timeout_s` after its first byte (or after the connection opened):
    uvicorn times out only idle kept-alive connections."""

    class Guarded(H11Protocol):
        _read_timer: asyncio.TimerHandle | None = None
        _refused = False

        def connection_made(self, transport) -> None:
            if len(self.connections) >= max_connections:
                self._refused, self.transport = True, transport
                transport.abort()
                log.warning("http %s: connection refused: %d open, the most served at once (--max-connections)",
                            _where(transport), max_connections)
                return
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            if not self._refused:
                super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._read_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # a new request on a kept-alive connection: its own clock
            super().data_received(data)
            if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
                self._disarm()  # the request is read whole: what the app does with it takes its own time

        def _arm(self) -> None:
            self._disarm()
            self._read_timer = self.loop.call_later(read_timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def _too_slow(self) -> None:
            self._read_timer = None
            if not self.transport.is_closing():
                log.warning("http %s: connection cut: its request was not in within %g s (--read-timeout)",
                            _where(self.transport), read_timeout_s)
                self.transport.abort()

    return Guarded


def _where(transport) -> str:
    host, port = get_local_addr(transport) or ("?", None)
    return f"{host}:{port}"


def guarded_config(app: Any, host: str = "127.0.0.1", port: int = 0, *, max_connections: int | None = None,
                   read_timeout_s: float = READ_TIMEOUT_S, keep_alive_s: int = KEEP_ALIVE_S,
                   **options: Any) -> uvicorn.Config:
    """A uvicorn config with the limits a server facing many (and hostile) harnesses needs: the
    connection cap and request-read timeout of `guarded_protocol`, uvicorn's `limit_concurrency`
    (requests in progress; 503 past it), its keep-alive timeout, and h11's bound on an incomplete
    request head (`h11_max_incomplete_event_size`, 64 KiB). Warnings about refused, cut or invalid
    connections (the guard's and uvicorn's) are held to one of a kind per 10 s."""
    cap = check_limits(max_connections, read_timeout_s)
    config = uvicorn.Config(app, host=host, port=port, http=guarded_protocol(cap, read_timeout_s),
                            limit_concurrency=cap + 1,  # uvicorn counts the asking connection itself
                            timeout_keep_alive=keep_alive_s, h11_max_incomplete_event_size=64 * 1024,
                            **{"log_level": "warning", **options})
    for name in ("uvicorn.error", log.name):  # after Config: it configures uvicorn's loggers
        logging.getLogger(name).addFilter(LINES)  # the same filter is not added twice
    return config


@contextlib.contextmanager
def served(app: Any, host: str = "127.0.0.1", port: int = 0, **limits: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a thread (port 0: any free one), with `guarded_config`'s
    limits (`limits`: its keywords); yields its base URL (`http://host:port`) and stops it on exit."""
    server = uvicorn.Server(guarded_config(app, host, port, lifespan="on", timeout_graceful_shutdown=5,
                                           backlog=512, **limits))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server on {host}:{port} did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)


def bearer(request: Any) -> str | None:
    """The token of a request's `Authorization: Bearer <token>` (a harness's episode token: its MCP
    client's header, its OpenAI client's api_key), or None."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None
