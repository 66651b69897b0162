"""Helpers shared by the coding-family tests (not a test module)."""

import json
import os
import socket
from contextlib import contextmanager

from gymfoundry.envs.coding import generate_task
from gymfoundry.envs.records import TaskSpec, ToolCall
from gymfoundry.envs.sandbox import bubblewrap

UID_RANGE = bubblewrap.UID_RANGE


def with_limits(task: TaskSpec, **limits) -> TaskSpec:
    """The same task with other sandbox limits (a new task id)."""
    data = task.model_dump(mode="json")
    data["initial_state"]["limits"] = {**data["initial_state"]["limits"], **limits}
    data["task_id"] = ""
    return TaskSpec.model_validate(data)


def quick_task(seed: int = 0, level: int = 1, **limits) -> TaskSpec:
    return with_limits(generate_task(seed, level), **{"command_timeout_s": 2.0, "test_timeout_s": 4.0, **limits})


class ScriptPolicy:
    """Plays a fixed list of calls, then submits."""

    policy_id = "script"
    version = "1"

    def __init__(self, calls: list[ToolCall | dict]):
        self.calls = [c if isinstance(c, ToolCall) else ToolCall(**c) for c in calls]

    def reset(self, seed=None):
        self._next = iter(self.calls)

    def act(self, observation: str) -> str:
        call = next(self._next, ToolCall(name="submit", arguments={}))
        return json.dumps({"name": call.name, "arguments": call.arguments})


def run(argv, **extra) -> ToolCall:
    return ToolCall(name="run", arguments={"argv": argv, **extra})


def sandbox_processes(uid: int) -> list[int]:
    """Processes running as a sandbox's uid (the bubblewrap backend gives each sandbox a fresh one)."""
    assert UID_RANGE[0] <= uid < UID_RANGE[1] or uid == os.getuid() != 0
    pids = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid and int(pid) != os.getpid():
                    with open(f"/proc/{pid}/stat") as fh:
                        state = fh.read().rsplit(")", 1)[1].split()[0]
                    if state not in "ZX":  # a zombie runs nothing; its parent has yet to reap it
                        pids.append(int(pid))
            except OSError:
                pass
    return pids


def alive_with(marker: str) -> list[int]:
    pids = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        pids.append(int(pid))
            except OSError:
                pass
    return pids


@contextmanager
def local_listener(timeout_s: float):
    """A TCP listener on 127.0.0.1 that nothing should reach: yields (listener, port)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(timeout_s)
    try:
        yield listener, listener.getsockname()[1]
    finally:
        listener.close()
