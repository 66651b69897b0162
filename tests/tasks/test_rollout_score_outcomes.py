"""Rollouts and scores of a fixed seed set are exactly what the code produced before the rollout
and scoring paths were made faster (issue 19): the same terminations, verifier checks and step
scores. The figures below were recorded from the code before that change (commit 6bd6e59); a
change to what an episode or a score is must show up here, not pass unnoticed as a speed-up.
Recorded again for issue 31 (inventory verifier 2, rules 6): the same terminations; the scores of
violations and failed endings fell (Φ after the submit follows the verdict, refused reserves are
not permitted), and a denied submit whose authorisation request faulted fails by its missing
evidence instead of by the invariants (2 episodes, both env_fault)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

from gymfoundry.envs.family import family
from gymfoundry.envs.records import FaultConfig
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.episodes import collect_rollouts, rollout_seed, run_episode
from gymfoundry.tasks.stages.score import score_rollouts


def outcomes(mistake_rate: float, seeds: range, samples: int = 2, faults: FaultConfig | None = None) -> dict:
    fam = family("inventory")
    tasks = [fam.generate(seed, level) for seed in seeds for level in fam.levels]
    policy = make_policy("scripted", "inventory", mistake_rate=mistake_rate)
    if faults is None:
        rollouts = collect_rollouts(tasks, policy, samples, 0)
    else:
        rollouts = [run_episode(t, policy, rollout_seed(0, t, k), faults=faults) for t in tasks for k in range(samples)]
    scores = score_rollouts(rollouts, tasks)
    failed_checks = Counter(name for r in rollouts if r.outcome for name, c in r.outcome.checks.items() if not c.passed)
    # Everything an episode and its scores are, less the clocks (wall time, step latency).
    episodes = [r.model_dump(mode="json", exclude={"cost": {"wall_time_s"}, "steps": {"__all__": {"latency_s"}}})
                for r in rollouts]
    text = json.dumps([episodes, [s.model_dump(mode="json") for s in scores]], sort_keys=True)
    return {"steps": sum(len(r.steps) for r in rollouts),
            "terminations": dict(sorted(Counter(r.termination.value for r in rollouts).items())),
            "failed_checks": dict(sorted(failed_checks.items())),
            "layers": dict(sorted(Counter(s.layer for s in scores).items())),
            "combined_sum": round(sum(s.score for s in scores if s.layer == "combined"), 6),
            "digest": hashlib.sha256(text.encode()).hexdigest()}


def test_scripted_inventory_outcomes_are_unchanged():
    assert outcomes(0.25, range(20)) == {
        "steps": 1050, "terminations": {"constraint_violation": 50, "failure": 49, "success": 101},
        "failed_checks": {"hidden_variation": 68, "invariants": 67, "observation": 51},
        "layers": {"combined": 1050, "judge": 1050, "rules": 1050}, "combined_sum": 69.7,
        "digest": "809478bc8373360f495296ed3601342b46aa9f227c145b4a9443223c04cbdc4a"}


def test_many_mistakes_outcomes_are_unchanged():
    assert outcomes(0.6, range(20, 40)) == {
        "steps": 1162, "terminations": {"constraint_violation": 117, "failure": 41, "success": 42},
        "failed_checks": {"hidden_variation": 95, "invariants": 95, "observation": 80},
        "layers": {"combined": 1162, "judge": 1162, "rules": 1162}, "combined_sum": -24.2,
        "digest": "7bd45b601ad10bca65a60ced173cc0f6c9960a463a5acd654b7b38cee7251b2b"}


def test_outcomes_under_injected_faults_are_unchanged():
    """Faulted calls are rolled back and taint their attempt, exactly as before."""
    assert outcomes(0.3, range(40, 50), faults=FaultConfig(rate=0.15, seed=3)) == {
        "steps": 555, "terminations": {"constraint_violation": 14, "env_fault": 50, "failure": 13, "success": 23},
        "failed_checks": {"hidden_variation": 63, "invariants": 63, "observation": 57},
        "layers": {"combined": 555, "judge": 480, "rules": 555}, "combined_sum": 9.3,
        "digest": "09cecd760daa8842fdbd9fcf24ff21f90a84d500753cfa695aa4a3cf5975a6b9"}
