"""The policy registry: the policy a `PolicySpec` names, for a family (`make_policy`): the family's
scripted policy, a local Hugging Face checkpoint (`hf`), an OpenAI-compatible endpoint (`openai`), or
a kind added with `register_policy`."""

from __future__ import annotations

from collections.abc import Callable

from gymfoundry.envs.records import PolicySpec
from gymfoundry.envs.family import family as family_of
from gymfoundry.tasks.policies.base import Policy
from gymfoundry.tasks.policies.hf import HFPolicy, family_tools
from gymfoundry.tasks.policies.openai import OpenAIPolicy

# Custom policy kinds: name -> a callable (spec, family) -> Policy.
_CUSTOM: dict[str, Callable[[PolicySpec, str], Policy]] = {}


def register_policy(kind: str, build: Callable[[PolicySpec, str], Policy]) -> None:
    """Make `PolicySpec(kind=kind, ...)` build a policy with `build(spec, family)`."""
    if kind in ("scripted", "hf", "openai"):
        raise ValueError(f"{kind!r} is a built-in policy kind")
    _CUSTOM[kind] = build


def make_policy(spec: PolicySpec | str, family: str, **kwargs) -> Policy:
    """The policy a `PolicySpec` names, for `family`. The built policy carries its spec
    (`policy.spec`), from which its rollouts' identity knobs are derived (tasks/rollout/episodes.py).

    The older form `make_policy(name, family, **kwargs)` still works: `scripted` (kwargs:
    mistake_rate), `hf` / `openai` (kwargs: model, and the policy class's own keywords)."""
    if isinstance(spec, str):
        return _make_by_name(spec, family, **kwargs)
    if kwargs:
        raise TypeError("make_policy(spec, family) takes no keywords: put them in the spec")
    if spec.kind == "scripted":
        policy = _make_by_name("scripted", family, **({} if spec.mistake_rate is None else
                                                      {"mistake_rate": spec.mistake_rate}), **spec.options)
    elif spec.kind == "hf":
        s = spec.sampling
        knobs = {"max_new_tokens": s.max_tokens, "temperature": s.temperature, "max_batch": spec.max_concurrency}
        policy = HFPolicy(spec.model, family_tools(family), **{
            **{k: v for k, v in knobs.items() if v is not None}, **spec.options})
    elif spec.kind == "openai":
        policy = OpenAIPolicy.from_spec(spec, family_tools(family))
    elif spec.kind in _CUSTOM:
        policy = _CUSTOM[spec.kind](spec, family)
    else:
        raise ValueError(f"unknown policy kind {spec.kind!r}; available: scripted, hf, openai"
                         + "".join(f", {k}" for k in sorted(_CUSTOM)))
    try:
        policy.spec = spec
    except AttributeError:  # a policy with __slots__: its knobs are then read by attribute name
        pass
    return policy


def as_spec(policy: PolicySpec | str, mistake_rate: float | None = None) -> PolicySpec:
    """A plain name (`"scripted"`, ...) as the spec it stands for (the scripted policy's knob added)."""
    if isinstance(policy, PolicySpec):
        return policy
    if isinstance(policy, dict):
        return PolicySpec.model_validate(policy)
    return PolicySpec(kind=policy, mistake_rate=mistake_rate if policy == "scripted" else None)


def _make_by_name(name: str, family: str, **kwargs) -> Policy:
    if name == "scripted":
        target = family_of(family).scripted_policy
        if target is None:
            raise ValueError(f"family {family!r} has no scripted policy")
        return target(**kwargs)
    if name in ("hf", "openai"):  # kwargs: model (a checkpoint dir / an endpoint's model name), ...
        if "model" not in kwargs:
            raise ValueError(f"a {name!r} policy needs a model: pass model=..., or a PolicySpec")
        model = kwargs.pop("model")
        return (HFPolicy if name == "hf" else OpenAIPolicy)(model, family_tools(family), **kwargs)
    raise ValueError(f"unknown policy {name!r}; available: scripted, hf, openai")
