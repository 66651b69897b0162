"""Environment-fault injection, to test that faults are classified, retried and never
counted against the model.

`FaultInjection(env, FaultConfig(rate=0.2), seed=7)` makes each tool call fail, with
probability `rate`, in one of three ways:

- `tool_crash`: the tool's infrastructure crashes (an `EnvFault`, so never taken for an env bug);
- `timeout`: the service call times out (waits `timeout_s`, then fails);
- `unavailable`: the service answers "unavailable".

In a `ToolEnv` the fault is raised inside the tool itself, so it takes the real path: the
env reports an `env_fault` error observation and rolls the state back. Any other env gets
the same error observation without being called. Wrap the bare env, under the runtime's
wrappers: `standard_stack(FaultInjection(family(name).make(), config, seed))`.
"""

from __future__ import annotations

import random
import time
from typing import Any

from gymfoundry.envs.base import AgentEnv, EnvFault, ToolEnv, render_error
from gymfoundry.envs.errors import ErrorKind
from gymfoundry.envs.parsing import ActionError, parse_action
from gymfoundry.envs.records import FaultConfig, TaskSpec, ToolCall
from gymfoundry.envs.timestep import TimeStep
from gymfoundry.envs.wrappers import Wrapper


class InjectedCrash(EnvFault):
    """An injected crash of the tool's infrastructure: an environment fault, not an env bug (a
    bug is env code failing on the agent's input, which an injection never is)."""


class FaultInjection(Wrapper):
    def __init__(self, env: AgentEnv, config: FaultConfig, seed: int = 0):
        super().__init__(env)
        self.config = config
        self.seed = seed
        self.rng = random.Random(f"{config.seed}:{seed}")
        self.injected: list[tuple[int, str]] = []  # (step number, kind) of this episode
        self._step = 0

    def reset(self, task: TaskSpec | dict | None = None, seed: int | None = None) -> TimeStep:
        self.rng = random.Random(f"{self.config.seed}:{self.seed}")
        self.injected, self._step = [], 0
        return self.env.reset(task=task, seed=seed)

    def step(self, action: ToolCall | dict | str) -> TimeStep:
        number, self._step = self._step, self._step + 1
        draw = self.rng.random()  # drawn every step, so one fault never shifts the others
        call = self._call(action)
        if call is None or draw >= self.config.rate:
            return self.env.step(action)
        kind = self._kind()
        self.injected.append((number, kind))
        inner = self.unwrapped
        if isinstance(inner, ToolEnv) and hasattr(inner, f"tool_{call.name}"):
            return self._inside_the_tool(inner, call.name, kind, action)
        message = self._message(kind)
        info = {"tool_call": call, "thought": None, "env_fault": True,
                "error": {"kind": ErrorKind.env_fault.value, "message": message}}
        return TimeStep(render_error(call, ErrorKind.env_fault.value, message), 0.0, False, False, info)

    def _call(self, action) -> ToolCall | None:
        task = getattr(self.unwrapped, "task", None)
        try:
            return parse_action(action, task.budget.max_action_chars if task else 8192).call
        except ActionError:
            return None  # a malformed action never reaches a tool, so it cannot meet a fault

    def _kind(self) -> str:
        kinds = [(k, w) for k, w in sorted(self.config.kinds.items()) if w > 0]
        return self.rng.choices([k for k, _ in kinds], weights=[w for _, w in kinds])[0]

    def _message(self, kind: str) -> str:
        if kind == "timeout":
            return f"service call timed out after {self.config.timeout_s:g}s (injected fault)"
        if kind == "unavailable":
            return "service unavailable: 503 (injected fault)"
        return "tool crashed: InjectedCrash: injected fault"

    def _inside_the_tool(self, inner: ToolEnv, name: str, kind: str, action) -> TimeStep:
        def failing_tool(state: dict[str, Any], **arguments: Any) -> Any:
            if kind == "tool_crash":
                raise InjectedCrash(self._message(kind))
            if kind == "timeout" and self.config.timeout_s:
                time.sleep(self.config.timeout_s)
            raise EnvFault(self._message(kind))

        # An instance attribute shadows the tool method for this one call.
        setattr(inner, f"tool_{name}", failing_tool)
        try:
            return self.env.step(action)
        finally:
            delattr(inner, f"tool_{name}")
