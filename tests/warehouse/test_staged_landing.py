"""Workers write, one process registers: `gymfoundry.warehouse.stage` (rows, content ids, gates, Parquet files
in the data dir's incoming folder) runs in any process; `Warehouse.land_staged` in the one writer
checks keys and references against the catalog and registers the files. Hostile: a staged file
changed after its gates, a batch staged for another data dir, a reference nothing satisfies, and a
rollout landed before must each land nothing they should not."""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

import os
import time

from gymfoundry.envs.records import Step, Verdict
from gymfoundry.warehouse import TABLES, Warehouse, catalog
from gymfoundry.warehouse.lake import batch_id
from gymfoundry.warehouse.staged import INCOMING_DIR, stage


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
    assert wh.sql("select count(*) n from manifest").to_pylist() == [{"n": 0}]
    assert incoming(data_dir)  # kept to look at: `warehouse check` lists it, `repair` removes it once stale


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


def test_a_check_that_raises_while_the_files_are_written_leaves_nothing_in_incoming(data_dir, build, monkeypatch):
    from gymfoundry.warehouse import quality

    def broken(*args, **kwargs):
        raise RuntimeError("the gates broke")

    monkeypatch.setattr(quality, "validate_batch", broken)
    with pytest.raises(RuntimeError, match="the gates broke"):
        stage(data_dir, **batch(build, 9))
    assert incoming(data_dir) == []


def test_a_tampered_copy_of_a_task_after_its_original_goes_to_quarantine(wh, data_dir, build):
    task = build.task("inventory", 1)
    tampered = task.model_copy(update={"goal": "tampered goal"})  # keeps the original's id
    landing = wh.land(tasks=[task, tampered])
    assert not landing.ok and wh.count("tasks") == 0
    assert wh.land(tasks=[task]).checked() == {"tasks": 1}
    assert not wh.land(tasks=[task, tampered]).ok  # refused, not skipped as a repeat of a landed key


def test_a_tampered_copy_repeating_a_key_is_staged_with_its_verdict_and_its_files_removed(data_dir, build,
                                                                                            monkeypatch):
    """The files are written before the content ids are checked (from the first row of each key): a
    tampered copy that repeats its original's key joins the rows afterwards, and the batch never
    passes, even were its gates to say so, and leaves no file behind."""
    from gymfoundry.warehouse import quality

    task = build.task("inventory", 2)
    tampered = task.model_copy(update={"goal": "tampered goal"})
    staged = stage(data_dir, tasks=[task, tampered])
    assert not staged.passed and not incoming(data_dir) and not staged.batches
    assert staged.parts["tasks"].num_rows == 2
    assert staged.identity["tasks"] == [quality.FOUND, f"{task.task_id}: its content hashes to {tampered.compute_id()}"]
    monkeypatch.setattr(quality, "validate_batch",
                        lambda *a, **k: quality.QualityReport({}))  # gates that pass whatever they see
    staged = stage(data_dir, tasks=[task, tampered])
    assert not staged.passed and not incoming(data_dir) and not staged.batches
    assert stage(data_dir, tasks=[task]).passed  # (the same gates pass an honest batch)


def test_a_given_verdict_sharing_the_key_of_a_landed_rollouts_own_lands(wh, build):
    task = build.task("inventory", 1)
    rollout = build.rollout(task)
    wh.land(tasks=[task], rollouts=[rollout])  # no outcomes yet
    given = Verdict.of_rollout(rollout, "2026-01-01T00:00:00+00:00").model_copy(update={"source": "reverify"})
    assert wh.land(rollouts=[rollout], rollout_outcomes=True, outcomes=[given]).checked()["outcomes"] == 1
    assert wh.sql("select source from outcomes").to_pylist() == [{"source": "reverify"}]


def test_a_registration_that_fails_leaves_the_batch_to_land_again(wh, data_dir, build, monkeypatch):
    staged = stage(data_dir, **batch(build))

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(catalog, "register", broken)
    with pytest.raises(OSError, match="disk full"):
        wh.land_staged(staged)
    monkeypatch.undo()
    assert wh.count("tasks") == 0 and len(incoming(data_dir)) == len(staged.batches)
    assert wh.land_staged(staged).checked()["steps"] == 3
    with pytest.raises(ValueError, match="landed .or was discarded. already"):
        wh.land_staged(staged)


@pytest.mark.parametrize("forged", [{"stage_id": ".."}, {"stage_id": "../../x" + "0" * 25},
                                    {"path": "lake/../../catalog.duckdb"}, {"table": "no_such_table"},
                                    {"task_family": "../x"}])
def test_a_staged_batch_naming_paths_outside_its_place_is_refused(wh, data_dir, build, forged):
    staged = stage(data_dir, **batch(build))
    if "stage_id" in forged:
        staged.stage_id = forged["stage_id"]
    else:
        first = staged.batches[0]
        staged.batches[0] = type(first)(**{**first.__dict__, **forged})
    before = sorted(p.relative_to(data_dir).as_posix() for p in data_dir.rglob("*"))
    with pytest.raises(ValueError):
        wh.land_staged(staged)
    assert sorted(p.relative_to(data_dir).as_posix() for p in data_dir.rglob("*")) == before
    assert wh.count("tasks") == 0


def test_check_reports_a_batch_left_in_incoming_and_repair_removes_it_once_stale(wh, data_dir, build):
    stage(data_dir, **batch(build))  # never handed to the writer: its worker died, say
    report = wh.check()
    assert report.success  # not damage: no view reads it
    assert {f["kind"] for f in report.files} == {"incoming"}
    assert wh.repair().removed_temp == []  # it may be a live worker's: not yet
    for file in incoming(data_dir):
        os.utime(file, (time.time() - 7200, time.time() - 7200))
    assert len(wh.repair().removed_temp) == 5 and not incoming(data_dir)


def test_batch_ids_are_the_keys_whatever_their_order_and_no_two_key_sets_share_one():
    import pyarrow as pa

    table = TABLES["task_rejections"]
    one = pa.table({"task_id": ["a", "b"], "stage": ["x", "y"]})
    assert batch_id(table, "f", one) == batch_id(table, "f", pa.table({"task_id": ["b", "a"], "stage": ["y", "x"]}))
    crafted = [({"task_id": ["\t"], "stage": ["\0" * 8 + "\x01" + "\0" * 7 + "\x02" + "\0" * 7 + "xy"]}),
               ({"task_id": ["\x00", "\x1a" + "\0" * 7], "stage": ["x", "y"]}),
               ({"task_id": [None], "stage": ["x"]}), ({"task_id": ["\0null"], "stage": ["x"]}),
               ({"task_id": ["ab"], "stage": ["c"]}), ({"task_id": ["a"], "stage": ["bc"]})]
    ids = [batch_id(table, "f", pa.table(keys)) for keys in crafted]
    assert len(set(ids)) == len(ids)
