"""Landing builds each table's rows a column at a time into Arrow (`Table.arrow`); those rows are
exactly the rows `Table.row` makes of each record, and records that bypassed validation
(`model_construct`, `model_copy`) still meet the gates."""

from __future__ import annotations

import json

from gymfoundry.envs.records import Step, Verdict
from gymfoundry.warehouse import TABLES
from gymfoundry.warehouse.lake import STAGING_DIR


def same_rows(table, records, **added):
    """`Table.arrow`'s rows against `Table.row`'s, JSON columns compared as the values they hold."""
    json_columns = {c.name for c in table.columns if c.is_json}
    arrow = table.arrow(records, **added).to_pylist()
    per_row = [table.row(r, **{k: v[i] if isinstance(v, list) else v for k, v in added.items()})
               for i, r in enumerate(records)]
    assert [list(row) for row in arrow] == [[c.name for c in table.columns]] * len(records)
    for got, want in zip(arrow, per_row):
        assert {k: json.loads(v) if k in json_columns and v is not None else v for k, v in got.items()} == \
               {k: json.loads(v) if k in json_columns and v is not None else v for k, v in want.items()}


def test_arrow_rows_are_the_records_rows(build):
    tasks = [build.task("inventory", n) for n in range(3)]
    rollouts = [build.rollout(t, seed=n) for n, t in enumerate(tasks)]
    same_rows(TABLES["tasks"], tasks)
    same_rows(TABLES["rollouts"], rollouts, run_id="run-1", flow_run_id=None)
    steps = [(r, s) for r in rollouts for s in r.steps]
    same_rows(TABLES["steps"], [s for _, s in steps], rollout_id=[r.rollout_id for r, _ in steps],
              task_family="inventory")
    same_rows(TABLES["step_scores"], [build.score(rollouts[0], i) for i in range(3)], task_family="inventory")
    same_rows(TABLES["outcomes"], [Verdict.of_rollout(r, "2026-05-01T12:00:00+00:00") for r in rollouts])


def test_arrow_columns_hold_enum_values_timestamps_and_nulls(build):
    task = build.task("inventory", 1)
    rollout = build.rollout(task)
    row = TABLES["rollouts"].arrow([rollout]).to_pylist()[0]
    assert row["termination"] == "success" and row["task_family"] == "inventory"
    assert row["run_id"] is None and row["policy_params"] is None
    assert json.loads(row["cost"]) == {"steps": 3, "tool_calls": 2, "tokens": 42, "wall_time_s": 1.5}
    steps = TABLES["steps"].arrow(rollout.steps, rollout_id=rollout.rollout_id, task_family="inventory")
    assert steps["token_ids"].to_pylist() == [[1, 2, 3], None, None]
    assert steps["tool_call"].to_pylist()[1] is None
    verdict = TABLES["outcomes"].arrow([Verdict.of_rollout(rollout, "2026-05-01T12:00:00+02:00")])
    assert str(verdict["verified_at"][0]) == "2026-05-01 10:00:00"  # UTC, without a zone


def test_a_step_built_without_validation_still_meets_the_gates(wh, data_dir, build):
    task = build.task("inventory", 2)
    rollout = build.rollout(task)
    out_of_range = Step.model_construct(index=3, observation="o", result="r", reward=5.0)
    bad = rollout.model_copy(update={"steps": [*rollout.steps, out_of_range]})
    landing = wh.land(tasks=[task], rollouts=[bad])
    assert not landing.ok
    assert [(f["table"], f["column"], f["examples"]) for f in landing.report.failures] == \
           [("steps", "reward", [5.0])]
    assert [wh.count(t) for t in ("tasks", "rollouts", "steps")] == [0, 0, 0]
    # The files written while the gates ran are gone with the batch: nothing staged, nothing in the lake.
    assert not [p for p in (data_dir / STAGING_DIR).rglob("*") if p.is_file()]
    assert not (data_dir / "lake").exists() or not [p for p in (data_dir / "lake").rglob("*") if p.is_file()]


def test_a_record_holding_a_value_of_another_type_goes_to_quarantine_not_a_crash(wh, build):
    task = build.task("inventory", 3)
    rollout = build.rollout(task)
    wrong = Step.model_construct(index="first", observation="o", result="r")  # no int: no Arrow column takes it
    landing = wh.land(tasks=[task], rollouts=[rollout.model_copy(update={"steps": [wrong]})])
    assert not landing.ok and landing.quarantine.is_dir()
    assert ("steps", "index") in {(f["table"], f["column"]) for f in landing.report.failures}
    assert wh.count("steps") == 0
    assert wh.land(tasks=[task], rollouts=[rollout]).checked() == {"tasks": 1, "rollouts": 1, "steps": 3}


def test_a_landing_pauses_the_garbage_collector_and_restores_it(wh, build, monkeypatch):
    import gc

    from gymfoundry.warehouse import catalog, quality

    seen = []
    real_gates, real_register = quality.validate_batch, catalog.register
    monkeypatch.setattr(quality, "validate_batch", lambda *a: seen.append(gc.isenabled()) or real_gates(*a))
    monkeypatch.setattr(catalog, "register", lambda *a, **k: seen.append(gc.isenabled()) or real_register(*a, **k))
    assert gc.isenabled()
    wh.land(tasks=[build.task("inventory", 8)])
    assert seen == [False, False] and gc.isenabled()  # staging (the gates) and registering
    gc.disable()  # a caller that runs without the collector keeps it off
    try:
        wh.land(tasks=[build.task("inventory", 9)])
        assert seen == [False] * 4 and not gc.isenabled()
    finally:
        gc.enable()


def test_a_tampered_copy_first_in_a_batch_is_reported_on_its_own_row(wh, build):
    landed, new = build.task("inventory", 10), build.task("inventory", 11)
    wh.land_tasks([landed])
    tampered = landed.model_copy(update={"goal": "something else"})
    landing = wh.land(tasks=[tampered, new])
    assert not landing.ok
    (failure,) = landing.report.failures
    assert failure["column"] == "id:task_id" and failure["unexpected_count"] == 1
    assert failure["examples"] == [f"{landed.task_id}: its content hashes to {tampered.compute_id()}"]
    (result,) = [r for r in landing.report.tables["tasks"].result["results"] if not r["success"]]
    assert result["result"]["partial_unexpected_index_list"] == [0]  # the verdict sits on the tampered row
    assert wh.load_tasks() == [landed]


def test_steps_take_their_rollouts_id_and_family_as_rows_where_a_rollout_holds_no_text_there(data_dir, build):
    """The steps' rollout_id and task_family columns are each rollout's value repeated by Arrow; a
    rollout whose id is no text (`model_copy` does not validate) makes them rows instead, as before."""
    from gymfoundry.warehouse.staged import stage

    task = build.task("inventory", 4)
    good, odd = build.rollout(task, seed=1), build.rollout(task, seed=2).model_copy(update={"rollout_id": 7})
    staged = stage(data_dir, tasks=[task], rollouts=[good], gate=False)
    assert staged.parts["steps"].column("rollout_id").to_pylist() == [good.rollout_id] * len(good.steps)
    assert staged.parts["steps"].column("task_family").to_pylist() == ["inventory"] * len(good.steps)
    staged = stage(data_dir, tasks=[task], rollouts=[good, odd], gate=False)
    assert not staged.passed and isinstance(staged.parts["steps"], list)
    assert [row["rollout_id"] for row in staged.parts["steps"]] == [good.rollout_id] * len(good.steps) + \
           [7] * len(odd.steps)
    staged.discard()


def test_enum_members_reach_arrow_as_their_values_whether_or_not_they_are_text():
    """A `str` Enum's member goes to Arrow as it is (its text is its value); any other Enum's member
    is converted to its value first. Both give the value `to_row` gives."""
    from enum import Enum

    from pydantic import BaseModel

    from gymfoundry.warehouse.schema import to_arrays, to_row

    class Colour(str, Enum):
        red = "r"

    class Shape(Enum):
        round = "o"

    class Thing(BaseModel):
        colour: Colour
        shape: Shape
        maybe: Colour | None = None

    class Level(str, Enum):  # a member's text is its label, its value a code
        def __new__(cls, code: str, label: str):
            member = str.__new__(cls, label)
            member._value_ = code
            return member

        low = ("l", "Low")

    class Ranked(BaseModel):
        level: Level
        colour: Colour

    def same(model, records, want):
        arrays = to_arrays(model, records)
        assert {k: v.to_pylist() for k, v in arrays.items()} == want
        assert [to_row(r, ) for r in records] == [dict(zip(arrays, values)) for values in zip(*(
            a.to_pylist() for a in arrays.values()))]

    same(Thing, [Thing(colour="r", shape="o"), Thing(colour="r", shape="o", maybe="r")],
         {"colour": ["r", "r"], "shape": ["o", "o"], "maybe": [None, "r"]})
    same(Ranked, [Ranked(level="l", colour="r")], {"level": ["l"], "colour": ["r"]})
    # model_copy does not validate: another Enum's member where a Colour belongs is still its value
    copied = Ranked(level="l", colour="r").model_copy(update={"colour": Level.low})
    assert to_arrays(Ranked, [copied])["colour"].to_pylist() == ["l"]


def test_the_first_row_of_each_key_whether_or_not_a_key_repeats(build):
    """Keys that never repeat keep every row; otherwise the first of each, nulls and NaN alike equal."""
    import pyarrow as pa

    from gymfoundry.warehouse.staged import first_of_each_key

    table = TABLES["step_scores"]
    scores = [build.score(build.rollout(build.task("inventory", 1)), i) for i in range(3)]
    part = table.arrow(scores, task_family="inventory")
    assert first_of_each_key(table, part) == [0, 1, 2]
    assert first_of_each_key(table, pa.concat_tables([part, part.slice(1, 1), part])) == [0, 1, 2]
    keys = pa.table({"rollout_id": ["a", None, None, "a"], "index": [1.0, float("nan"), float("nan"), 2.0]})
    assert first_of_each_key(TABLES["steps"], keys) == [0, 1, 3]
