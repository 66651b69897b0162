"""The Docker backend: used when a Docker engine answers a ping within a short timeout.

One container per sandbox: no network, read-only root filesystem, memory / pids / CPU
limits, all capabilities dropped, no-new-privileges, a tmpfs /tmp, a volume for the
workspace (owned by the non-root sandbox uid) and one for the support files (owned by
root, so the sandbox uid can read but not change them). Commands run with `docker exec`
as the non-root uid under `timeout -s KILL`; after each command every process of that uid
is killed, so nothing started by a command outlives it."""

from __future__ import annotations

import functools
import io
import os
import posixpath
import tarfile
import threading
import time
from typing import Any

from gymfoundry.envs.sandbox import files
from gymfoundry.envs.sandbox.bubblewrap import _network_attempts
from gymfoundry.envs.sandbox.base import (MAX_OUTPUT_BYTES, WORKSPACE, CommandResult, Limits, PathError, PathKind,
                               Sandbox, SandboxError, check_argv, normalize_path)

IMAGE = "python:3.11-slim"
SUPPORT_DIR = "/opt/gymfoundry"
SANDBOX_UID = 65534
PING_TIMEOUT_S = 1.0
ENV = {"HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}


def image() -> str:
    return os.environ.get("GYMFOUNDRY_DOCKER_IMAGE", IMAGE)


@functools.cache
def probe() -> tuple[bool, str]:
    """Does an engine answer within PING_TIMEOUT_S, with the sandbox image present locally?"""
    try:
        import docker

        client = docker.from_env(timeout=PING_TIMEOUT_S)
        client.ping()
    except Exception as exc:  # no engine, no socket, refused, timed out: all mean "not available"
        return False, f"no Docker engine answered within {PING_TIMEOUT_S:g}s ({type(exc).__name__})"
    try:
        client.images.get(image())
    except Exception:
        return False, f"image {image()} is not present locally (docker pull {image()})"
    return True, "ok"


def _tar(entries: dict[str, bytes], uid: int, mode: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs = sorted({posixpath.dirname(p) for p in entries} - {""})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, uid, uid
            tar.addfile(info)
        for path, data in sorted(entries.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), mode, uid, uid, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _network_packets(text: str) -> int:
    return _network_attempts(text)


class DockerSandbox(Sandbox):
    backend = "docker"
    support_dir = SUPPORT_DIR

    def __init__(self, snapshot: dict[str, bytes | str], support: dict[str, bytes | str] | None = None,
                 limits: Limits | None = None, client: Any = None):
        import docker

        self.limits = limits or Limits()
        self.client = client or docker.from_env(timeout=max(60, int(self.limits.wall_s) + 30))
        self._initial = {k: files.as_bytes(v) for k, v in snapshot.items()}
        self._lock = threading.Lock()
        self._destroyed = False
        self._packets = 0
        self._volumes = []
        self.container = None
        try:
            self._volumes = [self.client.volumes.create(labels={"gymfoundry": "sandbox"}) for _ in range(2)]
            workspace, support_volume = self._volumes
            mib = 1024 * 1024
            ulimits = [docker.types.Ulimit(name="cpu", soft=self.limits.cpu_s, hard=self.limits.cpu_s),
                       docker.types.Ulimit(name="fsize", soft=self.limits.file_size_mb * mib,
                                           hard=self.limits.file_size_mb * mib),
                       docker.types.Ulimit(name="nofile", soft=self.limits.open_files, hard=self.limits.open_files)]
            self.container = self.client.containers.run(
                image(), ["sleep", "infinity"], detach=True, user="0:0", init=True,
                # root keeps only what the setup execs need; commands run as a uid without capabilities
                network_mode="none", read_only=True, cap_drop=["ALL"], cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER"],
                security_opt=["no-new-privileges"],
                mem_limit=f"{self.limits.memory_mb}m", memswap_limit=f"{self.limits.memory_mb}m",
                pids_limit=self.limits.processes, nano_cpus=int(self.limits.cpus * 1e9), ulimits=ulimits,
                tmpfs={"/tmp": f"size={self.limits.tmp_mb}m,mode=1777"},
                volumes={workspace.name: {"bind": WORKSPACE, "mode": "rw"},
                         support_volume.name: {"bind": SUPPORT_DIR, "mode": "rw"}},
                working_dir=WORKSPACE, labels={"gymfoundry": "sandbox"})
            self._exec_root(["chown", f"{SANDBOX_UID}:{SANDBOX_UID}", WORKSPACE])
            self._exec_root(["chmod", "0755", SUPPORT_DIR])
            support_files = {k: (v.encode() if isinstance(v, str) else v) for k, v in (support or {}).items()}
            if support_files:  # owned by root: readable, never writable, by the sandbox uid
                self.container.put_archive(SUPPORT_DIR, _tar(support_files, 0, 0o444))
            self._populate()
            self._packets = self._count_packets()
        except SandboxError:
            self.destroy()
            raise
        except Exception as exc:
            self.destroy()
            raise SandboxError(f"docker sandbox failed to start: {type(exc).__name__}: {exc}") from exc

    def _exec_root(self, argv: list[str]) -> tuple[int, bytes]:
        result = self.container.exec_run(argv, user="0:0")
        return result.exit_code, result.output

    def _populate(self) -> None:
        if self._initial:
            self.container.put_archive(WORKSPACE, _tar(self._initial, SANDBOX_UID, 0o644))

    def _count_packets(self) -> int:
        _, out = self._exec_root(["cat", "/proc/net/snmp", "/proc/net/snmp6"])
        return _network_packets(out.decode("utf-8", "replace"))

    def run(self, argv: list[str], timeout_s: float | None = None, stdin: bytes | None = None,
            limits: Limits | None = None) -> CommandResult:
        argv = check_argv(argv)
        limits = limits or self.limits
        timeout = max(0.1, min(timeout_s if timeout_s is not None else limits.wall_s, limits.wall_s))
        self._check()
        command = ["timeout", "-s", "KILL", f"{timeout:g}s", *argv]
        if stdin is not None:  # the root is read-only and /tmp a tmpfs: the support volume takes it
            name = f".stdin-{time.monotonic_ns()}"
            self.container.put_archive(SUPPORT_DIR, _tar({name: stdin}, SANDBOX_UID, 0o400))
            command = ["sh", "-c", 'f=$1; shift; exec "$@" < "$f"', "sh", f"{SUPPORT_DIR}/{name}", *command]
        api = self.client.api
        started = time.perf_counter()
        try:
            exec_id = api.exec_create(self.container.id, command, user=f"{SANDBOX_UID}:{SANDBOX_UID}",
                                      workdir=WORKSPACE, environment=ENV)["Id"]
            out, err, truncated = bytearray(), bytearray(), False
            for chunk_out, chunk_err in api.exec_start(exec_id, stream=True, demux=True):
                for buf, chunk in ((out, chunk_out), (err, chunk_err)):
                    if chunk:
                        room = MAX_OUTPUT_BYTES - len(buf)
                        truncated |= len(chunk) > room
                        buf.extend(chunk[:max(0, room)])
            exit_code = api.exec_inspect(exec_id)["ExitCode"]
        except Exception as exc:
            raise SandboxError(f"docker exec failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self._exec_sandbox_uid_kill()
        duration = time.perf_counter() - started
        timed_out = exit_code == 137 and duration >= timeout - 0.05
        packets = self._count_packets()
        attempts, self._packets = max(0, packets - self._packets), packets
        hits = ["wall clock: time limit reached"] if timed_out else []
        if exit_code == 125 or b"OCI runtime exec failed" in err:
            raise SandboxError(f"docker could not start the command: {err.decode('utf-8', 'replace')[-300:]}")
        return CommandResult(exit_code=None if timed_out else exit_code, stdout=out.decode("utf-8", "replace"),
                             stderr=err.decode("utf-8", "replace"), timed_out=timed_out,
                             duration_s=round(duration, 6), limits_hit=hits, network_attempts=attempts,
                             truncated=truncated)

    def _exec_sandbox_uid_kill(self) -> None:
        """Whatever a command left behind (setsid, double fork) dies with it."""
        try:
            self.container.exec_run(["sh", "-c", "kill -9 -1"], user=f"{SANDBOX_UID}:{SANDBOX_UID}")
        except Exception:
            pass

    def _check(self) -> None:
        if self._destroyed:
            raise SandboxError("the sandbox was destroyed")

    def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        self._check()
        rel = normalize_path(path)
        try:
            stream, _ = self.container.get_archive(f"{WORKSPACE}/{rel}")
        except Exception as exc:
            raise PathError(PathKind.not_found, f"no such file: {rel}") from exc
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r") as tar:
            member = tar.next()
            if member is None or member.isdir():
                raise PathError(PathKind.is_a_directory, f"{rel} is a directory")
            if not member.isfile():
                raise PathError(PathKind.not_a_regular_file, f"{rel} is not a regular file")
            return tar.extractfile(member).read(max_bytes)

    def write_file(self, path: str, data: bytes) -> None:
        self._check()
        rel = normalize_path(path)
        self.container.put_archive(WORKSPACE, _tar({rel: data}, SANDBOX_UID, 0o644))

    def list_files(self) -> list[str]:
        return sorted(self.snapshot())

    def snapshot(self) -> dict[str, bytes]:
        self._check()
        stream, _ = self.container.get_archive(WORKSPACE + "/.")
        out, total = {}, 0
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r") as tar:
            for member in tar:
                name = member.name.split("/", 1)[1] if "/" in member.name else ""
                if not name or not member.isfile() or "__pycache__" in name.split("/"):
                    continue
                total += member.size
                if total > self.limits.workspace_mb * 1024 * 1024:
                    raise PathError(PathKind.workspace_too_large, "the workspace exceeds its quota")
                out[name] = tar.extractfile(member).read()
        return out

    def reset(self) -> None:
        self._check()
        self.container.exec_run(["find", WORKSPACE, "-mindepth", "1", "-delete"], user="0:0")
        self._populate()

    def destroy(self) -> None:
        with self._lock:
            self._destroyed = True
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except Exception:
                pass
            self.container = None
        for volume in self._volumes:
            try:
                volume.remove(force=True)
            except Exception:
                pass
        self._volumes = []

    def guarantees(self) -> dict[str, Any]:
        return describe(self.limits)


def describe(limits: Limits) -> dict[str, Any]:
    return {
        "backend": "docker", "isolated": True, "image": image(),
        "user": f"non-root uid {SANDBOX_UID} for commands (no capabilities), no-new-privileges",
        "network": "none (network_mode=none)",
        "filesystem": f"read-only root, {WORKSPACE} volume writable, tmpfs /tmp {limits.tmp_mb} MiB, "
                      f"support files root-owned at {SUPPORT_DIR}",
        "rlimits": {"cpu_s": limits.cpu_s, "file_size_mb": limits.file_size_mb, "open_files": limits.open_files},
        "cgroup": {"limits": {"memory": f"{limits.memory_mb} MiB", "pids": str(limits.processes),
                              "cpu": f"{limits.cpus:g} CPU"}, "kill": "kill -9 -1 as the sandbox uid"},
        "wall_clock": f"{limits.wall_s:g}s per command (timeout -s KILL), then every process of the uid is killed",
    }
