from __future__ import annotations

import shutil

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest

from gymfoundry.envs.records import Termination
from gymfoundry.warehouse import TABLES, QuarantinedBatch, Warehouse
from gymfoundry.warehouse.lake import write_batch
from gymfoundry.warehouse.store import _row


def lake_files(data_dir):
    return sorted(p.relative_to(data_dir).as_posix() for p in (data_dir / "lake").rglob("*.parquet"))


def land_sample(wh, build):
    tasks = [build.task("inventory", 0), build.task("inventory", 1), build.task("coding", 2)]
    rollouts = [build.rollout(tasks[0], seed=0), build.rollout(tasks[1], seed=1, termination=Termination.failure),
                build.rollout(tasks[2], seed=2, termination=Termination.timeout)]
    scores = [build.score(r, i) for r in rollouts for i in range(3)]
    counts = {**wh.land_tasks(tasks), **wh.land_rollouts(rollouts), **wh.land_scores(scores),
              **wh.land_rejections([build.rejection(tasks[2])])}
    return tasks, rollouts, scores, counts


def test_landed_records_read_back_equal(wh, build):
    tasks, rollouts, scores, counts = land_sample(wh, build)
    assert counts == {"tasks": 3, "rollouts": 3, "steps": 9, "step_scores": 9, "task_rejections": 1}
    assert wh.load_tasks() == sorted(tasks, key=lambda t: t.task_id)
    assert wh.load_rollouts() == sorted(rollouts, key=lambda r: r.rollout_id)
    assert [s.index for s in wh.load_rollouts()[0].steps] == [0, 1, 2]
    assert wh.load_scores() == sorted(scores, key=lambda s: (s.rollout_id, s.step_index))
    assert wh.load_rejections() == [build.rejection(tasks[2])]
    assert wh.load_rollouts("task_family = ? and success", ["inventory"]) == [rollouts[0]]
    assert wh.load_tasks("task_family = 'coding'") == [tasks[2]]


def test_files_are_partitioned_by_family_without_the_family_column(wh, data_dir, build):
    land_sample(wh, build)
    files = lake_files(data_dir)
    assert [f.rsplit("/", 1)[0] for f in files] == [
        "lake/rollouts/task_family=coding", "lake/rollouts/task_family=inventory",
        "lake/step_scores/task_family=coding", "lake/step_scores/task_family=inventory",
        "lake/steps/task_family=coding", "lake/steps/task_family=inventory",
        "lake/task_rejections/task_family=coding",
        "lake/tasks/task_family=coding", "lake/tasks/task_family=inventory",
    ]
    steps_file = data_dir / next(f for f in files if f.startswith("lake/steps/task_family=inventory"))
    table = pq.read_table(steps_file, partitioning=None)
    assert table.num_rows == 6 and "task_family" not in table.column_names
    assert table.schema == TABLES["steps"].file_schema
    manifest = wh.sql("select table_name, task_family, row_count from manifest order by all").to_pylist()
    assert manifest[:2] == [{"table_name": "rollouts", "task_family": "coding", "row_count": 1},
                            {"table_name": "rollouts", "task_family": "inventory", "row_count": 2}]
    assert len(manifest) == 9


def test_landing_twice_adds_nothing(wh, data_dir, build):
    tasks, rollouts, scores, _ = land_sample(wh, build)
    files_before = lake_files(data_dir)
    assert wh.land_tasks(tasks) == {"tasks": 0}
    assert wh.land_rollouts(rollouts) == {"rollouts": 0, "steps": 0}
    assert wh.land_scores(scores) == {"step_scores": 0}
    assert wh.land_rejections([build.rejection(tasks[2])]) == {"task_rejections": 0}
    assert lake_files(data_dir) == files_before
    assert [wh.count(t) for t in TABLES] == [3, 3, 9, 9, 1] + [0] * (len(TABLES) - 5)
    assert wh.sql("select count(*) as n from manifest").to_pylist() == [{"n": 9}]


def test_only_new_keys_land_and_duplicates_within_a_call_collapse(wh, build):
    tasks = [build.task("inventory", n) for n in range(3)]
    assert wh.land_tasks(tasks[:2]) == {"tasks": 2}
    assert wh.land_tasks([tasks[2], tasks[2], tasks[0]]) == {"tasks": 1}
    assert wh.count("tasks") == 3
    assert len(wh.files("tasks")) == 2


def staged_files(data_dir):
    return sorted(p.relative_to(data_dir).as_posix() for p in (data_dir / "staging").rglob("*.parquet"))


def test_file_written_but_not_registered_stays_in_staging(wh, data_dir, build):
    task = build.task("inventory", 0)
    batch = write_batch(data_dir, TABLES["tasks"], "inventory", [_row(TABLES["tasks"], task)])
    assert staged_files(data_dir) == ["staging/" + batch.path.removeprefix("lake/")] and lake_files(data_dir) == []
    assert wh.count("tasks") == 0
    # Landing the same rows later (a re-run after a crash) reuses the file name, registers it and moves it.
    assert wh.land_tasks([task]) == {"tasks": 1}
    assert lake_files(data_dir) == [batch.path] and staged_files(data_dir) == []
    assert wh.load_tasks() == [task]


def test_empty_views_have_typed_columns(wh):
    described = {row["column_name"]: row["column_type"] for row in wh.sql("describe steps").to_pylist()}
    assert described == {
        "rollout_id": "VARCHAR", "task_family": "VARCHAR", "index": "BIGINT", "observation": "VARCHAR",
        "action_text": "VARCHAR", "thought": "VARCHAR", "tool_call": "VARCHAR", "result": "VARCHAR",
        "error": "VARCHAR", "reward": "DOUBLE", "latency_s": "DOUBLE", "token_ids": "BIGINT[]",
        "logprobs": "DOUBLE[]", "policy_version": "VARCHAR", "tool_name": "VARCHAR",
    }
    assert [wh.count(t) for t in TABLES] == [0] * len(TABLES)
    assert wh.load_rollouts() == []


def test_views_have_the_same_columns_empty_and_filled(data_dir, build):
    with Warehouse(data_dir) as wh:
        empty = {t: wh.sql(f"describe {t}").to_pylist() for t in TABLES}
        land_sample(wh, build)
        assert {t: wh.sql(f"describe {t}").to_pylist() for t in TABLES} == empty


def test_views_answer_plain_sql(wh, build):
    land_sample(wh, build)
    by_family = wh.sql("select task_family, termination, count(*) as n from rollouts group by all order by all")
    assert by_family.to_pylist() == [
        {"task_family": "coding", "termination": "timeout", "n": 1},
        {"task_family": "inventory", "termination": "failure", "n": 1},
        {"task_family": "inventory", "termination": "success", "n": 1},
    ]
    assert wh.sql("select tool_name, count(*) as n from steps group by all order by all").to_pylist() == [
        {"tool_name": "lookup", "n": 3}, {"tool_name": "reserve", "n": 3}, {"tool_name": None, "n": 3}]
    rollout = wh.sql("select success, verifier_id, verifier_version, tokens from rollouts "
                     "where termination = 'success'").to_pylist()
    assert rollout == [{"success": True, "verifier_id": "inventory", "verifier_version": "2", "tokens": 42}]
    assert wh.sql("select distinct difficulty_level from tasks").to_pylist() == [{"difficulty_level": 2}]
    df = wh.sql_df("select t.task_family, avg(s.score) as mean from step_scores s "
                   "join rollouts r using (rollout_id) join tasks t using (task_id) group by all order by 1")
    assert isinstance(df, pl.DataFrame) and df.to_dicts() == [
        {"task_family": "coding", "mean": 0.5}, {"task_family": "inventory", "mean": 0.5}]


def test_two_scorer_versions_live_side_by_side(wh, build):
    task = build.task()
    rollout = build.rollout(task)
    wh.land(tasks=[task], rollouts=[rollout]).checked()
    assert wh.land_scores([build.score(rollout, 0, "1", 0.5)]) == {"step_scores": 1}
    assert wh.land_scores([build.score(rollout, 0, "2", 0.75), build.score(rollout, 0, "1", 0.0)]) == \
        {"step_scores": 1}
    rows = wh.sql("select scorer_version, score, task_family from step_scores order by 1").to_pylist()
    assert rows == [{"scorer_version": "1", "score": 0.5, "task_family": "inventory"},
                    {"scorer_version": "2", "score": 0.75, "task_family": "inventory"}]
    assert [s.score for s in wh.load_scores("scorer_version = '2'")] == [0.75]


def test_scores_take_their_family_from_family_of_or_the_rollouts(wh, build):
    task = build.task("coding")
    rollout = build.rollout(task)
    with pytest.raises(ValueError, match="no task family known"):
        wh.land_scores([build.score(rollout, 0)])
    # A score of a step that has not landed is an orphan: the gates send it to quarantine.
    with pytest.raises(QuarantinedBatch, match="ref:steps"):
        wh.land_scores([build.score(rollout, 0)], family_of={rollout.rollout_id: "coding"})
    assert wh.land(tasks=[task], rollouts=[rollout], scores=[build.score(rollout, 0)]).checked() == \
        {"tasks": 1, "rollouts": 1, "steps": 3, "step_scores": 1}
    assert wh.land_scores([build.score(rollout, 1)]) == {"step_scores": 1}
    assert wh.sql("select distinct task_family from step_scores").to_pylist() == [{"task_family": "coding"}]


def test_moved_data_dir_stays_readable(data_dir, tmp_path, build):
    with Warehouse(data_dir) as wh:
        tasks, rollouts, _, _ = land_sample(wh, build)
    moved = tmp_path / "elsewhere" / "data"
    moved.parent.mkdir()
    shutil.move(data_dir, moved)
    with Warehouse(moved, read_only=True) as wh:
        assert wh.load_rollouts() == sorted(rollouts, key=lambda r: r.rollout_id)
        assert all(str(p).startswith(str(moved)) for p in wh.files("steps"))
    with Warehouse(moved) as wh:
        assert wh.load_tasks() == sorted(tasks, key=lambda t: t.task_id)
        assert wh.land_rollouts(rollouts) == {"rollouts": 0, "steps": 0}
    # The stored views name the lake relative to the data dir: a plain DuckDB client that searches there reads them.
    con = duckdb.connect(str(moved / "catalog.duckdb"), read_only=True)
    con.execute("set file_search_path = ?", [str(moved)])
    assert con.execute("select count(*) from steps").fetchall() == [(9,)]
    con.close()


def test_read_only_warehouse(data_dir, build):
    with pytest.raises(FileNotFoundError):
        Warehouse(data_dir, read_only=True)
    with Warehouse(data_dir) as wh:
        wh.land_tasks([build.task()])
    with Warehouse(data_dir, read_only=True) as wh:
        assert wh.count("tasks") == 1 and wh.count("steps") == 0
        with pytest.raises(PermissionError):
            wh.land_tasks([build.task(n=5)])


def test_family_names_must_be_plain_names(build):
    for bad in ("2024", "../escape", "Inventory"):
        with pytest.raises(ValueError, match="family"):
            build.task(bad)


def test_extreme_values_round_trip(wh, build):
    task = build.task()
    wh.land_tasks([task])
    rollout = build.rollout(task)
    rollout.steps[0].latency_s = 1e308
    rollout.steps[0].observation = "quote ' and unicode ✓ and \x00 nul"
    rollout.steps[0].tool_call.arguments = {"nested": [1, 2.5, None, {"k": "v"}], "big": 2**62}
    wh.land_rollouts([rollout])
    assert wh.load_rollouts() == [rollout]


def test_a_rerun_of_a_landed_rollout_adds_no_steps(wh, build):
    task = build.task()
    rollout = build.rollout(task)
    assert wh.land(tasks=[task], rollouts=[rollout]).checked() == {"tasks": 1, "rollouts": 1, "steps": 3}
    rerun = rollout.model_copy(deep=True)
    rerun.steps.append(rerun.steps[-1].model_copy(update={"index": 3}))
    assert rerun.rollout_id == rollout.rollout_id
    assert wh.land_rollouts([rerun]) == {"rollouts": 0, "steps": 0}
    assert wh.load_rollouts() == [rollout]


def test_sql_statements_without_results(wh):
    assert wh.sql("create temp view scratch as select 1 as a").num_rows == 0
    assert wh.sql("select a from scratch").to_pylist() == [{"a": 1}]
