"""Judging a state by a task's outcome rules, and the task's hidden variants: shared by the
verifier and the proof a domain passes when it loads (neither imports the other)."""

from __future__ import annotations

import copy
from typing import Any

from gymfoundry.envs.generic.expr import EvalError, apply_effect, render, truth
from gymfoundry.envs.generic.facts import GenericFacts


def failed_rules(facts: GenericFacts, initial: dict[str, Any], state: dict[str, Any]) -> list[str]:
    """The failing outcome rules' messages; a rule that cannot be evaluated on the state fails."""
    return [why for why in (_why_not(facts, rule, initial, state) for rule in facts.outcome) if why]


def held(facts: GenericFacts, initial: dict[str, Any], state: dict[str, Any]) -> int:
    return sum(_why_not(facts, rule, initial, state) is None for rule in facts.outcome)


def _why_not(facts: GenericFacts, rule: Any, initial: dict[str, Any], state: dict[str, Any]) -> str | None:
    scope = {**facts.params, "state": state, "initial": initial}
    try:
        if truth(rule.check, scope):
            return None
        return f"{rule.name}: {render(rule.message, scope)}"
    except EvalError as exc:
        return f"{rule.name}: cannot be judged on this state ({exc})"


def reordered(value: Any) -> Any:
    """Every mapping with its keys in reverse order (lists as they are): the same world, listed
    the other way round."""
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


def variant_worlds(facts: GenericFacts, initial: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, initial state) of each hidden variant: the declared ones, then the reordered world."""
    out = []
    for variant in facts.variants:
        world = copy.deepcopy(initial)
        scope = {**facts.params, "state": world}
        for effect in variant.effects:
            apply_effect(effect, scope)
        out.append((variant.name, world))
    return out + [("reordered", reordered(initial))]


def state_diff(final: dict[str, Any], gold: dict[str, Any], keys: list[str] | None) -> list[str]:
    """Where the final state differs from the reference's (the event log aside), one level deep."""
    keys = keys if keys is not None else sorted((set(final) | set(gold)) - {"events"})
    out = []
    for key in keys:
        a, b = final.get(key), gold.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"state.{key}.{k} is {a.get(k)!r}, the reference leaves {b.get(k)!r}"
                    for k in list(b) + [k for k in a if k not in b] if a.get(k) != b.get(k)]
        else:
            out.append(f"state.{key} is {a!r}, the reference leaves {b!r}")
    return out
