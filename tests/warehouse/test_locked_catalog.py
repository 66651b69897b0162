"""A reader holding the catalog never makes a run lose data: the landing says who holds the lock,
waits with backoff, and when the lock outlasts the wait spools the batch, which the next landing
lands first and removes."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from gymfoundry.envs.records import RetryPolicy, Run, Termination
from gymfoundry.tasks.stages.land import land_records, land_run
from gymfoundry.warehouse import Warehouse

HOLD = ("import duckdb, sys, time\n"
        "con = duckdb.connect(sys.argv[1], read_only=True)\n"
        "print('held', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n")


def hold(data_dir, seconds: float) -> subprocess.Popen:
    """Another process (a notebook, say) with a read-only connection to the catalog."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(data_dir / "catalog.duckdb"), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def batch(build, first: int, n: int):
    tasks = [build.task("inventory", i) for i in range(first, first + n)]
    rollouts = [build.rollout(t, seed=i, termination=Termination.success) for i, t in enumerate(tasks, first)]
    scores = [build.score(r, i) for r in rollouts for i in range(3)]
    return tasks, rollouts, scores


@pytest.mark.integration  # a second process holds the catalog
def test_a_held_catalog_spools_the_batch_and_the_next_landing_lands_it(data_dir, build, caplog):
    Warehouse(data_dir).close()
    tasks, rollouts, scores = batch(build, 0, 3)
    holder = hold(data_dir, 120)
    try:
        with caplog.at_level(logging.WARNING, "gymfoundry.warehouse"):
            landing = land_records(str(data_dir), tasks, [], rollouts, scores, run_id="run-a", flow_run_id="fr-a",
                                   lock_timeout_s=1.5)
        assert holder.poll() is None  # gave up after its 1.5 s wait while the holder still held it
        assert f"(PID {holder.pid})" in caplog.text and "python" in caplog.text  # who holds it
        assert landing.spooled is not None and landing.spooled.parent == data_dir / "spool"
        assert landing.counts == {} and landing.ok
    finally:
        holder.kill()
        holder.wait()
    with Warehouse(data_dir, read_only=True) as wh:
        assert wh.count("rollouts") == 0

    more_tasks, more_rollouts, more_scores = batch(build, 3, 2)
    landing = land_records(str(data_dir), more_tasks, [], more_rollouts, more_scores, run_id="run-b")
    assert landing.drained == [data_dir / "spool" / landing.drained[0].name]
    assert landing.counts["rollouts"] == 2 and landing.spooled is None
    assert list((data_dir / "spool").glob("*.json")) == []
    with Warehouse(data_dir, read_only=True) as wh:
        assert wh.load_rollouts() == sorted(rollouts + more_rollouts, key=lambda r: r.rollout_id)
        assert wh.count("steps") == 15 and wh.count("step_scores") == 15 and wh.count("outcomes") == 5
        lineage = wh.sql("select run_id, flow_run_id, count(*) as n from rollouts group by all order by all")
        assert lineage.to_pylist() == [{"run_id": "run-a", "flow_run_id": "fr-a", "n": 3},
                                       {"run_id": "run-b", "flow_run_id": None, "n": 2}]

    again = land_records(str(data_dir), tasks, [], rollouts, scores, run_id="run-c")  # idempotent
    assert again.counts == {"tasks": 0, "task_rejections": 0, "rollouts": 0, "steps": 0, "outcomes": 0,
                            "step_scores": 0}
    with Warehouse(data_dir, read_only=True) as wh:
        assert wh.sql("select count(*) as n from rollouts where run_id = 'run-c'").to_pylist() == [{"n": 0}]


@pytest.mark.integration  # a second process holds the catalog
def test_a_run_record_is_spooled_too(data_dir, build):
    Warehouse(data_dir).close()
    run = Run(params={"seed": 1}, retry_policy=RetryPolicy(), started_at="2026-05-01T12:00:00+00:00")
    holder = hold(data_dir, 120)
    try:
        assert land_run(str(data_dir), run, lock_timeout_s=0.5) == {}
    finally:
        holder.kill()
        holder.wait()
    assert len(list((data_dir / "spool").glob("*.json"))) == 1
    tasks, rollouts, scores = batch(build, 0, 1)
    land_records(str(data_dir), tasks, [], rollouts, scores)
    with Warehouse(data_dir, read_only=True) as wh:
        assert wh.load("runs") == [run]
    assert list((data_dir / "spool").glob("*.json")) == []


@pytest.mark.integration  # a second process holds the catalog
def test_a_reader_that_lets_go_within_the_wait_only_delays_the_landing(data_dir, build, caplog):
    Warehouse(data_dir).close()
    tasks, rollouts, scores = batch(build, 0, 2)
    holder = hold(data_dir, 2)
    try:
        with caplog.at_level(logging.WARNING, "gymfoundry.warehouse"):
            landing = land_records(str(data_dir), tasks, [], rollouts, scores, lock_timeout_s=60)
    finally:
        holder.wait(timeout=30)
    assert f"(PID {holder.pid})" in caplog.text and "retrying" in caplog.text
    assert landing.spooled is None and landing.counts["rollouts"] == 2
    assert not (data_dir / "spool").exists()


@pytest.mark.parametrize("message,holder", [
    ('IO Error: Could not set lock on file "/d/catalog.duckdb": Conflicting lock is held in /usr/bin/duckdb '
     '(PID 4242). However, you would be able to open this database in read-only mode', "/usr/bin/duckdb (PID 4242)"),
    ("IO Error: Could not set lock on file: Resource temporarily unavailable", "another process"),
])
def test_the_lock_holder_is_read_from_duckdbs_message(message, holder):
    from gymfoundry.warehouse.store import lock_holder

    assert lock_holder(message) == holder
