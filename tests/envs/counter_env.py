"""A minimal family used to test the env machinery without depending on a real family."""

from __future__ import annotations

import threading
import time

from dataclasses import dataclass

from gymfoundry.envs.base import EnvFault, ToolEnv, ToolError
from gymfoundry.envs.family import Family, HiddenFacts, add, remove
from gymfoundry.envs.profile import DomainProfile
from gymfoundry.envs.records import ENV_ID, Difficulty, Hidden, Source, TaskSpec, ToolCall

PROFILE = DomainProfile.model_validate({
    "name": "counter",
    "tools": [
        {"name": "read", "description": "read the counter", "category": "read",
         "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
        {"name": "add", "description": "add n", "category": "write",
         "parameters": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}},
                        "required": ["n"], "additionalProperties": False}},
        {"name": "sleep", "description": "sleep", "category": "execute",
         "parameters": {"type": "object", "properties": {"seconds": {"type": "number"}},
                        "required": ["seconds"], "additionalProperties": False}},
        {"name": "crash", "description": "a broken tool", "category": "execute",
         "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
        {"name": "outage", "description": "a service that is down", "category": "read",
         "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
        {"name": "finish", "description": "end", "category": "irreversible",
         "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
    ],
})


class CounterEnv(ToolEnv):
    family = "counter"
    profile = PROFILE

    @classmethod
    def generate_task(cls, seed: int, level: int = 2) -> TaskSpec:
        return TaskSpec(family="counter", env_id="gymfoundry/counter-v0", source=Source(generator="counter", version="1", seed=seed),
                        template_id="counter", goal=f"Reach {seed % 7 + 1}.", initial_state={"target": seed % 7 + 1},
                        allowed_tools=[t.name for t in PROFILE.tools], difficulty=Difficulty(level=level),
                        hidden=Hidden(reference=[ToolCall(name="add", arguments={"n": seed % 7 + 1}),
                                                 ToolCall(name="finish")], secrets=["s3cr3t-value"]))

    def initial_state(self, task):
        return {"value": 0, "target": task.initial_state["target"], "finished": False}

    def render_goal(self, task):
        return task.goal

    def is_finished(self, state):
        return state["finished"]

    def tool_read(self, state):
        return {"value": state["value"]}

    def tool_add(self, state, n):
        if n > 100:
            raise ToolError("too_big", "n must be at most 100")
        state["value"] += n
        return {"value": state["value"]}

    def tool_sleep(self, state, seconds):
        time.sleep(seconds)
        return {"slept": seconds}

    def tool_crash(self, state):
        raise ValueError("boom")

    def tool_outage(self, state):
        raise EnvFault("counter service unavailable")

    def tool_finish(self, state):
        state["finished"] = True
        return {"value": state["value"]}


def reward_at_target(task, steps, state):
    ok = state["value"] == state["target"]
    return (1.0 if ok else 0.0), {"success": ok}


class NoFacts(HiddenFacts):
    """A test world's tasks carry no hidden facts."""


@dataclass(frozen=True)
class TestWorld(Family):
    """A test world as a family: its env class makes its own tasks (`generate_task`) and may
    declare its tools in a profile alone; none of the SDK's declaration checks apply."""

    __test__ = False  # not a pytest class

    def __post_init__(self) -> None:
        self.env.declared_by = self


def register(env_id: str, env: type = CounterEnv, verifier: type | None = None) -> Family:
    """`env` (its `family` the id's name) known as `env_id`, in place of any family of that name;
    `verifier` None: its episodes get no verdict."""
    match = ENV_ID.match(env_id)
    if match is None:
        raise ValueError(f"env id {env_id!r} must look like gymfoundry/<name>-v<N>")
    fam = TestWorld(name=match["name"], env=env, generator=lambda _, seed, level: env.generate_task(seed, level),
                    generator_version="1", facts=NoFacts, verifier=verifier, version=int(match["version"]))
    remove(fam.name)
    add(fam)
    return fam


class HeldSleep:
    """The sleep tool held until the test releases it: a step over its time limit that comes back
    while the tool is still held was cut off at its deadline, not waited for; no clock is read.

        held = HeldSleep(monkeypatch)     # CounterEnv's sleep tool now waits for held.end()
        ...                               # a step calls sleep; the caller gets it back as a timeout
        assert held.holding()             # the tool had not returned
        held.end()                        # release it and wait for the threads that ran it to end
    """

    def __init__(self, monkeypatch, env_class: type = CounterEnv):
        self.released = threading.Event()
        self.threads: list[threading.Thread] = []

        def tool_sleep(env, state, seconds):
            self.threads.append(threading.current_thread())
            self.released.wait()
            return {"slept": seconds}

        monkeypatch.setattr(env_class, "tool_sleep", tool_sleep)

    def holding(self) -> bool:
        """Some call of the tool started and none has been released."""
        return bool(self.threads) and not self.released.is_set()

    def end(self) -> None:
        self.released.set()
        for thread in self.threads:
            thread.join()
