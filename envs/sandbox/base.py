"""The sandbox interface every backend implements, and what a command returns.

A sandbox holds one workspace (created from a snapshot of files) and runs argument
vectors in it, never shell strings. Support files (a test runner, hidden tests) can be
placed read-only beside the workspace at `support_dir`."""

from __future__ import annotations

import posixpath
import threading
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from gymfoundry.envs.base import EnvFault

WORKSPACE = "/workspace"
MAX_OUTPUT_BYTES = 64 * 1024
MAX_ARGV_ITEMS = 256


class SandboxError(EnvFault):
    """The sandbox itself failed (could not start, crashed, lost its workspace). Only sandbox
    infrastructure raises it (never anything a command prints or exits with). Every one made in
    this process is counted (`fault_count`, `faults_since`) as a diagnostic, e.g. for a test that a
    hostile command caused none; attribution never reads the counter: a fault is known by where it
    was raised."""

    def __init__(self, *args: object):
        super().__init__(*args)
        with _FAULT_LOCK:
            _FAULTS.append(str(self))
            del _FAULTS[:-_KEEP_FAULTS]
            _FAULT_COUNT[0] += 1


class SandboxUnavailable(SandboxError):
    """No backend that can isolate untrusted code is available (and none was opted into)."""


_FAULT_LOCK = threading.Lock()
_FAULTS: list[str] = []  # the latest messages
_FAULT_COUNT = [0]
_KEEP_FAULTS = 20


def fault_count() -> int:
    """How many sandbox faults this process has seen (a mark for `faults_since`)."""
    with _FAULT_LOCK:
        return _FAULT_COUNT[0]


def faults_since(mark: int) -> list[str]:
    """The messages of the sandbox faults after `mark` (the latest few), oldest first."""
    with _FAULT_LOCK:
        n = _FAULT_COUNT[0] - mark
        return list(_FAULTS[-n:]) if n > 0 else []


class PathKind(str, Enum):
    """Why the sandbox refused a workspace path: the kind of the agent's error observation."""

    invalid_path = "invalid_path"
    outside_workspace = "outside_workspace"
    not_found = "not_found"
    is_a_directory = "is_a_directory"
    not_a_regular_file = "not_a_regular_file"
    symlink_refused = "symlink_refused"
    workspace_full = "workspace_full"
    workspace_too_large = "workspace_too_large"
    io_error = "io_error"


class PathError(ValueError):
    """A workspace path that is absolute, escapes the workspace or is otherwise refused."""

    def __init__(self, kind: PathKind, message: str):
        super().__init__(message)
        self.kind = PathKind(kind).value  # a plain string where it is stored


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed command (cgroup limits apply where writable)."""

    wall_s: float = 10.0
    cpu_s: int = 20
    memory_mb: int = 512
    address_space_mb: int = 2048
    file_size_mb: int = 16
    open_files: int = 256
    processes: int = 64
    tmp_mb: int = 64
    workspace_mb: int = 64
    cpus: float = 1.0
    workspace_files: int = 4096  # files and directories the workspace may hold

    def replace(self, **changes: Any) -> Limits:
        return Limits(**{**asdict(self), **changes})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CommandResult:
    exit_code: int | None  # None when the command was killed at the wall-clock limit
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0
    # Kernel-observed facts: forks refused at the pids limit, OOM kills, packets the command
    # tried to send (the sandbox has no network, so any attempt is refused).
    limits_hit: list[str] = field(default_factory=list)
    network_attempts: int = 0
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def normalize_path(path: str) -> str:
    """A workspace-relative path, or PathError. Absolute paths are accepted only under the
    workspace's own mount point."""
    if not isinstance(path, str) or not path.strip():
        raise PathError(PathKind.invalid_path, "path must be a non-empty string")
    if "\x00" in path:
        raise PathError(PathKind.invalid_path, "path contains a NUL byte")
    if path.startswith("/"):
        if path != WORKSPACE and not path.startswith(WORKSPACE + "/"):
            raise PathError(PathKind.outside_workspace, f"{path!r} is outside the workspace {WORKSPACE}")
        path = path[len(WORKSPACE):].lstrip("/") or "."
    norm = posixpath.normpath(path)
    if norm == ".." or norm.startswith("../"):
        raise PathError(PathKind.outside_workspace, f"{path!r} is outside the workspace")
    return norm


def check_argv(argv: list[str]) -> list[str]:
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError("argv must be a non-empty list of strings")
    if len(argv) > MAX_ARGV_ITEMS:
        raise ValueError(f"argv has {len(argv)} items; at most {MAX_ARGV_ITEMS}")
    if any("\x00" in a for a in argv):
        raise ValueError("argv items must not contain NUL bytes")
    return list(argv)


class Sandbox(ABC):
    """One isolated workspace. Use as a context manager or call `destroy()`."""

    backend: str
    support_dir: str
    workdir: str = WORKSPACE

    @abstractmethod
    def run(self, argv: list[str], timeout_s: float | None = None, stdin: bytes | None = None,
            limits: Limits | None = None) -> CommandResult:
        """Run an argument vector in the workspace; every process it started is gone when
        this returns (including ones that called setsid or double-forked)."""

    @abstractmethod
    def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes: ...

    @abstractmethod
    def write_file(self, path: str, data: bytes) -> None: ...

    @abstractmethod
    def list_files(self) -> list[str]:
        """Workspace-relative paths of the regular files in the workspace, sorted."""

    @abstractmethod
    def snapshot(self) -> dict[str, bytes]:
        """Copy the workspace out: regular files only (links and special files are skipped)."""

    @abstractmethod
    def reset(self) -> None:
        """Back to the snapshot the sandbox was created from."""

    @abstractmethod
    def destroy(self) -> None:
        """Kill anything running and delete the workspace. Idempotent."""

    @abstractmethod
    def guarantees(self) -> dict[str, Any]:
        """What is enforced, as recorded in every rollout's env_info."""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
