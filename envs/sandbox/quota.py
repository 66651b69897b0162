"""The workspace quota: bytes and files, enforced by the kernel while a command runs.

As root the workspace is its own tmpfs mounted on the host side (`size=`, `nr_inodes=`,
nosuid, nodev, owned by the sandbox uid), bound into the sandbox: a write past the quota fails
with ENOSPC at once, and nothing reaches the host's disk. Without the privilege to mount, the
workspace is a plain directory and its size and file count are checked after each command
(`mode` says which is in force)."""

from __future__ import annotations

import ctypes
import os

from gymfoundry.envs.sandbox import files
from gymfoundry.envs.sandbox.base import Limits

MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def mount_tmpfs(path: str, limits: Limits, uid: int, gid: int) -> None:
    """Mount a size- and inode-capped tmpfs on `path` (OSError if the kernel refuses)."""
    inodes = limits.workspace_files + 1  # the root directory takes one
    options = f"size={limits.workspace_mb * 1024 * 1024},nr_inodes={inodes},mode=0700,uid={uid},gid={gid}"
    if _libc.mount(b"gymfoundry-ws", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {path}: {os.strerror(err)}")


def unmount(path: str) -> None:
    """Detach a workspace mount (lazily: a process still inside cannot keep it attached)."""
    _libc.umount2(os.fsencode(path), MNT_DETACH)


def is_mount(path: str) -> bool:
    try:
        return os.path.ismount(path)
    except OSError:
        return False


def mode(mounted: bool) -> str:
    return "enforced" if mounted else "checked-after"


def describe(limits: Limits, mounted: bool) -> str:
    if mounted:
        return (f"{limits.workspace_mb} MiB and {limits.workspace_files} files, enforced while the command runs "
                "(own tmpfs: writes past the quota fail with ENOSPC)")
    return (f"{limits.workspace_mb} MiB and {limits.workspace_files} files, checked after each command "
            "(not root: no tmpfs of its own)")


def hits(workspace: str, limits: Limits, mounted: bool) -> list[str]:
    """The quota limits a command ran into (a full tmpfs, or an oversized plain directory)."""
    if mounted:
        st = os.statvfs(workspace)
        out = []
        if st.f_bavail == 0:
            out.append(f"workspace: the {limits.workspace_mb} MiB quota is full (further writes refused)")
        if st.f_favail == 0:
            out.append(f"workspace: the {limits.workspace_files}-file quota is full (further files refused)")
        return out
    used, count = files.disk_usage(workspace), files.count_entries(workspace)
    out = []
    if used > limits.workspace_mb * 1024 * 1024:
        out.append(f"workspace: {used // (1024 * 1024)} MiB exceeds the {limits.workspace_mb} MiB quota")
    if count > limits.workspace_files:
        out.append(f"workspace: {count} files exceed the {limits.workspace_files}-file quota")
    return out
