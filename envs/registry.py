"""Environment registry: ids are `gymfoundry/<name>-v<N>`.

`register` also registers the id with Gymnasium, so `gymnasium.make(id)` works once
`envs` is imported. An entry may name its outcome verifier as "module:attr"; it is
imported when the env is made (environments never import verifiers themselves)."""

from __future__ import annotations

import importlib
import re
from functools import lru_cache
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium

from gymfoundry.envs.base import AgentEnv

ENV_ID = re.compile(r"^gymfoundry/(?P<name>[a-z][a-z0-9_]*)-v(?P<version>\d+)$")


@dataclass
class EnvSpec:
    id: str
    entry_point: Callable[..., AgentEnv] | str
    verifier: str | type | None = None
    scripted_policy: str | type | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def version(self) -> str:
        return ENV_ID.match(self.id)["version"]


_REGISTRY: dict[str, EnvSpec] = {}


def load(target: Callable | str) -> Any:
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def register(id: str, entry_point: Callable[..., AgentEnv] | str, *, verifier: str | type | None = None,
             scripted_policy: str | type | None = None, **kwargs: Any) -> None:
    """Register an env. `verifier` and `scripted_policy` are classes or "module:attr" references.
    A family registers itself through its `Family` (envs/family.py); this is the level below."""
    if not ENV_ID.match(id):
        raise ValueError(f"env id {id!r} must look like gymfoundry/<name>-v<N>")
    _REGISTRY[id] = EnvSpec(id, entry_point, verifier, scripted_policy, kwargs)
    if id in gymnasium.registry:
        del gymnasium.registry[id]
    gymnasium.register(id=id, entry_point="gymfoundry.envs.gym_adapter:GymnasiumEnv", kwargs={"env_id": id})


class UnknownEnv(ValueError):
    """No registered environment has this id or family (a typo, or a spoofed task field)."""


def unknown_message(text: str, name: Any) -> str:
    """The error for a lookup that found nothing, with why a family of that name failed to load."""
    from gymfoundry.envs.discovery import load_errors

    match = ENV_ID.match(name) if isinstance(name, str) else None
    failed = load_errors().get(match["name"] if match else name)
    why = f"; that family failed to load: {failed}" if failed else ""
    return f"{text}; registered: {', '.join(list_envs()) or 'none'}{why}"


def spec(id: str) -> EnvSpec:
    entry = _REGISTRY.get(id) if isinstance(id, str) else None
    if entry is None:
        raise UnknownEnv(unknown_message(f"no environment {id!r}", id))
    return entry


def make(id: str, *, verified: bool = True, **kwargs: Any) -> AgentEnv:
    """Build a registered env. With `verified`, the env's end-of-episode reward comes from
    the family's outcome verifier (1.0 on success, else 0.0)."""
    entry = spec(id)
    if verified and entry.verifier and "outcome_fn" not in kwargs:
        kwargs["outcome_fn"] = verifier_for(id).terminal_reward
    env = load(entry.entry_point)(**{**entry.kwargs, **kwargs})
    env.env_id, env.version = id, entry.version
    return env


@lru_cache(maxsize=None)
def verifier_for(id: str) -> Any:
    """The env's outcome verifier, built once (verifiers are stateless), or None."""
    target = spec(id).verifier
    return load(target)() if target else None


def list_envs() -> list[str]:
    return sorted(_REGISTRY)


def family_env_id(family: str) -> str:
    """The newest registered env id of a family."""
    ids = [i for i in _REGISTRY if ENV_ID.match(i)["name"] == family]
    if not ids:
        raise UnknownEnv(unknown_message(f"no environment family {family!r}", family))
    return max(ids, key=lambda i: int(ENV_ID.match(i)["version"]))
