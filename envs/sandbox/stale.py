"""Sandbox directories left by a host process that died without cleaning up (SIGKILL, OOM).

Each sandbox directory `gymfoundry-sbx-<pid>-<random>` holds a lock file the owning process
keeps `flock`ed for the sandbox's lifetime; the kernel drops the lock when that process dies,
whatever killed it. The lock file is created under a temporary name, locked, then renamed into
place, so a sweeper that finds the lock file unlocked knows its owner is gone (a pid can be
reused; a lock cannot outlive its holder). A directory still without a lock file belongs to a
process in the middle of creating it: it is left alone while the pid in its name is alive.
Sweeping a stale directory kills what is left of its uid (unless another lock file records the
same uid), detaches its workspace mount and removes it; another live process's sandbox is never
touched. The uids recorded in lock files are also never handed to a new sandbox
(`recorded_uids`), so two processes do not share a sandbox uid."""

from __future__ import annotations

import fcntl
import json
import os
import shutil

from gymfoundry.envs.sandbox import quota

DIR_PREFIX = "gymfoundry-sbx-"
LOCK = "owner.lock"


def take_ownership(directory: str, uid: int | None) -> int:
    """Create and lock the directory's lock file; the returned fd must stay open."""
    tmp = os.path.join(directory, LOCK + ".tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"pid": os.getpid(), "uid": uid}).encode())
    os.rename(tmp, os.path.join(directory, LOCK))
    return fd


def recorded_uids(base: str) -> list[int]:
    """The sandbox uids recorded in every lock file under `base` (live or stale: a uid stays
    reserved until its directory is swept), with repeats."""
    uids = []
    for entry in _entries(base):
        try:
            with open(os.path.join(entry.path, LOCK), "rb") as fh:
                uid = json.loads(fh.read(4096) or b"{}").get("uid")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(uid, int):
            uids.append(uid)
    return uids


def _entries(base: str) -> list[os.DirEntry]:
    try:
        return [e for e in os.scandir(base) if e.name.startswith(DIR_PREFIX)]
    except OSError:
        return []


def _pid_alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _owner_pid(name: str) -> int | None:
    head = name.removeprefix(DIR_PREFIX).split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _claim(path: str) -> tuple[int, dict] | None:
    """The stale directory's lock fd (now ours) and its record, or None if it is in use."""
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        pid = _owner_pid(os.path.basename(path))
        if pid is None or _pid_alive(pid):
            return None  # being created, or not ours to judge
        return -1, {}
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None  # its owner is alive
    try:
        record = json.loads(os.read(fd, 4096) or b"{}")
    except ValueError:
        record = {}
    return fd, record if isinstance(record, dict) else {}


def sweep(base: str, kill_uid) -> list[str]:
    """Remove every stale sandbox directory under `base` owned by our euid; returns their paths."""
    removed = []
    for entry in _entries(base):
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.geteuid():
                continue
        except OSError:
            continue
        claimed = _claim(entry.path)
        if claimed is None:
            continue
        fd, record = claimed
        uid = record.get("uid")
        # never a uid another sandbox holds (read now, not before the loop: one may have started since)
        if isinstance(uid, int) and uid > 0 and recorded_uids(base).count(uid) == 1:
            kill_uid(uid)
        workspace = os.path.join(entry.path, "workspace")
        if quota.is_mount(workspace):
            quota.unmount(workspace)
        shutil.rmtree(entry.path, ignore_errors=True)
        if fd >= 0:
            os.close(fd)
        removed.append(entry.path)
    return removed
