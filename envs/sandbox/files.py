"""Workspace file operations done by the host on a directory the sandbox can write.

The host may run as root, and the sandboxed code may have planted symlinks, FIFOs or
device-like files in the workspace. So every path is opened one component at a time
relative to the workspace with O_NOFOLLOW, and only regular files are read or written.

The tree is the agent's too: directories are walked through directory fds without recursion
(a chain deeper than Python's stack or longer than PATH_MAX lists like any other), directories
below MAX_DEPTH and names that are not UTF-8 are not part of the workspace (not listed, not
submitted: a name that cannot be stored would make every record naming it unstorable), and a
write refused by the workspace quota is the agent's `workspace_full`, not a crash."""

from __future__ import annotations

import errno
import os
import shutil
import stat

from gymfoundry.envs.sandbox.base import PathError, PathKind, normalize_path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 32  # directories below this many levels are not listed (one open fd per level)
QUOTA_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def as_bytes(data: bytes | str) -> bytes:
    """A file's bytes; text is encoded losslessly (`surrogateescape` gives back the bytes a
    submission held that were not UTF-8, so the grader's copy is the agent's, byte for byte)."""
    return data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data


def _open_parent(root: str, rel: str, create: bool, owner: tuple[int, int] | None) -> tuple[int, str]:
    """An fd of the directory holding `rel`, and the last component's name."""
    parts = rel.split("/")
    fd = os.open(root, DIR_FLAGS)
    try:
        for part in parts[:-1]:
            try:
                next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise PathError(PathKind.not_found, f"no such file: {rel}") from None
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise _path_error(rel, exc) from None
                if owner:
                    os.fchown(next_fd, *owner)
            except OSError as exc:
                raise _path_error(rel, exc) from None
            os.close(fd)
            fd = next_fd
        return fd, parts[-1]
    except BaseException:
        os.close(fd)
        raise


def _path_error(rel: str, exc: OSError) -> PathError:
    if exc.errno in QUOTA_ERRNOS:
        return PathError(PathKind.workspace_full, f"{rel}: the workspace quota is full ({exc.strerror}); the file "
                                                  "may be partly written: remove files to make room")
    if exc.errno == errno.ELOOP:
        return PathError(PathKind.symlink_refused, f"{rel} goes through a symbolic link; links are not followed")
    if exc.errno == errno.ENOTDIR:
        return PathError(PathKind.not_found, f"no such file: {rel}")
    if exc.errno == errno.ENOENT:
        return PathError(PathKind.not_found, f"no such file: {rel}")
    if exc.errno == errno.EISDIR:
        return PathError(PathKind.is_a_directory, f"{rel} is a directory")
    return PathError(PathKind.io_error, f"{rel}: {exc.strerror}")


def read_file(root: str, path: str, max_bytes: int) -> bytes:
    rel = normalize_path(path)
    if rel == ".":
        raise PathError(PathKind.is_a_directory, "the workspace root is a directory")
    parent, name = _open_parent(root, rel, create=False, owner=None)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
    except OSError as exc:
        raise _path_error(rel, exc) from None
    finally:
        os.close(parent)
    mode = os.fstat(fd).st_mode  # before fdopen, which raises IsADirectoryError on a directory
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise PathError(PathKind.is_a_directory, f"{rel} is a directory")
        raise PathError(PathKind.not_a_regular_file, f"{rel} is not a regular file")
    with os.fdopen(fd, "rb") as fh:
        return fh.read(max_bytes)


def write_file(root: str, path: str, data: bytes, owner: tuple[int, int] | None) -> None:
    rel = normalize_path(path)
    if rel == ".":
        raise PathError(PathKind.is_a_directory, "the workspace root is a directory")
    parent, name = _open_parent(root, rel, create=True, owner=owner)
    try:
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         0o644, dir_fd=parent)
        except OSError as exc:
            raise _path_error(rel, exc) from None
    finally:
        os.close(parent)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathError(PathKind.not_a_regular_file, f"{rel} is not a regular file")
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if owner:
            os.fchown(fd, *owner)
    except OSError as exc:
        if exc.errno not in QUOTA_ERRNOS:
            raise
        raise _path_error(rel, exc) from None
    finally:
        os.close(fd)


def list_files(root: str) -> list[str]:
    """Regular files under root, workspace-relative; links, special files, `__pycache__`,
    directories below MAX_DEPTH and names that are not UTF-8 are skipped."""
    out: list[str] = []
    top = os.open(root, DIR_FLAGS)
    try:
        stack = [(top, "", os.scandir(top))]
    except BaseException:
        os.close(top)
        raise
    try:
        while stack:
            fd, prefix, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                entries.close()
                os.close(fd)
                continue
            if not _storable(entry.name):
                continue
            if entry.is_dir(follow_symlinks=False):
                if entry.name == "__pycache__" or len(stack) > MAX_DEPTH:
                    continue
                try:
                    child = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue  # replaced by something else since it was listed
                try:
                    stack.append((child, f"{prefix}{entry.name}/", os.scandir(child)))
                except BaseException:
                    os.close(child)
                    raise
            elif entry.is_file(follow_symlinks=False):
                out.append(prefix + entry.name)
    finally:
        for fd, _, entries in stack:
            entries.close()
            os.close(fd)
    return sorted(out)


def _storable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.fsdecode gave a lone surrogate for a byte that is not UTF-8
        return False
    return True


def snapshot(root: str, max_total_bytes: int) -> dict[str, bytes]:
    files, total = {}, 0
    for rel in list_files(root):
        try:
            data = read_file(root, rel, max_total_bytes - total + 1)
        except PathError:
            continue  # replaced by something else since it was listed
        total += len(data)
        if total > max_total_bytes:
            raise PathError(PathKind.workspace_too_large, f"the workspace holds more than {max_total_bytes} bytes")
        files[rel] = data
    return files


def populate(root: str, files: dict[str, bytes | str], owner: tuple[int, int] | None) -> None:
    for rel, data in sorted(files.items()):
        write_file(root, rel, as_bytes(data), owner)


def clear(root: str) -> None:
    """Remove everything inside root (rmtree never follows links)."""
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)


def disk_usage(root: str) -> int:
    total = 0
    for directory, dirs, names in os.walk(root):
        for name in names + dirs:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                pass
    return total


def count_entries(root: str) -> int:
    """Files, directories and other entries under root (what the file quota counts)."""
    return sum(len(names) + len(dirs) for _, dirs, names in os.walk(root))
