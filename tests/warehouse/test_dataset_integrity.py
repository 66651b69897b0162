"""Dataset files are part of the warehouse's integrity: each one's checksum is recorded when it is
written; `warehouse check` finds a flipped bit (naming the dataset and its file), assembling again
rewrites the file, the trainer and `load_dataset` refuse it naming it, and `warehouse repair`
rebuilds it from the warehouse (or quarantines it, saying why, when it cannot)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from gymfoundry.flows.cli import main
from gymfoundry.tasks.stages.assemble import assemble_datasets, load_dataset, rebuild_dataset
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.stages.isolate import isolate_tasks
from gymfoundry.tasks.stages.land import land_batch
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.episodes import collect_rollouts
from gymfoundry.tasks.stages.score import score_rollouts
from gymfoundry.tasks.training.train import train
from tests.audits import audited
from gymfoundry.warehouse import DamagedWarehouse, Warehouse, catalog
from gymfoundry.warehouse.lake import file_sha256
from gymfoundry.warehouse.store import DamagedDataset


@pytest.fixture
def built(tmp_path):
    data_dir = tmp_path / "data"
    tasks, _ = isolate_tasks(generate_tasks("inventory", 12, seed=5), holdout_fraction=0.1)
    policy = make_policy("scripted", "inventory", mistake_rate=0.35)
    rollouts = collect_rollouts(tasks, policy, 3, seed=5)
    land_batch(str(data_dir), tasks, [], rollouts, score_rollouts(rollouts, tasks))
    audited(data_dir, ["inventory"])
    return data_dir, assemble_datasets(data_dir, ["inventory"])


def flip_a_tool_description_bit(path: Path) -> None:
    """Flip one bit (a letter's case) in the tool descriptions the file's rows share, as a disk or a
    copy might: the file still loads, and every row reads another tool description."""
    original = path.read_bytes()
    before = [row["tools"] for row in pq.read_table(path).to_pylist()]
    group = pq.read_metadata(path).row_group(0)
    [chunk] = [group.column(i) for i in range(group.num_columns) if group.column(i).path_in_schema == "tools"]
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    os.chmod(path, 0o644)
    for offset in range(start, start + chunk.total_compressed_size):
        if not chr(original[offset]).isalpha():
            continue
        flipped = bytearray(original)
        flipped[offset] ^= 0x20
        path.write_bytes(bytes(flipped))
        try:
            after = [row["tools"] for row in pq.read_table(path).to_pylist()]
        except (OSError, ValueError):
            continue
        if all(a != b for a, b in zip(after, before)):
            return
    raise AssertionError(f"no bit of {path} changes every row's tools")


def check(data_dir: Path, capsys) -> tuple[int, dict, str]:
    out = data_dir.parent / "check.json"
    code = main(["warehouse", "check", "--data-dir", str(data_dir), "--report", str(out)])
    return code, json.loads(out.read_text()), capsys.readouterr().out


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_a_flipped_bit_is_found_refused_rewritten_and_rebuilt(built, kind, tmp_path, capsys):
    data_dir, result = built
    path = Path(result[kind]["path"])
    relative = path.relative_to(data_dir).as_posix()
    dataset_id = result[kind]["dataset_id"]
    rows, digest = pq.read_table(path).to_pylist(), file_sha256(path)
    with Warehouse(data_dir, read_only=True) as wh:
        [recorded] = [f for f in catalog.dataset_files(wh.con) if f.dataset_id == dataset_id]
    assert (recorded.path, recorded.sha256, recorded.row_count) == (relative, digest, len(rows))
    assert check(data_dir, capsys)[0] == 0

    flip_a_tool_description_bit(path)
    code, report, printed = check(data_dir, capsys)
    assert code == 1 and not report["tables"]["files"]["success"]
    assert [(f["path"], f["kind"], f["dataset_id"]) for f in report["files"]] == [(relative, "changed", dataset_id)]
    assert f"{relative}: dataset {dataset_id}: sha256 is {file_sha256(path)}, recorded {digest}" in printed

    # The trainer refuses it before anything is built: no base model exists at that path.
    with pytest.raises(DamagedDataset, match=f"dataset file {path} is damaged \\(changed: dataset {dataset_id}"):
        train(str(path), kind, str(tmp_path / "no-such-model"), str(tmp_path / "out"), {"max_steps": 1})
    with pytest.raises(DamagedDataset, match=str(path)):
        load_dataset(path)

    assemble_datasets(data_dir, ["inventory"])  # the same dataset id: the damaged file is not kept
    assert file_sha256(path) == digest and pq.read_table(path).to_pylist() == rows
    assert check(data_dir, capsys)[0] == 0

    flip_a_tool_description_bit(path)
    with Warehouse(data_dir) as wh:
        repair = wh.repair(rebuild=rebuild_dataset)
    assert repair.rebuilt == [dataset_id] and repair.moved == {}
    assert file_sha256(path) == digest and pq.read_table(path).to_pylist() == rows
    assert check(data_dir, capsys)[0] == 0
    assert len(load_dataset(path)) == len(rows)


def test_a_dataset_that_cannot_be_rebuilt_is_quarantined_and_assembled_anew(built, tmp_path, capsys):
    data_dir, result = built
    path = Path(result["sft"]["path"])
    relative, dataset_id = path.relative_to(data_dir).as_posix(), result["sft"]["dataset_id"]
    rows = pq.read_table(path).to_pylist()
    path.unlink()
    with Warehouse(data_dir) as wh:  # no rebuilder: the dataset is quarantined, saying why
        repair = wh.repair()
    [(folder, moved)] = repair.moved.items()
    assert moved == [relative] and repair.rebuilt == []
    assert [f["error"] for f in repair.failures[folder.name]] == [
        f"{relative}: dataset {dataset_id}: the file is missing; not rebuilt: no rebuilder was given "
        "(`gymfoundry.tasks.stages.assemble.rebuild_dataset` rebuilds datasets)"]
    code, report, _ = check(data_dir, capsys)
    assert code == 0 and [(f["path"], f["kind"]) for f in report["files"]] == [(relative, "quarantined")]
    with pytest.raises(DamagedDataset, match=f"dataset file {path} is damaged \\(quarantined"):
        train(str(path), "sft", str(tmp_path / "no-such-model"), str(tmp_path / "out"))
    with Warehouse(data_dir, read_only=True) as wh:
        [quarantine] = wh.sql("select tables, row_count from quarantine").to_pylist()
    assert quarantine == {"tables": ["dataset_files"], "row_count": len(rows)}

    assemble_datasets(data_dir, ["inventory"])
    assert pq.read_table(path).to_pylist() == rows
    assert check(data_dir, capsys)[0] == 0


def test_a_rebuild_that_does_not_match_its_checksum_quarantines_the_file(built):
    data_dir, result = built
    path = Path(result["dpo"]["path"])
    flip_a_tool_description_bit(path)
    with Warehouse(data_dir) as wh:  # the recorded checksum is not what the rows make any more
        wh.con.execute("UPDATE dataset_files SET sha256 = 'f00' WHERE dataset_id = ?", [result["dpo"]["dataset_id"]])
        repair = wh.repair(rebuild=rebuild_dataset)
    [(folder, moved)] = repair.moved.items()
    assert moved == [path.relative_to(data_dir).as_posix()] and not path.exists()
    assert (folder / moved[0]).is_file()  # kept, for a look
    [failure] = repair.failures[folder.name]
    assert failure["expectation"] == "dataset_changed" and "not rebuilt: the rebuilt file's sha256 is" in failure["error"]


def test_a_file_in_the_datasets_folder_that_no_dataset_names_is_refused(built, tmp_path):
    data_dir, result = built
    stray = data_dir / "datasets" / "sft-copied.parquet"
    stray.write_bytes(Path(result["sft"]["path"]).read_bytes())
    with pytest.raises(DamagedDataset, match=f"dataset file {stray} is named by no dataset"):
        train(str(stray), "sft", str(tmp_path / "no-such-model"), str(tmp_path / "out"))
    elsewhere = tmp_path / "mine.parquet"  # a user's own file, outside any warehouse: nothing to check against
    elsewhere.write_bytes(stray.read_bytes())
    assert len(load_dataset(elsewhere)) == result["sft"]["rows"]


def test_datasets_from_before_checksums_are_reported_then_recorded_by_repair(built, capsys, caplog):
    data_dir, result = built
    con = duckdb.connect(str(data_dir / "catalog.duckdb"))
    con.execute("DROP TABLE dataset_files")
    con.close()
    code, report, _ = check(data_dir, capsys)
    assert code == 0 and sorted(f["kind"] for f in report["files"]) == ["unknown_checksum"] * 3
    with caplog.at_level(logging.WARNING, logger="gymfoundry.warehouse"):
        assert len(load_dataset(result["sft"]["path"])) == result["sft"]["rows"]
    assert "assembled before dataset checksums were kept" in caplog.text
    assert main(["warehouse", "repair", "--data-dir", str(data_dir)]) == 0
    code, report, _ = check(data_dir, capsys)
    assert code == 0 and report["files"] == []
    flip_a_tool_description_bit(Path(result["sft"]["path"]))
    assert check(data_dir, capsys)[0] == 1


def test_a_lake_path_that_is_not_registered_is_no_damage(built):
    data_dir, _ = built
    nosuch = data_dir / "lake" / "rollouts" / "task_family=inventory" / "b-nosuch.parquet"
    with Warehouse(data_dir, read_only=True) as wh:
        with pytest.raises(duckdb.IOException, match="b-nosuch.parquet") as raised:
            wh.sql(f"select count(*) from read_parquet('{nosuch}')")
    assert not isinstance(raised.value, DamagedWarehouse)


def test_cli_repair_rebuilds_a_flipped_dataset(built, capsys):
    data_dir, result = built
    path = Path(result["sft"]["path"])
    rows, digest = pq.read_table(path).to_pylist(), file_sha256(path)
    flip_a_tool_description_bit(path)
    assert main(["warehouse", "repair", "--data-dir", str(data_dir)]) == 0
    assert f"REBUILT dataset {result['sft']['dataset_id']} from the warehouse" in capsys.readouterr().out
    assert file_sha256(path) == digest and pq.read_table(path).to_pylist() == rows


def test_check_fails_fast_when_its_report_cannot_be_written(built, tmp_path, capsys, monkeypatch):
    data_dir, _ = built
    checked = []
    monkeypatch.setattr(Warehouse, "check", lambda self: checked.append(1))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main(["warehouse", "check", "--data-dir", str(data_dir), "--report", str(blocker / "check.json")])
    err = capsys.readouterr().err
    assert code == 2 and checked == [] and err.count("\n") == 1
    assert f"--report {blocker / 'check.json'}: cannot write the report there (not a directory)" in err


def test_cli_train_refuses_a_flipped_dataset_before_prefect_starts(built, capsys, monkeypatch):
    data_dir, result = built
    path = Path(result["sft"]["path"])
    flip_a_tool_description_bit(path)
    monkeypatch.setattr("gymfoundry.flows.cli.training.prefect_defaults", lambda **_: pytest.fail("Prefect was started"))
    code = main(["train", "--method", "sft", "--dataset", result["sft"]["dataset_id"], "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert f"dataset file {path.resolve()} is damaged (changed:" in err


def test_the_train_flow_refuses_a_flipped_dataset_before_reading_it(built, prefect_harness):
    """The flow the `train-on-new-dataset` deployment runs reads the file's row count, task ids and
    families before training: a damaged file is refused there, never skipped as too small."""
    from gymfoundry.flows.training import train as train_flow

    data_dir, result = built
    path = Path(result["sft"]["path"])
    flip_a_tool_description_bit(path)
    with pytest.raises(DamagedDataset, match=f"dataset file {path.resolve()} is damaged \\(changed:"):
        train_flow(dataset=result["sft"]["dataset_id"], method="sft", data_dir=str(data_dir), min_rows=10**6)
    path.write_bytes(path.read_bytes()[:100])  # a half-written copy: no Parquet footer to read
    with pytest.raises(DamagedDataset, match=f"dataset file {path.resolve()} is damaged"):
        train_flow(dataset=result["sft"]["dataset_id"], method="sft", data_dir=str(data_dir), min_rows=1)


def test_a_dataset_never_lands_without_its_checksum(tmp_path, monkeypatch):
    """A crash between writing the checksums and landing the datasets leaves no dataset the trainer
    would load on trust (`unknown_checksum`): the checksums are kept first."""
    data_dir = tmp_path / "data"
    tasks, _ = isolate_tasks(generate_tasks("inventory", 12, seed=5), holdout_fraction=0.1)
    rollouts = collect_rollouts(tasks, make_policy("scripted", "inventory", mistake_rate=0.35), 3, seed=5)
    land_batch(str(data_dir), tasks, [], rollouts, score_rollouts(rollouts, tasks))
    audited(data_dir, ["inventory"])

    def crash(*_):
        raise RuntimeError("killed")

    monkeypatch.setattr(catalog, "record_dataset_file", crash)
    with pytest.raises(RuntimeError, match="killed"):
        assemble_datasets(data_dir, ["inventory"])
    with Warehouse(data_dir, read_only=True) as wh:
        assert wh.sql("SELECT count(*) AS n FROM datasets").to_pylist() == [{"n": 0}]
        assert [p for p in wh.check().files if p["kind"] == "unknown_checksum"] == []
