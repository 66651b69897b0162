"""What a domain proves when it loads, so a broken file is refused there with the place that is
wrong instead of failing later in a factory run: for every template at every level (seeds 0 and
1) the task generates, its reference plays through the env without a refusal and ends the
episode with its last call, no call makes fewer outcome rules hold (the potential never falls),
every outcome rule holds afterwards and not all of them before, the policy's `final` call ends an
episode at once, and the scripted policy without mistakes makes exactly the reference's calls."""

from __future__ import annotations

import json
from typing import Any

from gymfoundry.envs.errors import InvalidTask
from gymfoundry.envs.family import Family
from gymfoundry.envs.generic.domain import Domain
from gymfoundry.envs.generic.expr import EvalError, evaluate
from gymfoundry.envs.generic.generator import generate_from
from gymfoundry.envs.generic.rules import failed_rules, held

SEEDS = (0, 1)


def prove_domain(fam: Family, domain: Domain) -> list[str]:
    problems = []
    for name in domain.tasks:
        for level in domain.levels:
            for seed in SEEDS:
                at = f"tasks.{name}.reference (level {level}, seed {seed})"
                try:
                    task = generate_from(domain, fam, name, seed, level)
                except InvalidTask as exc:
                    problems.append(f"tasks.{name} (level {level}, seed {seed}): {exc}")
                    continue
                try:
                    why = _reference_problem(fam, task) or _final_problem(fam, domain, task) or \
                        _policy_problem(fam, task)
                except EvalError as exc:  # finish_when, or a rule, cannot be evaluated on these states
                    why = f"an expression fails while it plays: {exc}"
                except InvalidTask as exc:  # its own env refuses it at reset (finish_when fails on it)
                    why = f"refused at reset: {exc}"
                if why:
                    problems.append(f"{at}: {why}")
            if problems:
                return problems
    return problems


def _reference_problem(fam: Family, task: Any) -> str | None:
    facts = fam.facts_of(task)
    env = fam.env(outcome_fn=None)
    env.reset(task)
    if not failed_rules(facts, task.initial_state, env.state()):
        return "every outcome rule already holds before any call: the task is no exercise"
    ts, phi = None, held(facts, task.initial_state, env.state())
    for i, call in enumerate(task.hidden.reference):
        if ts is not None and ts.terminated:
            return f"the episode ended at call {i - 1}, before the reference's last call"
        ts = env.step(call)
        if ts.info.get("error"):
            return f"call {i} ({call.name}) fails: {ts.info['error']['kind']}: {ts.info['error']['message']}"
        now = held(facts, task.initial_state, env.state())
        if now < phi:  # the potential is the share of rules that hold: a reference step must not lose one
            return f"call {i} ({call.name}) makes fewer outcome rules hold ({phi} -> {now}): the potential would fall"
        phi = now
    if not ts.terminated:
        return "its last call does not end the episode (finish_when stays false)"
    failing = failed_rules(facts, task.initial_state, env.state())
    if failing:
        return f"fails its own outcome rule {failing[0]}"
    return None


def _final_problem(fam: Family, domain: Domain, task: Any) -> str | None:
    """The policy's `final` call (giving up, out of turns) is accepted and ends an episode at once."""
    final = domain.policy.final
    env = fam.env(outcome_fn=None)
    env.reset(task)
    ts = env.step({"name": final.tool, "arguments": evaluate(final.args, {})})
    if ts.info.get("error") or not ts.terminated:
        why = ts.info["error"]["message"] if ts.info.get("error") else "the episode goes on"
        return f"policy.final ({final.tool}) does not end an episode from the initial state: {why}"
    return None


def _policy_problem(fam: Family, task: Any) -> str | None:
    policy = fam.scripted_policy(mistake_rate=0.0)
    env = fam.env(outcome_fn=None)
    ts = env.reset(task)
    while not ts.terminated and len(env.steps) <= len(task.hidden.reference):
        ts = env.step(policy.act(ts.observation))
    made = [s.tool_call for s in env.steps]
    for i, want in enumerate(task.hidden.reference):
        got = made[i] if i < len(made) else None
        if got is None or (got.name, got.arguments) != (want.name, want.arguments):
            said = f"{got.name}({json.dumps(got.arguments)})" if got else "nothing"
            return (f"the scripted policy without mistakes makes {said} at call {i}, the reference "
                    f"{want.name}({json.dumps(want.arguments)}): the goal must show what the reference's "
                    "arguments need, and binds must read it from results")
    return None
