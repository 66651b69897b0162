"""Identity and repair, through the factory flow and the CLI: the fault config is part of a
rollout's id, so a clean run after a `--fault-rate 0.5` run on the same data dir lands its own
rollouts (were it not, the faulted rows would stand in for them and their successes be lost),
and `--on-exhausted fail` lands what completed and records the failed run."""

from __future__ import annotations

import pytest

from gymfoundry.envs.records import FaultConfig, RetryPolicy, Run, Termination
from gymfoundry.flows.cli import main
from gymfoundry.flows.factory import factory
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.stages.isolate import HOLDOUT_FRACTION, isolate_tasks
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.retry import RetryExhausted, collect_with_retries
from gymfoundry.tasks.stages.validate import validate_tasks
from gymfoundry.warehouse import Warehouse

pytestmark = pytest.mark.usefixtures("prefect_harness")


def rollout_rows(data_dir) -> dict[str, dict]:
    with Warehouse(data_dir, read_only=True) as wh:
        return {r["rollout_id"]: r for r in wh.sql("select rollout_id, termination, faults from rollouts").to_pylist()}


def test_a_clean_run_after_a_faulted_run_lands_every_rollout_and_a_rerun_lands_none(tmp_path, capsys):
    data_dir = str(tmp_path / "d")
    common = ["run", "--families", "inventory", "--tasks", "12", "--seed", "5", "--samples", "1",
              "--retry-backoff", "0", "--data-dir", data_dir]
    assert main(common + ["--fault-rate", "0.5"]) == 0
    faulted = rollout_rows(data_dir)
    assert sum(r["termination"] == "env_fault" for r in faulted.values()) > 12  # most attempts met a fault
    assert main(common) == 0  # no quarantine: every new rollout lands with its steps and scores
    out = capsys.readouterr().out
    both = rollout_rows(data_dir)
    clean = {i: r for i, r in both.items() if i not in faulted}
    assert len(clean) == 12 and all(r["faults"] is None for r in clean.values())
    assert all(r["termination"] not in ("env_fault", "env_bug") for r in clean.values())
    with Warehouse(data_dir, read_only=True) as wh:
        runs = {r.faults is None: r for r in wh.load("runs")}
        steps = wh.sql("select count(distinct rollout_id) as n from steps where rollout_id in (select unnest(?))",
                       [sorted(clean)]).to_pylist()[0]["n"]
    assert steps == 12 and runs[True].landed["rollouts"] == 12 and runs[True].status == "completed"
    assert runs[True].by_class == {t: sum(r["termination"] == t for r in clean.values())
                                   for t in {r["termination"] for r in clean.values()}}
    assert runs[True].by_class.get("success", 0) > 0 and "rollouts=12" in out
    # the same inputs again: a no-op
    assert main(common) == 0
    landed = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("landed rows: "))
    assert rollout_rows(data_dir) == both and "rollouts=0" in landed.split(": ", 1)[1].split(", ")


def batch_of(seed: int, n: int):
    """The one rollout batch `factory` makes of `n` tasks (same stages, same order)."""
    valid, _ = validate_tasks(generate_tasks("inventory", n, seed))
    isolated, _ = isolate_tasks(valid, {}, HOLDOUT_FRACTION)
    return isolated


def test_on_exhausted_fail_lands_what_completed_and_records_the_failed_run(tmp_path):
    retry = RetryPolicy(max_retries=1, backoff_s=0.0, on_exhausted="fail")
    faults = FaultConfig(rate=0.1, seed=0)
    with pytest.raises(RetryExhausted) as failure:
        factory(families=["inventory"], tasks_per_family=12, seed=2, samples_per_task=1, batch_size=50,
                data_dir=str(tmp_path), retry=retry, faults=faults)
    # what the batch had collected when the retry policy gave up, replayed without Prefect
    with pytest.raises(RetryExhausted) as direct:
        collect_with_retries(batch_of(2, 12), make_policy("scripted", "inventory", mistake_rate=0.25), 1, 2,
                             retry, faults, sleep=lambda s: None)
    expected = {r.rollout_id: r for r in direct.value.rollouts}
    assert len(expected) == 11 and [r.termination for r in direct.value.rollouts[-2:]] == [Termination.env_fault] * 2
    assert {Termination.success, Termination.failure} <= {r.termination for r in expected.values()}
    landed = rollout_rows(tmp_path)
    assert set(landed) == set(expected)
    assert all(landed[i]["termination"] == r.termination.value for i, r in expected.items())
    with Warehouse(tmp_path, read_only=True) as wh:
        (run,) = wh.load("runs")
        (n_tasks,) = wh.sql("select count(*) as n from tasks").to_pylist()
        (n_steps,) = wh.sql("select count(*) as n from steps").to_pylist()
    assert n_tasks["n"] == len(batch_of(2, 12)) and n_steps["n"] == sum(len(r.steps) for r in expected.values())
    assert run.status == "failed" and "2 attempts ended in env_fault" in run.error
    assert run.attempted == len(expected) and run.landed["rollouts"] == len(expected)
    assert run.run_id in str(failure.value) and "What completed landed" in str(failure.value)
    # the completed run of the same configuration is another run, not hidden behind the failed one
    completed = Run(params=run.params, retry_policy=run.retry_policy, faults=run.faults)
    assert completed.run_id != run.run_id


def test_on_exhausted_fail_through_the_cli_exits_1_with_the_reason(tmp_path, capsys):
    data_dir = str(tmp_path / "d")
    # one batch, which stops at its first failure (batches side by side each play up to their own)
    code = main(["run", "--families", "inventory", "--tasks", "6", "--seed", "2", "--samples", "1", "--batch-size", "6",
                 "--fault-rate", "1.0", "--max-retries", "0", "--on-exhausted", "fail", "--data-dir", data_dir])
    err = capsys.readouterr().err
    assert code == 1 and "RetryExhausted" in err and "failed" in err and "1 attempts ended in env_fault" in err
    with Warehouse(data_dir, read_only=True) as wh:
        (run,) = wh.load("runs")
    assert run.status == "failed" and run.by_class == {"env_fault": 1}
