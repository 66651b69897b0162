"""Quality gates: a batch that fails great-expectations suites derived from the records goes to
quarantine with its report and never reaches the tables; `warehouse check` re-validates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gymfoundry.envs.records import DatasetRow, Run, RetryPolicy, StepScore, Termination
from gymfoundry.flows.cli import main
from gymfoundry.warehouse import TABLES, QuarantinedBatch, Warehouse, catalog
from gymfoundry.warehouse.lake import write_batch
from gymfoundry.warehouse.quality import table_expectations
from gymfoundry.warehouse.store import _row


def snapshot(wh, data_dir):
    """Everything a reader can see, plus the lake's files."""
    counts = {t: wh.count(t) for t in TABLES}
    manifest = wh.sql("select batch_id, path from manifest order by all").to_pylist()
    files = sorted(p.relative_to(data_dir).as_posix() for p in (data_dir / "lake").rglob("*") if p.is_file())
    return counts, manifest, files


def clean_batch(build, n=0):
    task = build.task("inventory", n)
    rollout = build.rollout(task, seed=n)
    return task, rollout, [build.score(rollout, i) for i in range(3)]


def corrupted_rows(build):
    """A batch with null ids, a reward out of range and orphan steps and scores."""
    task, rollout, scores = clean_batch(build, 7)
    rows = {"tasks": [_row(TABLES["tasks"], task)],
            "rollouts": [_row(TABLES["rollouts"], rollout)],
            "steps": [_row(TABLES["steps"], s, rollout_id=rollout.rollout_id, task_family="inventory")
                      for s in rollout.steps],
            "step_scores": [_row(TABLES["step_scores"], s, task_family="inventory") for s in scores]}
    rows["steps"][0]["rollout_id"] = None                     # null id
    rows["steps"][1]["reward"] = 5.0                           # reward out of range
    rows["steps"][2]["rollout_id"] = "r-no-such-rollout"       # orphan step
    rows["step_scores"][2]["step_index"] = 9                   # score of a step that does not exist
    rows["step_scores"][1]["score"] = -3.0                     # score out of range
    return rows


def test_corrupted_batch_goes_to_quarantine_with_a_report_and_the_tables_stay_unchanged(wh, data_dir, build):
    task, rollout, scores = clean_batch(build)
    assert wh.land(tasks=[task], rollouts=[rollout], scores=scores).ok
    before = snapshot(wh, data_dir)

    landing = wh.land_rows(corrupted_rows(build))
    assert not landing.ok and landing.counts == {"tasks": 0, "rollouts": 0, "steps": 0, "step_scores": 0}
    assert snapshot(wh, data_dir) == before  # nothing registered, nothing written to the lake

    folder = landing.quarantine
    assert folder.parent == data_dir / "quarantine" and folder.is_dir()
    assert sorted(p.name for p in folder.iterdir()) == ["report.json", "rollouts.jsonl", "step_scores.jsonl",
                                                        "steps.jsonl", "tasks.jsonl"]
    assert len((folder / "steps.jsonl").read_text().splitlines()) == 3
    report = json.loads((folder / "report.json").read_text())
    assert report["success"] is False and report["rows"]["steps"] == 3
    failed = {(f["table"], f["column"], f["expectation"]): f for f in report["failures"]}
    assert ("steps", "rollout_id", "expect_column_values_to_not_be_null") in failed
    assert failed[("steps", "reward", "expect_column_values_to_be_between")]["examples"] == [5.0]
    assert failed[("steps", "ref:rollouts", "expect_column_values_to_be_in_set")]["unexpected_count"] == 1
    assert ("step_scores", "ref:steps", "expect_column_values_to_be_in_set") in failed
    assert ("step_scores", "score", "expect_column_values_to_be_between") in failed
    assert report["tables"]["tasks"]["success"] is True  # the clean tables of the batch passed
    assert report["tables"]["steps"]["result"]["statistics"]["unsuccessful_expectations"] >= 3

    listed = wh.sql("select quarantine_id, path, tables, row_count from quarantine").to_pylist()
    assert listed == [{"quarantine_id": folder.name, "path": f"quarantine/{folder.name}",
                       "tables": ["rollouts", "step_scores", "steps", "tasks"], "row_count": 8}]
    # The same bad batch again: the same quarantine, still nothing landed.
    again = wh.land_rows(corrupted_rows(build))
    assert again.quarantine == folder and snapshot(wh, data_dir) == before
    assert wh.count("step_scores") == 3


CORRUPTIONS = [  # (table, row, column, value, the column and expectation that must catch it)
    ("tasks", 0, "task_id", None, "task_id", "expect_column_values_to_not_be_null"),
    ("tasks", 1, "split", "training", "split", "expect_column_values_to_be_in_set"),
    ("tasks", 1, "hidden", "{not json", "hidden", "expect_column_values_to_be_valid_json"),
    ("tasks", 1, "task_family", "../escape", "task_family", "expect_column_values_to_match_regex"),
    ("rollouts", 0, "termination", "crashed", "termination", "expect_column_values_to_be_in_set"),
    ("rollouts", 1, "task_id", "t-unknown", "ref:tasks", "expect_column_values_to_be_in_set"),
    ("steps", 0, "index", -1, "index", "expect_column_values_to_be_between"),
]


def test_each_gate_catches_its_corruption(wh, build):
    pairs = [clean_batch(build, n)[:2] for n in range(2)]
    rows = {"tasks": [_row(TABLES["tasks"], t) for t, _ in pairs],
            "rollouts": [_row(TABLES["rollouts"], r) for _, r in pairs],
            "steps": [_row(TABLES["steps"], s, rollout_id=r.rollout_id, task_family="inventory")
                      for _, r in pairs for s in r.steps]}
    for table, i, column, value, _, _ in CORRUPTIONS:
        rows[table][i][column] = value
    landing = wh.land_rows(rows)
    assert not landing.ok
    failed = {(f["table"], f["column"], f["expectation"]) for f in landing.report.failures}
    assert {(table, column, expectation) for table, _, _, _, column, expectation in CORRUPTIONS} <= failed
    assert [wh.count(t) for t in ("tasks", "rollouts", "steps")] == [0, 0, 0]


def test_record_methods_raise_when_their_batch_is_quarantined(wh, build):
    task, rollout, _ = clean_batch(build)
    with pytest.raises(QuarantinedBatch, match=r"rollouts\.ref:tasks"):
        wh.land_rollouts([rollout])  # its task never landed
    bad = StepScore.model_construct(**{**build.score(rollout, 0).model_dump(), "score": 2.0})
    with pytest.raises(QuarantinedBatch, match=r"step_scores\.score"):
        wh.land(tasks=[task], rollouts=[rollout], scores=[bad]).checked()
    assert wh.count("rollouts") == wh.count("tasks") == 0


def test_suites_are_derived_from_the_records():
    def kinds(table):
        return {(type(e).__name__, getattr(e, "column", None)) for e in table_expectations(table)}

    rollouts = {type(e).__name__: e for e in table_expectations("rollouts")
                if getattr(e, "column", None) == "termination"}
    assert sorted(rollouts["ExpectColumnValuesToBeInSet"].value_set) == sorted(t.value for t in Termination)
    tasks = kinds("tasks")
    assert ("ExpectColumnValuesToBeInSet", "split") in tasks
    assert ("ExpectColumnValuesToBeValidJson", "hidden") in tasks
    assert ("ExpectColumnValuesToNotBeNull", "goal") in tasks and ("ExpectColumnValuesToBeUnique", "task_id") in tasks
    steps = {(type(e).__name__, getattr(e, "column", None)): e for e in table_expectations("steps")}
    assert steps[("ExpectColumnValuesToBeBetween", "index")].min_value == 0   # Step.index: Field(ge=0)
    assert ("ExpectColumnValuesToNotBeNull", "thought") not in steps          # optional in the record
    rows = {(type(e).__name__, getattr(e, "column", None)): e for e in table_expectations("dataset_rows")}
    assert rows[("ExpectColumnValuesToBeBetween", "difficulty")].max_value == 5
    assert ("ExpectCompoundColumnsToBeUnique", None) in {(type(e).__name__, None) for e in
                                                          table_expectations("dataset_rows")}
    assert kinds("runs")  # every table has a suite


def test_a_crash_before_the_commit_leaves_no_partial_batch(wh, data_dir, build, monkeypatch):
    from gymfoundry.warehouse import store

    task, rollout, scores = clean_batch(build)

    def crash():
        raise KeyboardInterrupt("killed mid-registration")

    monkeypatch.setattr(store, "_landing_hook", crash)
    with pytest.raises(KeyboardInterrupt):
        wh.land(tasks=[task], rollouts=[rollout], scores=scores)
    assert [wh.count(t) for t in ("tasks", "rollouts", "steps", "step_scores")] == [0, 0, 0, 0]
    assert wh.sql("select count(*) as n from manifest").to_pylist() == [{"n": 0}]
    # the interrupted registration took its files back out of staging, and the landing dropped them
    # with the batch (the caller holds the records); a SIGKILL leaves them in staging, for the next
    # writer to remove (tests/flows/test_durability.py)
    assert [p for p in data_dir.rglob("*.parquet")] == []
    monkeypatch.undo()
    assert wh.land(tasks=[task], rollouts=[rollout], scores=scores).counts == \
        {"tasks": 1, "rollouts": 1, "steps": 3, "step_scores": 3}
    assert len(list((data_dir / "lake").rglob("*.parquet"))) == 4
    assert list((data_dir / "staging").rglob("*.parquet")) == [] and not list((data_dir / "incoming").rglob("*.*"))


def test_runs_and_dataset_lineage_land_and_read_back(wh, build):
    task, rollout, _ = clean_batch(build)
    wh.land(tasks=[task], rollouts=[rollout]).checked()
    run = Run(params={"seed": 1}, retry_policy=RetryPolicy(max_retries=3), attempted=1, by_class={"success": 1})
    from gymfoundry.envs.records import DatasetManifest

    manifest = DatasetManifest(dataset_id="sft-x", kind="sft", rows=1, families=["inventory"], learnability="p(1-p)",
                               mixture={"inventory/2": 1.0})
    row = DatasetRow(dataset_id="sft-x", row_id="abc", row_index=0, family="inventory", task_id=task.task_id,
                     difficulty=2, rollout_ids=[rollout.rollout_id], weight=1.0)
    assert wh.land(runs=[run], datasets=[manifest], dataset_rows=[row]).checked() == \
        {"runs": 1, "datasets": 1, "dataset_rows": 1}
    assert wh.load("runs") == [run] and wh.load("datasets") == [manifest] and wh.load("dataset_rows") == [row]
    assert [p.parent.name for p in wh.files("runs")] == ["runs"]  # not partitioned
    orphan = row.model_copy(update={"row_id": "def", "dataset_id": "sft-missing"})
    assert not wh.land(dataset_rows=[orphan]).ok


def test_warehouse_check_revalidates_what_landed(data_dir, build, capsys):
    with Warehouse(data_dir) as wh:
        task, rollout, scores = clean_batch(build)
        wh.land(tasks=[task], rollouts=[rollout], scores=scores).checked()
        report = wh.check()
        assert report.success, report.summary()
        assert report.tables["steps"].rows == 3 and report.tables["integrity"].success
        # A file registered behind the gates' back (another tool, an old version): check finds it.
        orphan = _row(TABLES["steps"], rollout.steps[0], rollout_id="r-ghost", task_family="inventory")
        extra = _row(TABLES["steps"], rollout.steps[0].model_copy(update={"index": 3}),
                     rollout_id=rollout.rollout_id, task_family="inventory")
        batch = write_batch(data_dir, TABLES["steps"], "inventory", [{**orphan, "reward": 7.0}, extra])
        catalog.register(wh.con, wh.data_dir, [batch], "2026-01-01 00:00:00")
        report = wh.check()
    assert not report.success
    failed = {(f["table"], f["column"] or f["expectation"]) for f in report.failures}
    assert {("steps", "ref:rollouts"), ("steps", "reward")} <= failed
    assert ("integrity", "every_rollout_has_its_steps") in failed  # 3 steps recorded, 4 landed

    out = Path(data_dir) / "check.json"
    assert main(["warehouse", "check", "--data-dir", str(data_dir), "--report", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "FAIL steps" in printed and "CHECK FAILED" in printed
    assert json.loads(out.read_text())["success"] is False


def test_the_flow_says_so_loudly_when_a_batch_is_quarantined(tmp_path, prefect_harness, monkeypatch, caplog, capfd):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    import gymfoundry.flows.factory as factory_module
    from gymfoundry.tasks.stages.land import stage_records

    def stage_corrupted(data_dir, tasks, rejections, rollouts, scores, **lineage):  # the factory stages, then lands
        bad = StepScore.model_construct(**{**scores[0].model_dump(), "score": 9.0})
        return stage_records(data_dir, tasks, rejections, rollouts, [bad, *scores[1:]], **lineage)

    monkeypatch.setattr(factory_module, "stage_records", stage_corrupted)
    report = factory_module.factory(families=["inventory"], tasks_per_family=4, seed=3, data_dir=str(tmp_path))
    (folder,) = report["quarantined"]
    assert json.loads((Path(folder) / "report.json").read_text())["failures"][0]["column"] == "score"
    logged = caplog.text + capfd.readouterr().err  # Prefect's run logger: the console or the log records
    assert "ERROR" in logged and "QUARANTINED: a batch of" in logged and folder in logged
    with Warehouse(tmp_path, read_only=True) as wh:
        assert [wh.count(t) for t in ("tasks", "rollouts", "steps", "step_scores")] == [0, 0, 0, 0]
        (run,) = wh.load("runs")
    assert run.quarantined == [folder]
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["quarantined-batch"])))
    assert any(folder in (a.data or "") for a in artifacts)


def test_the_json_expectation_finds_every_value_that_is_no_json_text(wh, build):
    """`expect_column_values_to_be_valid_json`: strict JSON (a trailing comma, or NaN, which `json.loads`
    takes and no record holds, is none); nulls are the not-null check's."""
    tasks = [build.task("inventory", n) for n in range(5)]
    rows = [_row(TABLES["tasks"], t) for t in tasks]
    rows[0]["hidden"], rows[1]["initial_state"], rows[2]["hidden"] = "{not json", "", '{"a": [1, 2,]}'
    rows[3]["hidden"], rows[4]["hidden"] = '"a plain string is JSON"', '{"x": NaN}'
    landing = wh.land_rows({"tasks": rows})
    failed = {f["column"]: f for f in landing.report.failures if f["expectation"] == "expect_column_values_to_be_valid_json"}
    assert sorted(failed) == ["hidden", "initial_state"]
    assert failed["hidden"]["unexpected_count"] == 3 and sorted(failed["hidden"]["examples"]) == \
           ['{"a": [1, 2,]}', '{"x": NaN}', "{not json"]
    assert failed["initial_state"]["examples"] == [""]
