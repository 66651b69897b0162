"""Sandboxed command execution for untrusted code (the `coding` family and its grader).

    with create_sandbox({"main.py": "print(1)"}) as box:
        result = box.run(["python", "main.py"], timeout_s=5)

Backends: `docker` (used when an engine answers a ping within a second and the image is
present), `bubblewrap` (the embedded default), and `unsafe-local` (no isolation; only when
the user opts in). `backend="auto"` (the default) takes the first that works, in that
order, and refuses to run untrusted code without isolation unless
`allow_unsafe=True` or GYMFOUNDRY_ALLOW_UNSANDBOXED=1. GYMFOUNDRY_SANDBOX forces a backend
(docker, bubblewrap, unsafe-local or auto)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from gymfoundry.envs.sandbox import bubblewrap, docker_backend, local
from gymfoundry.envs.sandbox.base import (WORKSPACE, CommandResult, Limits, PathError, PathKind, Sandbox, SandboxError,
                               SandboxUnavailable, fault_count, faults_since)

BACKENDS = ("docker", "bubblewrap", "unsafe-local")


def _opted_in(allow_unsafe: bool | None) -> bool:
    if allow_unsafe is not None:
        return allow_unsafe
    return os.environ.get("GYMFOUNDRY_ALLOW_UNSANDBOXED", "").lower() in ("1", "true", "yes")


def backend_status() -> dict[str, tuple[bool, str]]:
    """Which backends work on this machine, and why not (probes are cached per process)."""
    return {"docker": docker_backend.probe(), "bubblewrap": bubblewrap.probe(),
            "unsafe-local": (True, "no isolation; needs an explicit opt-in")}


def select_backend(backend: str | None = None, allow_unsafe: bool | None = None) -> str:
    """The backend `create_sandbox` would use, or SandboxUnavailable saying why none."""
    choice = (backend or os.environ.get("GYMFOUNDRY_SANDBOX") or "auto").strip().lower()
    if choice not in BACKENDS + ("auto",):
        raise ValueError(f"unknown sandbox backend {choice!r}; use one of {', '.join(BACKENDS)} or auto")
    if choice == "unsafe-local":  # naming it is the explicit opt-in
        return choice
    probes = {"docker": docker_backend.probe, "bubblewrap": bubblewrap.probe}
    if choice != "auto":
        ok, why = probes[choice]()
        if not ok:
            raise SandboxUnavailable(f"sandbox backend {choice} is not available: {why}")
        return choice
    reasons = []
    for name, probe in probes.items():
        ok, why = probe()
        if ok:
            return name
        reasons.append(f"{name}: {why}")
    if _opted_in(allow_unsafe):
        return "unsafe-local"
    raise SandboxUnavailable("no sandbox backend can isolate untrusted code here (" + "; ".join(reasons)
                             + "); set GYMFOUNDRY_ALLOW_UNSANDBOXED=1 to run it without isolation")


def create_sandbox(snapshot: dict[str, bytes | str], support: dict[str, bytes | str] | None = None,
                   limits: Limits | None = None, backend: str | None = None,
                   allow_unsafe: bool | None = None, masked: Iterable[str] = ()) -> Sandbox:
    """A sandbox whose workspace holds `snapshot`; `support` files are placed read-only at
    `sandbox.support_dir`. `masked`: folders no command may see where a system dir the sandbox
    binds holds them (the caller's families' folders, `envs.family.masked_dirs()`)."""
    name = select_backend(backend, allow_unsafe)
    if name == "docker":
        return docker_backend.DockerSandbox(snapshot, support, limits)
    if name == "bubblewrap":
        return bubblewrap.BubblewrapSandbox(snapshot, support, limits, masked=masked)
    return local.LocalSandbox(snapshot, support, limits)


__all__ = ["BACKENDS", "WORKSPACE", "CommandResult", "Limits", "PathError", "PathKind", "Sandbox", "SandboxError",
           "SandboxUnavailable", "backend_status", "create_sandbox", "fault_count", "faults_since", "select_backend"]
