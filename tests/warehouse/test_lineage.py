"""Lineage in SQL: timestamps are TIMESTAMP columns (the records keep ISO strings), rollouts carry
the run and Prefect flow run that first landed them, older files without either still read, and
`reward_by_layer` has no row for a layer without an ok score."""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa
import pyarrow.parquet as pq

from gymfoundry.envs.records import DatasetManifest, RetryPolicy, Run, StepScore, Verdict
from gymfoundry.warehouse import TABLES, Warehouse, catalog
from gymfoundry.warehouse.lake import Batch, file_sha256, staging_path


def make_run(**fields) -> Run:
    return Run(**{"params": {"seed": 1}, "retry_policy": RetryPolicy(), **fields})


def test_timestamps_are_timestamp_columns_and_records_keep_iso_strings(wh):
    run = make_run(started_at="2026-05-01T12:00:00+00:00", finished_at="2026-05-01T14:30:05.25+02:00")
    dataset = DatasetManifest(dataset_id="d-1", kind="sft", rows=0, families=["inventory"], learnability="flat",
                              created_at="2026-05-02T08:00:00Z")
    wh.land(runs=[run], datasets=[dataset]).checked()
    timestamps = wh.sql("select table_name, column_name, data_type from duckdb_columns() "
                        "where column_name like '%\\_at' escape '\\' and schema_name = 'main' order by all")
    types = {(r["table_name"], r["column_name"]): r["data_type"] for r in timestamps.to_pylist()}
    assert types == {("datasets", "created_at"): "TIMESTAMP", ("family_audits", "audited_at"): "TIMESTAMP",
                     ("manifest", "landed_at"): "TIMESTAMP",
                     ("outcomes", "verified_at"): "TIMESTAMP", ("quarantine", "created_at"): "TIMESTAMP",
                     ("runs", "finished_at"): "TIMESTAMP", ("runs", "started_at"): "TIMESTAMP",
                     ("training_runs", "finished_at"): "TIMESTAMP", ("training_runs", "started_at"): "TIMESTAMP"}
    assert wh.sql("select started_at, finished_at, epoch(finished_at) - epoch(started_at) as took_s "
                  "from runs").to_pylist() == [
        {"started_at": datetime(2026, 5, 1, 12), "finished_at": datetime(2026, 5, 1, 12, 30, 5, 250000),
         "took_s": 1805.25}]  # both in UTC
    (loaded,) = wh.load("runs")
    assert loaded.started_at == "2026-05-01T12:00:00+00:00"
    assert loaded.finished_at == "2026-05-01T12:30:05.250000+00:00"  # the same instant, in UTC
    assert loaded.model_copy(update={"finished_at": run.finished_at}) == run
    assert wh.load("datasets")[0].created_at == "2026-05-02T08:00:00+00:00"
    empty = make_run(params={"seed": 9})  # a record without times: NULL, and "" again when read back
    wh.land(runs=[empty]).checked()
    assert wh.sql("select count(*) as n from runs where started_at is null").to_pylist() == [{"n": 1}]
    assert [r.started_at for r in wh.load("runs", "started_at is null")] == [""]


def test_rollouts_carry_the_run_that_first_landed_them(wh, build):
    task = build.task()
    first, second = build.rollout(task, seed=0), build.rollout(task, seed=1)
    wh.land(tasks=[task], rollouts=[first], run_id="run-1", flow_run_id="0b6e-flow").checked()
    assert wh.land(rollouts=[first, second], run_id="run-2").checked() == {"rollouts": 1, "steps": 3}
    wh.land(rollouts=[build.rollout(task, seed=2)]).checked()
    rows = wh.sql("select seed, run_id, flow_run_id from rollouts order by seed").to_pylist()
    assert rows == [{"seed": 0, "run_id": "run-1", "flow_run_id": "0b6e-flow"},
                    {"seed": 1, "run_id": "run-2", "flow_run_id": None},
                    {"seed": 2, "run_id": None, "flow_run_id": None}]
    assert wh.load_rollouts("seed = 0") == [first]  # lineage is the warehouse's, not part of the record


def write_old_file(data_dir, table, family, rows, drop, types=None):
    """A batch as an older version wrote it: without the columns in `drop`, `types` overriding others."""
    fields = [f for f in table.file_schema if f.name not in drop]
    schema = pa.schema([pa.field(f.name, (types or {}).get(f.name, f.type), f.nullable) for f in fields])
    folder = f"lake/{table.name}/task_family={family}" if table.partitioned else f"lake/{table.name}"
    path = f"{folder}/b-old-{table.name}.parquet"
    target = data_dir / staging_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k in schema.names} for r in rows],
                                        schema=schema), target)
    return Batch(f"b-old-{table.name}", table.name, family, path, len(rows), file_sha256(target))


def test_files_from_before_lineage_and_timestamps_still_read(data_dir, build):
    task = build.task()
    rollout = build.rollout(task)
    run = make_run(started_at="2026-05-01T12:00:00+00:00")
    with Warehouse(data_dir) as wh:
        wh.land_tasks([task])
        old_rollouts = write_old_file(data_dir, TABLES["rollouts"], "inventory", [TABLES["rollouts"].row(rollout)],
                                      drop={"run_id", "flow_run_id"})
        old_run_row = {**TABLES["runs"].row(run), "started_at": run.started_at, "finished_at": ""}
        old_runs = write_old_file(data_dir, TABLES["runs"], "", [old_run_row], drop=set(),
                                  types={"started_at": pa.string(), "finished_at": pa.string()})
        catalog.register(wh.con, wh.data_dir, [old_rollouts, old_runs], "2026-01-01 00:00:00")
    with Warehouse(data_dir) as wh:  # every file of rollouts lacks the lineage columns: they read NULL
        assert wh.sql("select rollout_id, run_id, flow_run_id from rollouts").to_pylist() == [
            {"rollout_id": rollout.rollout_id, "run_id": None, "flow_run_id": None}]
        (loaded,) = wh.load_rollouts()  # its steps were never landed here
        assert loaded.model_copy(update={"steps": rollout.steps}) == rollout
        assert wh.sql("select started_at, finished_at from runs").to_pylist() == [
            {"started_at": datetime(2026, 5, 1, 12), "finished_at": None}]
        assert wh.load("runs") == [run]
        newer = build.rollout(task, seed=3)
        wh.land(rollouts=[newer], run_id="run-new").checked()  # new files beside the old ones
        assert wh.sql("select seed, run_id from rollouts order by seed").to_pylist() == [
            {"seed": 0, "run_id": None}, {"seed": 3, "run_id": "run-new"}]
        wh.land(runs=[make_run(params={"seed": 2}, started_at="2026-06-01T00:00:00+00:00")]).checked()
        assert wh.sql("select started_at from runs order by 1").to_pylist() == [
            {"started_at": datetime(2026, 5, 1, 12)}, {"started_at": datetime(2026, 6, 1)}]


def test_reward_by_layer_has_no_row_for_a_layer_without_an_ok_score(wh, build):
    task = build.task()
    rollout = build.rollout(task)

    def judge(step: int, status: str, score: float | None) -> StepScore:
        return StepScore(rollout_id=rollout.rollout_id, step_index=step, layer="judge", scorer_id="judge",
                         scorer_version="1", status=status, score=score)

    rules = [build.score(rollout, i, score=s) for i, s in enumerate([0.2, 0.4, 0.6])]
    wh.land(tasks=[task], rollouts=[rollout], scores=rules + [judge(i, "not_configured", None) for i in range(3)])
    rows = wh.sql("select layer, steps, scored, mean from reward_by_layer").to_pylist()
    assert [(r["layer"], r["steps"], r["scored"]) for r in rows] == [("rules", 3, 3)]
    assert abs(rows[0]["mean"] - 0.4) < 1e-12
    assert wh.sql("select count(*) as n from step_scores where layer = 'judge'").to_pylist() == [{"n": 3}]

    judged = StepScore(**{**judge(0, "ok", 0.9).model_dump(), "scorer_version": "2"})
    wh.land_scores([judged, judge(1, "error", None).model_copy(update={"scorer_version": "2"})])
    rows = wh.sql("select layer, scorer_version, steps, scored, mean from reward_by_layer order by layer").to_pylist()
    assert [(r["layer"], r["scorer_version"], r["steps"], r["scored"], r["mean"]) for r in rows] == [
        ("judge", "2", 2, 1, 0.9), ("rules", "1", 3, 3, rows[1]["mean"])]


def test_the_factorys_own_verdict_time_reads_back_as_written(wh, build):
    task = build.task()
    rollout = build.rollout(task)
    wh.land(tasks=[task], rollouts=[rollout], rollout_outcomes=True).checked()
    (verdict,) = wh.load("outcomes")
    assert isinstance(verdict, Verdict) and verdict.verified_at.endswith("+00:00")
    (row,) = wh.sql("select verified_at from outcomes").to_pylist()
    assert datetime.fromisoformat(verdict.verified_at).replace(tzinfo=None) == row["verified_at"]
