"""The unsandboxed backend: only when the user opts in explicitly.

Commands run as plain processes in a host directory. When the host runs as root they
still drop to a fresh non-root uid with rlimits and cgroup limits (where writable), but
there are no namespaces: the command sees the host's files and network."""

from __future__ import annotations

import os
from typing import Any

from gymfoundry.envs.sandbox.base import Limits
from gymfoundry.envs.sandbox.bubblewrap import BubblewrapSandbox, describe


class LocalSandbox(BubblewrapSandbox):
    backend = "unsafe-local"
    requires_bwrap = False

    def __init__(self, snapshot, support=None, limits: Limits | None = None):
        super().__init__(snapshot, support, limits)
        self.support_dir = self.support_host
        self.workdir = self.workspace
        self.bin = os.path.join(self.dir, "bin")
        os.mkdir(self.bin, 0o755)
        if self.python:
            for name in ("python", "python3"):
                os.symlink(self.python, os.path.join(self.bin, name))

    def _popen_kwargs(self) -> dict[str, Any]:
        env = {"PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin", "HOME": self.workspace, "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1"}
        return {"cwd": self.workspace, "env": env}

    def _inner_args(self, argv: list[str], limits: Limits, status_fd: int, block_fd: int) -> list[str]:
        return list(argv)  # the launcher (before the uid drop) writes the start mark; no fd is passed

    def guarantees(self) -> dict[str, Any]:
        base = describe(self.limits, None, self.uid if self.root else None, self.mounted, self._quota_note)
        return {"backend": self.backend, "isolated": False,
                "warning": "no namespaces: the command can read host files and reach the network",
                "user": base["user"], "rlimits": base["rlimits"], "cgroup": base["cgroup"],
                "descriptors": "0, 1 and 2 only", "workspace_quota": base["workspace_quota"],
                "workspace_quota_mode": base["workspace_quota_mode"],
                "wall_clock": f"{self.limits.wall_s:g}s per command; kills the process group"
                              + (" and the cgroup" if base["cgroup"]["kill"] else "")}
