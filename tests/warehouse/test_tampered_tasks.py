"""Task ids are content hashes, re-checked at landing: a tampered TaskSpec (`model_copy(update=...)`
keeps the old id) sends its batch to quarantine like any other gate failure, and a bad row that
reached the table around the gates (an old data dir) never makes `load_tasks` fail for the table."""

from __future__ import annotations

import json
import logging

from gymfoundry.envs.records import TaskSpec
from gymfoundry.flows.cli import main
from gymfoundry.warehouse import TABLES, Warehouse, catalog
from gymfoundry.warehouse.lake import write_batch
from gymfoundry.warehouse.store import _row


def test_a_tampered_task_goes_to_quarantine_with_a_clear_failure(wh, data_dir, build):
    good = build.task("inventory", 1)
    tampered = build.task("inventory", 2).model_copy(update={"goal": "x"})
    assert tampered.task_id != tampered.compute_id()
    landing = wh.land(tasks=[good, tampered], rollouts=[build.rollout(tampered)])
    assert not landing.ok and wh.count("tasks") == 0 and wh.count("rollouts") == 0
    [failure] = landing.report.failures
    assert (failure["table"], failure["column"]) == ("tasks", "id:task_id")
    assert failure["examples"] == [f"{tampered.task_id}: its content hashes to {tampered.compute_id()}"]
    [row] = wh.sql("select tables, failures from quarantine").to_pylist()
    assert json.loads(row["failures"])[0]["column"] == "id:task_id"
    assert (landing.quarantine / "tasks.jsonl").read_text().count("\n") == 2  # kept whole, nothing lost
    assert wh.land(tasks=[good]).checked() == {"tasks": 1}
    assert wh.load_tasks() == [good]


def test_a_tampered_copy_of_a_landed_task_is_refused_not_skipped(wh, build):
    task = build.task("inventory", 3)
    wh.land_tasks([task])
    tampered = task.model_copy(update={"hidden": task.hidden.model_copy(update={"checks": {}})})
    landing = wh.land(tasks=[tampered])
    assert not landing.ok and [f["column"] for f in landing.report.failures] == ["id:task_id"]
    assert wh.load_tasks() == [task]


def test_a_task_edited_in_place_after_its_id_was_remembered_is_refused(wh, build, monkeypatch):
    """`compute_id` remembers ids by content: an edit inside a nested dict after the task was made
    (its id hashed and remembered) is new content, hashed again, and refused at landing."""
    from gymfoundry.envs import records

    task = build.task("inventory", 7)
    original = task.task_id
    assert task.compute_id() == original  # remembered: the same answer
    task.initial_state["extra"] = "smuggled"  # in place: no validation, the old id stays
    expected = task.compute_id()
    monkeypatch.setattr(records, "_TASK_IDS", {})  # what the rule gives without anything remembered
    assert expected == task.compute_id() != original
    landing = wh.land(tasks=[task])
    assert not landing.ok and wh.count("tasks") == 0
    [failure] = landing.report.failures
    assert failure["examples"] == [f"{original}: its content hashes to {expected}"]


def test_a_row_that_is_no_task_is_refused(wh, build):
    row = _row(TABLES["tasks"], build.task("inventory", 4))
    row["allowed_tools"] = "lookup"  # not a list: no TaskSpec holds it
    landing = wh.land_rows({"tasks": [row]})
    assert not landing.ok
    assert any(f["column"] == "id:task_id" and "not a valid TaskSpec" in f["examples"][0]
               for f in landing.report.failures)


def test_a_bad_row_from_around_the_gates_is_skipped_reported_and_checked(data_dir, build, caplog, capsys):
    good = build.task("inventory", 5)
    tampered = build.task("inventory", 6).model_copy(update={"goal": "x"})
    with Warehouse(data_dir) as wh:
        wh.land_tasks([good])
        # What `land` accepted before it re-checked ids: a file registered without the gates.
        batch = write_batch(data_dir, TABLES["tasks"], "inventory", [_row(TABLES["tasks"], tampered)])
        catalog.register(wh.con, wh.data_dir, [batch], "2026-01-01 00:00:00")
    with Warehouse(data_dir, read_only=True) as wh, caplog.at_level(logging.WARNING, "gymfoundry.warehouse"):
        assert wh.count("tasks") == 2
        assert wh.load_tasks() == [good]
        assert [s["key"] for s in wh.skipped] == [{"task_id": tampered.task_id}]
        assert tampered.task_id in caplog.text and "warehouse check" in caplog.text
        report = wh.check()
    assert not report.success
    assert [(f["table"], f["column"]) for f in report.failures] == [("tasks", "id:task_id")]
    out = data_dir / "check.json"
    assert main(["warehouse", "check", "--data-dir", str(data_dir), "--report", str(out)]) == 1
    assert "id:task_id" in capsys.readouterr().out


def test_landed_tasks_read_back_as_valid_records(wh, build):
    tasks = [build.task("inventory", n) for n in range(3)]
    wh.land_tasks(tasks)
    loaded = wh.load_tasks()
    assert loaded == sorted(tasks, key=lambda t: t.task_id)
    assert all(TaskSpec.model_validate(t.model_dump()).task_id == t.task_id for t in loaded)
