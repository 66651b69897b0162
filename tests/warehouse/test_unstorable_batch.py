"""A value no column can hold never loses a batch: a rollout holding one (a token id beyond int64, a
lone surrogate in its text or its call) goes to quarantine with a reason naming the field, its
steps and scores with it, and the batch's other rows land, whether landed directly or staged
first (the factory's way, across processes). A batch that cannot be staged at all goes whole to
quarantine with why, nothing lost."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pyarrow as pa
import pytest

import gymfoundry.warehouse.staged as staged_module
from gymfoundry.envs.records import RetryPolicy, Run, Step, ToolCall
from gymfoundry.tasks.stages.land import land_records, stage_records
from gymfoundry.warehouse import QuarantinedBatch


def batch(build, poison: dict):
    """Three tasks and their rollouts with scores; the second rollout's first step updated by `poison`."""
    tasks = [build.task("inventory", n) for n in range(3)]
    rollouts = [build.rollout(t, seed=n) for n, t in enumerate(tasks)]
    bad = rollouts[1]
    step = Step(**{**bad.steps[0].model_dump(), **poison})  # a valid record: pydantic takes any int, any str
    rollouts[1] = bad.model_copy(update={"steps": [step, *bad.steps[1:]]})
    return tasks, rollouts, [build.score(r, i) for r in rollouts for i in range(3)]


POISONS = {
    "token_ids": ({"token_ids": [1, 2**64]}, "OverflowError"),
    "thought": ({"thought": "half a pair \udc80"}, "UnicodeEncodeError"),
    "tool_call": ({"tool_call": ToolCall(name="lookup", arguments={"item": "\ud800"})}, "UnicodeEncodeError"),
}


def quarantined(folder: Path) -> tuple[dict, dict[str, list[dict]]]:
    rows = {p.stem: [json.loads(line) for line in p.read_text().splitlines()] for p in folder.glob("*.jsonl")}
    return json.loads((folder / "report.json").read_text()), rows


@pytest.mark.parametrize("field", sorted(POISONS))
def test_a_rollout_no_column_can_hold_is_quarantined_naming_the_field_and_the_rest_lands(wh, build, field):
    poison, error = POISONS[field]
    tasks, rollouts, scores = batch(build, poison)
    landing = wh.land(tasks=tasks, rollouts=rollouts, scores=scores, rollout_outcomes=True)
    assert landing.ok and landing.checked() == {"tasks": 3, "rollouts": 2, "steps": 6, "outcomes": 2,
                                                "step_scores": 6}
    refused = rollouts[1].rollout_id
    assert sorted(r["rollout_id"] for r in wh.sql("select rollout_id from rollouts").to_pylist()) == \
           sorted(r.rollout_id for r in rollouts if r.rollout_id != refused)
    report, rows = quarantined(landing.refused)
    [failure] = report["failures"]
    assert (failure["table"], failure["column"], failure["expectation"]) == ("steps", field, "storable")
    assert failure["meta"] == {"rollout_id": refused, "step_index": 0} and failure["error"].startswith(error)
    # nothing lost: the rollout, all its steps and its scores are kept whole
    assert [r["rollout_id"] for r in rows["rollouts"]] == [refused]
    assert [s["index"] for s in rows["steps"]] == [0, 1, 2] and len(rows["step_scores"]) == 3
    if field == "token_ids":
        assert rows["steps"][0]["token_ids"] == [1, 2**64]
    [held] = wh.sql("select path, tables, failures from quarantine").to_pylist()
    assert held["path"] == landing.refused.relative_to(wh.data_dir).as_posix()
    assert held["tables"] == ["rollouts", "step_scores", "steps"] and "steps" in held["failures"]
    assert wh.check().success


def test_a_batch_staged_elsewhere_carries_its_refused_rollout_to_the_writer(tmp_path, build):
    tasks, rollouts, scores = batch(build, POISONS["token_ids"][0])
    data_dir = str(tmp_path / "data")
    staged = pickle.loads(pickle.dumps(stage_records(data_dir, tasks, [], rollouts, scores, run_id="r1")))
    landing = land_records(data_dir, tasks, [], rollouts, scores, run_id="r1", staged=staged)
    assert landing.counts == {"tasks": 3, "task_rejections": 0, "rollouts": 2, "steps": 6, "outcomes": 2,
                              "step_scores": 6}
    report, rows = quarantined(landing.refused)
    assert [(f["table"], f["column"]) for f in report["failures"]] == [("steps", "token_ids")]
    assert rows["rollouts"][0]["run_id"] == "r1"
    # landing the same records again lands nothing new and quarantines the same rollout in the same place
    again = land_records(data_dir, tasks, [], rollouts, scores, run_id="r1")
    assert sum(again.counts.values()) == 0 and again.refused == landing.refused


def test_a_batch_that_cannot_be_staged_goes_whole_to_quarantine_with_why(wh, build):
    good = build.task("inventory", 0)
    bad = build.task("inventory", 1).model_copy(update={"goal": "reserve \udc80"})
    landing = wh.land(tasks=[good, bad])
    assert not landing.ok and wh.count("tasks") == 0
    with pytest.raises(QuarantinedBatch, match="batch"):
        landing.checked()
    report, rows = quarantined(landing.quarantine)
    [failure] = report["failures"]
    assert failure["expectation"] == "stageable" and "UnicodeEncodeError" in failure["error"]
    assert [t["task_id"] for t in rows["tasks"]] == [good.task_id, bad.task_id]  # nothing lost
    assert wh.land(tasks=[good]).checked() == {"tasks": 1}


def test_a_run_row_no_column_can_hold_goes_to_quarantine_not_a_crash(wh):
    run = Run(params={}, retry_policy=RetryPolicy(), attempted=2**64)
    landing = wh.land(runs=[run])
    assert not landing.ok and wh.count("runs") == 0
    report, rows = quarantined(landing.quarantine)
    assert "OverflowError" in report["failures"][0]["error"] and rows["runs"][0]["attempted"] == 2**64


def test_a_staging_failure_in_the_factory_s_stage_step_quarantines_the_batch_not_the_run(tmp_path, build,
                                                                                      monkeypatch):
    tasks, rollouts, scores = batch(build, {})
    data_dir = str(tmp_path / "data")

    def refuse(*args, **kwargs):
        raise pa.ArrowInvalid("a value Parquet refuses")

    monkeypatch.setattr(staged_module, "write_batches", refuse)
    staged = stage_records(data_dir, tasks, [], rollouts, scores)  # no exception: the run goes on
    monkeypatch.undo()
    landing = land_records(data_dir, tasks, [], rollouts, scores, staged=staged)
    assert not landing.ok
    report, rows = quarantined(landing.quarantine)
    assert report["failures"][0]["error"] == "ArrowInvalid: a value Parquet refuses"
    assert {name: len(r) for name, r in rows.items()} == {"tasks": 3, "rollouts": 3, "scores": 9}
    # the same records land once the cause is gone: nothing of them was lost
    assert land_records(data_dir, tasks, [], rollouts, scores).counts["rollouts"] == 3
