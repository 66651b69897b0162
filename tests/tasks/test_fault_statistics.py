"""Faults never change statistics.

Counting an attempt that met a fault and still succeeded, but not one that met a fault and
failed, makes measured success rise with the fault rate (survivor bias). Here the same 30 tasks, scripted
policy and seeds are run at fault rates 0 and 0.5, with enough retries that every task gets an
attempt no fault touched, and every statistic the product computes must come out identical.
"""

from __future__ import annotations

import pytest

from gymfoundry.envs.records import MODEL_OUTCOMES, FaultConfig, RetryPolicy, Rollout, Termination
from gymfoundry.tasks.stages import curriculum
from gymfoundry.tasks.stages.assemble import assemble_datasets, load_dataset
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.retry import collect_with_retries
from gymfoundry.warehouse import Warehouse
from tests.audits import audited

N_TASKS, SEED = 30, 3
# At 0.5 per tool call a 13-call episode meets no fault once in 8192 attempts: with these seeds
# the longest chain needs a few thousand. The cap only has to be out of reach.
RETRY = RetryPolicy(max_retries=100_000, backoff_s=0.0)


def faulted(rollout: Rollout) -> bool:
    return any(s.error in ("env_fault", "env_bug") for s in rollout.steps)


def episode(rollout: Rollout) -> dict:
    """What the agent did and what it got, without timings and identity."""
    steps = [s.model_dump(exclude={"latency_s"}) for s in rollout.steps]
    return {"task_id": rollout.task_id, "seed": rollout.seed, "steps": steps, "termination": rollout.termination,
            "reason": rollout.termination_reason, "outcome": rollout.outcome}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both runs, collected and landed in a data dir each, with their datasets assembled."""
    tasks = generate_tasks("inventory", N_TASKS, seed=SEED)
    out = {}
    for rate in (0.0, 0.5):
        policy = make_policy("scripted", "inventory", mistake_rate=0.25)
        rollouts = collect_with_retries(tasks, policy, 1, SEED, RETRY, FaultConfig(rate=rate, seed=SEED),
                                        sleep=lambda s: None)
        data_dir = tmp_path_factory.mktemp(f"faults-{rate}")
        with Warehouse(data_dir) as wh:
            wh.land(tasks=tasks, rollouts=rollouts).checked()
        audited(data_dir, ["inventory"])
        datasets = assemble_datasets(data_dir, ["inventory"], min_margin=0.5)
        out[rate] = {"rollouts": rollouts, "data_dir": data_dir, "datasets": datasets}
    return tasks, out


def test_the_fault_run_is_a_hard_one(runs):
    """Not a vacuous comparison: most attempts met a fault, many of them would have succeeded."""
    _, out = runs
    clean, noisy = out[0.0]["rollouts"], out[0.5]["rollouts"]
    assert len(clean) == N_TASKS and not any(faulted(r) for r in clean)
    touched = [r for r in noisy if faulted(r)]
    assert len(touched) > 1000
    verified_anyway = [r for r in touched if r.outcome is not None and r.outcome.success]
    assert len(verified_anyway) > 0  # the old rule counted each of these as a success
    assert all(r.termination == Termination.env_fault for r in touched)


def test_every_task_gets_one_clean_attempt_and_it_is_the_fault_free_episode(runs):
    _, out = runs
    clean = {r.task_id: r for r in out[0.0]["rollouts"]}
    last = {}
    for r in out[0.5]["rollouts"]:
        assert r.faults == FaultConfig(rate=0.5, seed=SEED)
        if r.termination in MODEL_OUTCOMES:
            assert r.task_id not in last, "a model outcome is never retried"
            last[r.task_id] = r
    assert sorted(last) == sorted(clean)
    for task_id, r in last.items():
        assert not faulted(r) and episode(r) == episode(clean[task_id])
        assert r.rollout_id != clean[task_id].rollout_id  # its own rollout (another fault config)


def test_success_rates_are_identical_at_fault_rates_0_and_half(runs):
    tasks, out = runs
    level = {t.task_id: t.difficulty.level for t in tasks}

    def rates(rollouts):
        return curriculum.success_rates([{"task_family": r.family, "difficulty": level[r.task_id],
                                          "termination": r.termination.value} for r in rollouts])

    assert rates(out[0.5]["rollouts"]) == rates(out[0.0]["rollouts"])
    views = {}
    for rate, run in out.items():
        with Warehouse(run["data_dir"], read_only=True) as wh:
            views[rate] = wh.sql("""select difficulty_level, model_outcomes, successes, success_rate
                                    from success_by_cell order by 1""").to_pylist()
    assert views[0.5] == views[0.0]
    overall = sum(c["successes"] for c in views[0.0]) / sum(c["model_outcomes"] for c in views[0.0])
    assert overall == 13 / 30  # the fault-free rate of these tasks, policy and seeds


def test_a_faulted_attempt_never_reaches_a_dataset(runs):
    """Faulted successes are env_fault, so SFT sees only the clean attempts: the same rows, the
    same curriculum, as without faults."""
    _, out = runs
    noisy = {r.rollout_id: r for r in out[0.5]["rollouts"]}
    sets = {}
    for rate, run in out.items():
        sft, dpo = run["datasets"]["sft"], run["datasets"]["dpo"]
        assert sft["rows"] == 13 and dpo["rows"] == 0  # one sample per task: no same-task pairs
        sft_rows = load_dataset(sft["path"])
        if rate == 0.5:
            assert all(not faulted(noisy[i]) and noisy[i].termination == Termination.success
                       for i in sft_rows["rollout_id"])
        sets[rate] = (sorted(map(str, sft_rows["messages"])), sft["mixture"])
    assert sets[0.5] == sets[0.0]
    with Warehouse(out[0.5]["data_dir"], read_only=True) as wh:
        manifests = {m.kind: m for m in wh.load("datasets")}
    with Warehouse(out[0.0]["data_dir"], read_only=True) as wh:
        assert {m.kind: m.success_rates for m in wh.load("datasets")} == \
            {k: m.success_rates for k, m in manifests.items()}
