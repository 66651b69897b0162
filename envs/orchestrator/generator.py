"""Seeded orchestrator tasks: a bundle of whole sub-tasks of other families, and the reference
that delegates them all in one stage, then again what failed, then finishes.

`generate(family, seed, level)` is a pure function of (seed, level, GENERATOR_VERSION): the
sub-tasks are drawn from SUBFAMILIES with their own generators, and the reference is found by
playing the frozen sub-agents, whose episodes are seeded from (task, sub-task, attempt) and so
are the same in every replay. Knobs by level 1..5: the number of sub-tasks (2..6) and their
level (1..3). A sub-task its sub-agent fails at every allowed attempt is drawn again."""

from __future__ import annotations

from gymfoundry.envs.delegation import MAX_ATTEMPTS, delegate_stage, new_delegations
from gymfoundry.envs.family import Family, family as family_of
from gymfoundry.envs.records import TaskSpec, ToolCall

from .facts import OrchestratorFacts

GENERATOR_VERSION = "1"
SUBFAMILIES = ("inventory", "advisory")  # fixed, so that adding a family changes no task
N_SUBTASKS = {1: 2, 2: 3, 3: 4, 4: 5, 5: 6}
SUB_LEVEL = {1: 1, 2: 1, 3: 2, 4: 2, 5: 3}


def generate(family: Family, seed: int, level: int) -> TaskSpec:
    rng = family.rng(seed, level)
    n = N_SUBTASKS[level]
    ids = [f"S{i + 1}" for i in range(n)]
    names = [rng.choice(SUBFAMILIES) for _ in ids]
    seeds = [rng.randrange(1_000_000) for _ in ids]
    seed_key = family.template_id("subagent-seeds", seed, level)  # the sub-agents' seeds: not the task id
    for _ in range(50):  # draw again a sub-task its sub-agent cannot do within the attempts
        subtasks = {i: family_of(f).generate(s, SUB_LEVEL[level]) for i, f, s in zip(ids, names, seeds)}
        stages, hopeless = _plan(seed_key, subtasks)
        if not hopeless:
            break
        for i in hopeless:
            seeds[ids.index(i)] = rng.randrange(1_000_000)
    else:
        raise RuntimeError(f"no orchestrator task for seed {seed} level {level}: sub-agents keep failing {hopeless}")
    reference = [ToolCall(name="list_subtasks", arguments={})]
    reference += [ToolCall(name="delegate", arguments={"subtasks": stage}) for stage in stages]
    reference.append(ToolCall(name="finish", arguments={"summary": f"all {n} sub-tasks succeeded"}))
    goal = _goal(subtasks, ids)
    facts = OrchestratorFacts(subtasks=ids, families=names, max_attempts=MAX_ATTEMPTS)
    secrets = sorted({s for t in subtasks.values() for s in t.hidden.secrets})
    return family.task(
        seed=seed, level=level, template_id=family.template_id(tuple(names), SUB_LEVEL[level]), goal=goal,
        initial_state={"seed_key": seed_key, "order": ids,
                       "subtasks": {i: t.model_dump(mode="json") for i, t in subtasks.items()}},
        reference=reference, facts=facts, max_steps=2 * n + 6, secrets=secrets,
        features={"n_subtasks": float(n), "sub_level": float(SUB_LEVEL[level]),
                  "reference_stages": float(len(stages))})


def _plan(seed_key: str, subtasks: dict[str, TaskSpec]) -> tuple[list[list[str]], list[str]]:
    """The stages the reference delegates (all, then what failed, ...), and the sub-tasks that
    fail at every attempt."""
    delegations, pending, stages = new_delegations(), list(subtasks), []
    for _ in range(MAX_ATTEMPTS):
        if not pending:
            break
        stages.append(pending)
        episodes = delegate_stage(seed_key, delegations, subtasks, pending)
        pending = [e.subtask_id for e in episodes if not e.success]
    return stages, pending


def _goal(subtasks: dict[str, TaskSpec], ids: list[str]) -> str:
    lines = [f"You coordinate sub-agents. These {len(ids)} sub-tasks must all succeed; you do none of them "
             "yourself:"]
    for i in ids:
        first = next((ln.strip() for ln in subtasks[i].goal.splitlines()
                      if ln.strip() and not ln.startswith("#")), "")
        lines.append(f"- {i} ({subtasks[i].family}): {first[:160]}")
    lines.append(f"Delegate sub-tasks with `delegate` (several in one call run in parallel as one stage; each "
                 f"sub-task at most {MAX_ATTEMPTS} times). Each result says whether that sub-task succeeded. "
                 "Delegate again only what failed; never a sub-task that already succeeded. When every "
                 "sub-task has succeeded, call `finish`.")
    return "\n".join(lines)
