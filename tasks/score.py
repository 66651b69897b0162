"""Stage: score every step with the PRM layers available. Layer 1 (rules) always runs;
the profile of each family supplies its weights and its verifier the progress potential."""

from __future__ import annotations

from envs.records import Rollout, StepScore, TaskSpec
from envs.registry import family_env_id, load, spec
from tasks.generate import family_env_class
from verifiers.rules import score_rules


def family_verifier(family: str):
    target = spec(family_env_id(family)).verifier
    return load(target)() if target else None


def score_rollouts(rollouts: list[Rollout], tasks: list[TaskSpec]) -> list[StepScore]:
    families = sorted({r.family for r in rollouts})
    profiles = {f: family_env_class(f).profile for f in families}
    potentials = {}
    for family in families:
        verifier = family_verifier(family)
        if verifier is not None and hasattr(verifier, "potentials"):
            potentials[family] = verifier.potentials
    return score_rules(rollouts, {t.task_id: t for t in tasks}, profiles, potentials)
