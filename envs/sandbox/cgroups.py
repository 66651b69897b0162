"""Per-command cgroups: memory / pids / CPU limits and a kill of everything inside.

cgroup v1 and v2 differ: v1 mounts one hierarchy per controller (memory, pids, cpu,
freezer), v2 one unified tree whose controllers must be enabled by the parent. On a
hybrid machine the controllers may live in v1 while the unified tree still offers
`cgroup.kill`. `detect()` finds what this process may create and reports exactly which
limits will be in force; nothing here is required (the pid namespace and rlimits still
contain a command without cgroups). `detect()` also sweeps the groups that a killed host
process left beside ours (`sweep_stale`)."""

from __future__ import annotations

import atexit
import functools
import os
import signal
import time
from dataclasses import dataclass, field

from gymfoundry.envs.sandbox.base import Limits

V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
GROUP_DIR = f"gymfoundry-{os.getpid()}"


@dataclass
class CgroupSupport:
    v1: dict[str, str] = field(default_factory=dict)  # controller -> writable parent dir
    v2: str | None = None  # writable parent dir in the unified tree
    v2_controllers: tuple[str, ...] = ()
    v2_kill: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def limits_in_force(self) -> list[str]:
        have = set(self.v1) | set(self.v2_controllers)
        return [c for c in ("memory", "pids", "cpu") if c in have]

    @property
    def kill_method(self) -> str | None:
        if self.v2_kill:
            return "cgroup.kill (v2)"
        if "freezer" in self.v1:
            return "freeze + SIGKILL (v1 freezer)"
        return None

    def describe(self, limits: Limits) -> dict:
        values = {"memory": f"{limits.memory_mb} MiB", "pids": str(limits.processes), "cpu": f"{limits.cpus:g} CPU"}
        version = "+".join(v for v, on in (("v1", bool(self.v1)), ("v2", bool(self.v2))) if on) or None
        return {"version": version,
                "limits": {c: values[c] for c in self.limits_in_force},
                "not_enforced": [c for c in ("memory", "pids", "cpu") if c not in self.limits_in_force],
                "kill": self.kill_method, "notes": list(self.notes)}


def _own_cgroups() -> dict[str, str]:
    """controller (or "" for v2) -> this process's path in that hierarchy."""
    out = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                out[c] = path
    return out


def _mounts() -> tuple[dict[str, str], str | None]:
    v1, v2 = {}, None
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fstype, _, options = right.split()[:3]
            mount_point = left.split()[4]
            if fstype == "cgroup2" and v2 is None:
                v2 = mount_point
            elif fstype == "cgroup":
                for c in options.split(","):
                    if c in V1_CONTROLLERS:
                        v1.setdefault(c, mount_point)
    return v1, v2


def sweep_stale(base: str) -> list[str]:
    """Remove the cgroups a dead host process left under `base` (`gymfoundry-<pid>` whose pid no
    longer exists): kill anything still inside, then remove its command cgroups and itself.
    A live process's groups are never touched."""
    removed = []
    try:
        names = [n for n in os.listdir(base) if n.startswith("gymfoundry-")]
    except OSError:
        return removed
    for name in names:
        pid = name.removeprefix("gymfoundry-")
        if not pid.isdigit() or int(pid) == os.getpid() or os.path.exists(f"/proc/{pid}"):
            continue
        parent = os.path.join(base, name)
        children = [os.path.join(parent, c) for c in _subdirs(parent)]
        for path in children + [parent]:
            _empty_and_remove(path)
        removed.append(parent)
    return removed


def _subdirs(path: str) -> list[str]:
    try:
        return [e.name for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _empty_and_remove(path: str, timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        _write(os.path.join(path, "cgroup.kill"), "1")
        for pid in _read(os.path.join(path, "cgroup.procs")).split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.005)


def _make_parent(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
        return os.access(path, os.W_OK) and os.access(os.path.join(path, "cgroup.procs"), os.W_OK)
    except OSError:
        return False


@functools.cache
def detect() -> CgroupSupport:
    support = CgroupSupport()
    try:
        own = _own_cgroups()
        v1_mounts, v2_mount = _mounts()
    except OSError as exc:
        support.notes.append(f"cannot read cgroup info: {exc}")
        return support
    for controller, mount_point in v1_mounts.items():
        parent = os.path.join(mount_point, own.get(controller, "/").lstrip("/"), GROUP_DIR)
        sweep_stale(os.path.dirname(parent))
        if _make_parent(parent):
            support.v1[controller] = parent
        else:
            support.notes.append(f"v1 {controller}: not writable")
    if v2_mount and "" in own:
        base = os.path.join(v2_mount, own[""].lstrip("/"))
        parent = os.path.join(base, GROUP_DIR)
        sweep_stale(base)
        if _make_parent(parent):
            support.v2 = parent
            wanted = [c for c in ("memory", "pids", "cpu") if c not in support.v1]
            support.v2_controllers = _enable_v2(base, parent, wanted)
            support.v2_kill = os.path.exists(os.path.join(parent, "cgroup.kill"))
            if not support.v2_kill:
                support.notes.append("v2: no cgroup.kill (kernel < 5.14)")
        else:
            support.notes.append("v2: not writable")
    atexit.register(_remove_parents, support)
    return support


def _remove_parents(support: CgroupSupport) -> None:
    for parent in [*support.v1.values(), support.v2]:
        if parent:
            try:
                os.rmdir(parent)
            except OSError:
                pass


def _enable_v2(base: str, parent: str, wanted: list[str]) -> tuple[str, ...]:
    """Enable controllers for our children; the parent must delegate them first."""
    enabled = []
    for c in wanted:
        for directory in (base, parent):
            try:
                with open(os.path.join(directory, "cgroup.subtree_control"), "w") as fh:
                    fh.write(f"+{c}")
            except OSError:
                break
        else:
            enabled.append(c)
    return tuple(enabled)


def _write(path: str, value: str) -> bool:
    try:
        with open(path, "w") as fh:
            fh.write(value)
        return True
    except OSError:
        return False


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


class CommandCgroup:
    """The cgroups one command runs in. `procs_files` are written by the launcher with its
    own pid before it execs the sandbox, so nothing it starts can escape them."""

    def __init__(self, support: CgroupSupport, name: str, limits: Limits):
        self.support = support
        self.dirs: dict[str, str] = {}
        for controller, parent in support.v1.items():
            path = os.path.join(parent, name)
            os.makedirs(path, exist_ok=True)
            self.dirs[controller] = path
        if support.v2:
            self.dirs["v2"] = os.path.join(support.v2, name)
            os.makedirs(self.dirs["v2"], exist_ok=True)
        self._apply(limits)

    def _apply(self, limits: Limits) -> None:
        memory = str(limits.memory_mb * 1024 * 1024)
        quota = str(int(limits.cpus * 100_000))
        if "memory" in self.dirs:
            _write(os.path.join(self.dirs["memory"], "memory.limit_in_bytes"), memory)
            _write(os.path.join(self.dirs["memory"], "memory.memsw.limit_in_bytes"), memory)
        if "pids" in self.dirs:
            _write(os.path.join(self.dirs["pids"], "pids.max"), str(limits.processes))
        if "cpu" in self.dirs:
            _write(os.path.join(self.dirs["cpu"], "cpu.cfs_period_us"), "100000")
            _write(os.path.join(self.dirs["cpu"], "cpu.cfs_quota_us"), quota)
        v2 = self.dirs.get("v2")
        if v2:
            controllers = self.support.v2_controllers
            if "memory" in controllers:
                _write(os.path.join(v2, "memory.max"), memory)
                _write(os.path.join(v2, "memory.swap.max"), "0")
            if "pids" in controllers:
                _write(os.path.join(v2, "pids.max"), str(limits.processes))
            if "cpu" in controllers:
                _write(os.path.join(v2, "cpu.max"), f"{quota} 100000")

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def pids(self) -> set[int]:
        out: set[int] = set()
        for f in self.procs_files:
            out |= {int(p) for p in _read(f).split()}
        return out

    def kill(self) -> None:
        v2 = self.dirs.get("v2")
        if v2 and self.support.v2_kill and _write(os.path.join(v2, "cgroup.kill"), "1"):
            return
        freezer = self.dirs.get("freezer")
        if freezer:  # frozen tasks cannot fork while we kill them
            _write(os.path.join(freezer, "freezer.state"), "FROZEN")
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if freezer:
            _write(os.path.join(freezer, "freezer.state"), "THAWED")

    def stats(self) -> list[str]:
        """Limits the command ran into, as the kernel counted them."""
        hits = []
        refused = sum(_counter(_read(os.path.join(d, "pids.events")), "max")
                      for k, d in self.dirs.items() if k in ("pids", "v2"))
        if refused:
            hits.append(f"pids: {refused} fork(s) refused at the process limit")
        oom = _counter(_read(os.path.join(self.dirs["memory"], "memory.oom_control")), "oom_kill") \
            if "memory" in self.dirs else 0
        if "v2" in self.dirs:
            oom += _counter(_read(os.path.join(self.dirs["v2"], "memory.events")), "oom_kill")
        if oom:
            hits.append(f"memory: {oom} process(es) killed at the memory limit")
        return hits

    def remove(self, timeout_s: float = 2.0) -> None:
        deadline = time.monotonic() + timeout_s
        for path in self.dirs.values():
            while True:
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # members still exiting
                    if time.monotonic() > deadline:
                        break
                    self.kill()
                    time.sleep(0.002)
