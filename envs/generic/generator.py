"""Tasks of a YAML domain from its templates: parameters drawn in order from `family.rng(seed,
level)` (ints, choices, samples, tables of entities, values drawn from the generated state), the
level's knobs, the goal rendered from its lines, the reference played on the initial state (each
step's arguments from the goal-visible parameters and what earlier results showed), and the
template's outcome rules copied into the hidden facts."""

from __future__ import annotations

import copy
import json
import random
from typing import TYPE_CHECKING, Any

from gymfoundry.envs.base import ToolError
from gymfoundry.envs.errors import InvalidTask
from gymfoundry.envs.generic.expr import EvalError, budget, evaluate, render, text_of, truth
from gymfoundry.envs.generic.facts import GenericFacts, RuleFacts, VariantFacts
from gymfoundry.envs.generic.world import run_tool
from gymfoundry.envs.records import TaskSpec, ToolCall

if TYPE_CHECKING:
    from gymfoundry.envs.family import Family
    from gymfoundry.envs.generic.domain import Domain, Step, TaskTemplate


def generate(domain: Domain, family: Family, seed: int, level: int) -> TaskSpec:
    rng = family.rng(seed, level)
    names = list(domain.tasks)
    name = rng.choices(names, weights=[domain.tasks[n].weight for n in names])[0] if len(names) > 1 else names[0]
    return generate_from(domain, family, name, seed, level, rng)


def generate_from(domain: Domain, family: Family, name: str, seed: int, level: int,
                  rng: random.Random | None = None) -> TaskSpec:
    """The task of template `name` at (seed, level), made within one budget of steps (expr.MAX_STEPS)."""
    with budget():
        return _generate_from(domain, family, name, seed, level, rng)


def _generate_from(domain: Domain, family: Family, name: str, seed: int, level: int,
                   rng: random.Random | None) -> TaskSpec:
    t = domain.tasks[name]
    rng = rng or family.rng(seed, level)
    try:
        scope = draw(t, level, rng)
        state = scope.pop("state")
        params = as_json(scope)
        shown = [render(g.line, scope) for g in t.goal if g.when is None or _flag(scope, g.when)]
        visible = {p: params[p] for p in sorted(t.visible())}
        reference = play_reference(domain, t.reference, visible, state)
        outcome = [RuleFacts(name=r.name, check=r.check, message=r.message) for r in t.outcome
                   if r.when is None or truth(r.when, params)]
        variants = [VariantFacts(name=v.name, effects=v.effects) for v in t.variants]
        secrets = [text_of(v) for s in t.secrets for v in _listed(evaluate(s, {**params, "state": state}))]
        max_steps = 3 * len(reference) + 6 if t.max_steps is None else evaluate(t.max_steps, params)
    except EvalError as exc:
        raise InvalidTask(f"{domain.name} template {name!r} (seed {seed}, level {level}): {exc}") from None
    if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < len(reference):
        raise InvalidTask(f"{domain.name} template {name!r}: max_steps {max_steps!r} is below the reference's "
                          f"{len(reference)} calls")
    features = {k: float(v) for k, v in t.levels[level].items() if isinstance(v, (int, float))}
    features["reference_calls"] = float(len(reference))
    facts = GenericFacts(template=name, params=params, outcome=outcome, variants=variants)
    return family.task(seed=seed, level=level, template_id=family.template_id(name, visible), goal="\n".join(shown),
                       initial_state=state, reference=reference, facts=facts, max_steps=max_steps,
                       secrets=[s for s in secrets if s], features=features)


def draw(t: TaskTemplate, level: int, rng: random.Random) -> dict[str, Any]:
    """The knobs of `level`, then the parameters, the state and what is drawn from it, in order."""
    scope: dict[str, Any] = {"level": level, **copy.deepcopy(t.levels[level])}
    for pname, value in t.params.items():
        scope[pname] = evaluate(value, scope, rng)
    state = evaluate(t.state, scope, rng)
    if not isinstance(state, dict):
        raise EvalError(f"the state is {type(state).__name__}, not a mapping")
    scope["state"] = state
    for pname, value in t.then.items():
        scope[pname] = evaluate(value, scope, rng)
    return scope


def _listed(value: Any) -> list[Any]:
    """A secret expression gives one value or a list of them."""
    return value if isinstance(value, list) else [value]


def _flag(scope: dict[str, Any], when: str) -> bool:
    value = scope[when.lstrip("$")]
    if not isinstance(value, bool):
        raise EvalError(f"goal flag {when} is {value!r}, not true or false")
    return value


def play_reference(domain: Domain, steps: list[Step], visible: dict[str, Any], state: dict[str, Any]) -> list[ToolCall]:
    """The reference calls: each step's arguments from the visible parameters and earlier
    bindings, each call run on a copy of the state so later steps can bind what it showed."""
    world = {**copy.deepcopy(state), "events": []}
    scope, calls = dict(visible), []
    for i, step in enumerate(steps):
        if step.when is not None and not truth(step.when, scope):
            continue
        args = evaluate(step.args, scope)
        try:
            result = run_tool(domain, step.tool, world, args)
        except ToolError as exc:
            raise EvalError(f"reference[{i}] ({step.tool} {json.dumps(args)}) is refused: "
                            f"{exc.kind}: {exc.message}") from None
        except EvalError as exc:
            raise EvalError(f"reference[{i}] ({step.tool} {json.dumps(args)}) fails in the tool: {exc}") from None
        calls.append(ToolCall(name=step.tool, arguments=args))
        seen = as_json(result)
        for name, value in step.bind.items():
            scope[name] = evaluate(value, {**scope, "result": seen})
    return calls


def as_json(value: Any) -> Any:
    """The value as the agent's observation carries it (JSON with sorted keys)."""
    try:
        return json.loads(json.dumps(value, sort_keys=True))
    except (TypeError, ValueError) as exc:
        raise EvalError(f"not a JSON value: {exc}") from None
