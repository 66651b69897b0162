"""Workers write, one process registers: `warehouse.stage` (rows, content ids, gates, Parquet files
in the data dir's incoming folder) runs in any process; `Warehouse.land_staged` in the one writer
checks keys and references against the catalog and registers the files. Hostile: a staged file
changed after its gates, a batch staged for another data dir, a reference nothing satisfies, and a
rollout landed before must each land nothing they should not."""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from envs.records import Step
from warehouse import TABLES, Warehouse
from warehouse.staged import INCOMING_DIR, stage


def contents(wh: Warehouse) -> dict[str, list]:
    """Every table's rows (less the landing clocks), sorted."""
    return {name: sorted(map(str, wh.sql(f"select * exclude (verified_at) from {name}" if name == "outcomes"
                                         else f"select * from {name}").to_pylist())) for name in TABLES}


def incoming(data_dir) -> list:
    folder = data_dir / INCOMING_DIR
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


def batch(build, n: int = 0):
    task = build.task("inventory", n)
    rollout = build.rollout(task, seed=n)
    return {"tasks": [task], "rollouts": [rollout], "scores": [build.score(rollout, i) for i in range(3)],
            "rollout_outcomes": True}


def _stage_elsewhere(data_dir: str, records: dict):
    return stage(data_dir, **records)


def test_a_batch_staged_in_another_process_lands_the_rows_land_would(tmp_path, build):
    records = batch(build)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        staged = pool.submit(_stage_elsewhere, str(tmp_path / "staged"), records).result()
    assert staged.passed and staged.parts is None  # its files hold the rows; only their names travelled
    assert len(incoming(tmp_path / "staged")) == len(staged.batches) == 5  # tasks, rollouts, steps, outcomes, scores
    with Warehouse(tmp_path / "staged") as wh:
        assert wh.land_staged(staged).checked() == {"tasks": 1, "rollouts": 1, "steps": 3, "outcomes": 1,
                                                    "step_scores": 3}
        assert not incoming(tmp_path / "staged")
        staged_rows = contents(wh)
        assert wh.check().success
    with Warehouse(tmp_path / "direct") as wh:
        wh.land(**records)
        assert contents(wh) == staged_rows


def test_landing_a_staged_batch_again_adds_nothing_even_read_back_from_its_files(wh, data_dir, build):
    records = batch(build)
    assert wh.land(**records).ok
    before = contents(wh)
    # pickled (as a worker hands it over): the writer reads the rows back from the staged files
    staged = pickle.loads(pickle.dumps(stage(data_dir, **records)))
    assert staged.parts is None
    assert wh.land_staged(staged).checked() == {"tasks": 0, "rollouts": 0, "steps": 0, "outcomes": 0,
                                                "step_scores": 0}
    assert contents(wh) == before and not incoming(data_dir)


def test_a_rollout_landed_before_is_skipped_with_all_its_steps_whatever_this_run_did(wh, data_dir, build):
    task = build.task("inventory", 1)
    rollout = build.rollout(task)
    wh.land(tasks=[task], rollouts=[rollout])
    other = rollout.model_copy(update={"steps": [*rollout.steps, Step(index=3, observation="more", result="x")]})
    fresh = build.rollout(task, seed=9)
    staged = stage(data_dir, rollouts=[other, fresh], rollout_outcomes=True)
    assert wh.land_staged(staged).checked() == {"rollouts": 1, "steps": 3, "outcomes": 1}
    assert wh.sql("select count(*) n from steps where rollout_id = ?", [rollout.rollout_id]).to_pylist() == [{"n": 3}]
    assert wh.sql("select rollout_id from outcomes").to_pylist() == [{"rollout_id": fresh.rollout_id}]


def test_a_staged_file_changed_after_its_gates_lands_nothing(wh, data_dir, build):
    staged = stage(data_dir, **batch(build))
    steps = next(b for b in staged.batches if b.table == "steps")
    file = staged.incoming(steps)
    file.chmod(0o644)
    file.write_bytes(file.read_bytes().replace(b"You see stock.", b"You see STOCK."))
    with pytest.raises(ValueError, match="changed since it was staged"):
        wh.land_staged(staged)
    assert {name: wh.count(name) for name in TABLES} == dict.fromkeys(TABLES, 0)
    assert wh.sql("select count(*) n from manifest").to_pylist() == [{"n": 0}] and not incoming(data_dir)


def test_a_batch_staged_for_another_data_dir_is_refused(wh, tmp_path, build):
    staged = stage(tmp_path / "elsewhere", **batch(build))
    with pytest.raises(ValueError, match="staged for"):
        wh.land_staged(staged)
    assert wh.count("tasks") == 0


def test_a_reference_neither_the_batch_nor_the_warehouse_satisfies_goes_to_quarantine(wh, data_dir, build):
    rollout = build.rollout(build.task("inventory", 2))
    staged = stage(data_dir, rollouts=[rollout])  # its task is neither in the batch nor landed
    assert staged.passed and staged.unresolved  # the worker cannot know: the writer checks
    landing = wh.land_staged(staged)
    assert not landing.ok and ("rollouts", "ref:tasks") in {(f["table"], f["column"]) for f in landing.report.failures}
    assert wh.count("rollouts") == 0 and wh.count("steps") == 0 and not incoming(data_dir)


def test_a_batch_failing_its_gates_is_written_nowhere_and_goes_to_quarantine(wh, data_dir, build):
    task = build.task("inventory", 5)
    bad = build.rollout(task).model_copy(update={"steps": [Step(index=0, observation="o", result="r", reward=3.0)]})
    staged = stage(data_dir, tasks=[task], rollouts=[bad])
    assert not staged.passed and not incoming(data_dir)
    landing = wh.land_staged(staged)
    assert not landing.ok and landing.quarantine.is_dir()
    assert {name: wh.count(name) for name in TABLES} == dict.fromkeys(TABLES, 0)
