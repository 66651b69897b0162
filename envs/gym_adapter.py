"""Gymnasium adapter: `gymnasium.make("gymfoundry/<name>-v<N>")` once the families are found
(importing this module finds them; so does any lookup, `gymfoundry.envs.families()`), or without
that step `gymnasium.make("gymfoundry.envs.gym_adapter:gymfoundry/<name>-v<N>")`. The env is the
one its `Family` makes.

Observations and actions are `gymnasium.spaces.Text` over printable ASCII; an action is
the raw text a model produced. The task can be passed as `options={"task": TaskSpec}`;
otherwise one is generated from the reset seed."""

from __future__ import annotations

import string
from typing import Any

import gymnasium
from gymnasium import spaces

from gymfoundry.envs.family import families, family
from gymfoundry.envs.records import ToolCall

CHARSET = string.printable


class GymnasiumEnv(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(self, env_id: str, max_observation_chars: int = 8192, max_action_chars: int = 8192, **kwargs):
        self.env = family(env_id).make(**kwargs)
        self.max_observation_chars = max_observation_chars
        self.observation_space = spaces.Text(max_length=max_observation_chars, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(max_length=max_action_chars, min_length=1, charset=CHARSET)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        task = (options or {}).get("task")
        task_seed = None if task is not None else int(self.np_random.integers(0, 2**31 - 1))
        ts = self.env.reset(task=task, seed=task_seed)
        return self._clip(ts.observation), _plain(ts.info)

    def step(self, action: str):
        ts = self.env.step(action)
        return self._clip(ts.observation), float(ts.reward), ts.terminated, ts.truncated, _plain(ts.info)

    def close(self) -> None:
        self.env.close()

    def _clip(self, text: str) -> str:
        text = "".join(c if c in CHARSET else "?" for c in text)
        return text[: self.max_observation_chars]


def _plain(info: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.model_dump() if isinstance(v, ToolCall) else v) for k, v in info.items()}


families()  # every family's id known to Gymnasium (Family registration does it)
