"""The scaffolding every family's scripted policy shares: a seeded generator script that is
sent each observation, a mistake coin, and a turn cap.

A subclass sets `policy_id`, `max_turns`, and implements `_run(goal)` (a generator that
yields action texts and receives the observations) and `_final_call(reason)` (the submit
it makes when out of turns or when its script ends)."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Generator


class ScriptedPolicy:
    policy_id: str
    script_version: str = "1"  # bump when what the script says or does changes
    max_turns: int = 40

    def __init__(self, mistake_rate: float = 0.2, seed: int = 0):
        self.mistake_rate = mistake_rate
        # The mistake rate is part of what the policy is: rollouts at other rates are other rollouts.
        self.version = f"{self.script_version}+mistakes{mistake_rate:g}"
        self.seed = seed
        self.reset(seed)

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.rng = random.Random(seed)
        self._script: Generator[str, str, None] | None = None
        self._turns = 0

    def fork(self) -> ScriptedPolicy:
        """Another instance for a concurrent episode: the same knobs, its own state."""
        twin = copy.copy(self)
        twin.reset(self.seed)
        return twin

    def act(self, observation: str) -> str:
        self._turns += 1
        if self._turns > self.max_turns:
            return self._final_call("out of turns")
        try:
            if self._script is None:
                self._script = self._run(observation)
                return next(self._script)
            return self._script.send(observation)
        except StopIteration:
            return self._final_call("done")

    def _mistake(self) -> bool:
        return self.rng.random() < self.mistake_rate

    def _say(self, thought: str, name: str, arguments: dict) -> str:
        """Action text as a model would write it: a thought, then the call, in one of two formats."""
        call = json.dumps({"name": name, "arguments": arguments})
        if self.rng.random() < 0.5:
            return f"{thought}\n<tool_call>{call}</tool_call>"
        return f"Thought: {thought}\n{call}"

    def _run(self, goal: str) -> Generator[str, str, None]:
        raise NotImplementedError

    def _final_call(self, reason: str) -> str:
        raise NotImplementedError


def tool_result(observation: str) -> dict | None:
    """The `result` of a successful tool observation, or None for an error or unparseable text."""
    try:
        obs = json.loads(observation)
    except (json.JSONDecodeError, TypeError):
        return None
    if isinstance(obs, dict) and obs.get("ok") is True and isinstance(obs.get("result"), dict):
        return obs["result"]
    return None
