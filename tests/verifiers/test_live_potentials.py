"""Progress potentials recorded during the live episode (envs.verifier.LiveProgress) are exactly
what the verifier's replay computes, for every family whose verifier replays; scoring uses them
only for the rollout object they were recorded for, with its steps as played, and replays the
steps of any other (loaded, copied, rebuilt or edited) rollout."""

from __future__ import annotations

import pytest

from gymfoundry import envs  # noqa: F401  registers the families
from gymfoundry.envs.family import families, family
from gymfoundry.envs.records import FaultConfig, ToolCall
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.episodes import collect_rollouts, rollout_seed, run_episode
from gymfoundry.envs.verifier import ReplayVerifier, recorded_potentials

REPLAYED = [f.name for f in families()
            if isinstance(f.outcome_verifier, ReplayVerifier) and f.scripted_policy is not None]


@pytest.mark.parametrize("name", REPLAYED)
def test_live_potentials_equal_the_replay(name):
    fam = family(name)
    verifier = fam.outcome_verifier
    tasks = [fam.generate(seed, level) for seed in range(3) for level in fam.levels][:8]
    rollouts = collect_rollouts(tasks, make_policy("scripted", name, mistake_rate=0.5), 2, 0)
    by_id = {t.task_id: t for t in tasks}
    kept = 0
    for rollout in rollouts:
        task = by_id[rollout.task_id]
        recorded = recorded_potentials(rollout, task, verifier.potentials)
        if recorded is not None:
            kept += 1
            assert recorded == verifier.potentials(task, rollout.steps), rollout.rollout_id
    assert kept == len(rollouts) or type(verifier).potentials is not ReplayVerifier.potentials


def test_live_potentials_under_faults_equal_the_replay():
    fam = family("inventory")
    verifier = fam.outcome_verifier
    policy = make_policy("scripted", "inventory", mistake_rate=0.4)
    faults = FaultConfig(rate=0.3, seed=5)
    for task in [fam.generate(seed, level) for seed in range(4) for level in fam.levels]:
        rollout = run_episode(task, policy, rollout_seed(0, task, 0), faults=faults)
        assert recorded_potentials(rollout, task, verifier.potentials) == verifier.potentials(task, rollout.steps)


def test_only_the_rollout_as_played_carries_them():
    fam = family("inventory")
    verifier = fam.outcome_verifier
    task = fam.generate(1, 2)
    rollout = run_episode(task, make_policy("scripted", "inventory", mistake_rate=0.0), 0)
    assert recorded_potentials(rollout, task, verifier.potentials) is not None
    other = fam.generate(2, 2)
    assert recorded_potentials(rollout, other, verifier.potentials) is None  # another task
    assert recorded_potentials(rollout, task, lambda t, s: [0.0] * (len(s) + 1)) is None  # not a verifier's
    assert recorded_potentials(rollout.model_copy(), task, verifier.potentials) is None
    reloaded = type(rollout).model_validate(rollout.model_dump())
    assert reloaded == rollout and recorded_potentials(reloaded, task, verifier.potentials) is None
    rollout.steps[0].tool_call = ToolCall(name="get_stock", arguments={"sku": "SKU-1"})  # edited after the episode
    assert recorded_potentials(rollout, task, verifier.potentials) is None
    rollout.steps = rollout.steps[:-1]
    assert recorded_potentials(rollout, task, verifier.potentials) is None


def test_a_potential_that_raises_never_reaches_the_episode(monkeypatch):
    """A grader bug in the live record is no env bug and no refused task: the episode ends as it
    would have, nothing is recorded, and scoring's replay meets the error itself."""
    fam = family("inventory")
    verifier = fam.outcome_verifier
    task = fam.generate(4, 2)
    policy = make_policy("scripted", "inventory", mistake_rate=0.0)
    expected = run_episode(task, policy, 0)

    def broken(self, task, state):
        raise RuntimeError("grader bug")

    monkeypatch.setattr(type(verifier), "potential", broken)
    rollout = run_episode(task, policy, 0)
    assert rollout.termination == expected.termination and len(rollout.steps) == len(expected.steps)
    assert recorded_potentials(rollout, task, verifier.potentials) is None
    with pytest.raises(RuntimeError, match="grader bug"):
        verifier.potentials(task, rollout.steps)
