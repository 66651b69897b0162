"""Storage damage: a missing, bit-flipped or overwritten lake file is found by `warehouse check`
(with its kind), confined to the queries that touch its table, quarantined by `warehouse repair`
with its whole landing, and the lost rows land again when the same records are landed again."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from gymfoundry.flows.cli import main
from gymfoundry.warehouse import TABLES, DamagedWarehouse, Warehouse, catalog

FAMILIES = ("inventory", "coding")


def records(build, family: str, n: int):
    task = build.task(family, n)
    rollout = build.rollout(task, seed=n)
    return task, rollout, [build.score(rollout, i) for i in range(3)]


def land_all(data_dir: Path, build) -> dict[str, int]:
    """Two landings (one per family) of tasks, a rejection, rollouts, steps and scores."""
    with Warehouse(data_dir) as wh:
        for i, family in enumerate(FAMILIES):
            task, rollout, scores = records(build, family, i)
            other = build.task(family, 10 + i)
            wh.land(tasks=[task, other], rejections=[build.rejection(other)], rollouts=[rollout],
                    scores=scores).checked()
        return counts(wh)


def counts(wh: Warehouse) -> dict[str, int]:
    return {name: wh.count(name) for name in TABLES}


def lake_file(data_dir: Path, table: str, family: str = "inventory") -> Path:
    [file] = (data_dir / "lake" / table / f"task_family={family}").glob("*.parquet")
    return file


def digests(data_dir: Path) -> dict[str, str]:
    return {p.relative_to(data_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((data_dir / "lake").rglob("*.parquet"))}


def check_json(data_dir: Path, capsys) -> tuple[int, dict, str]:
    out = data_dir / "check.json"
    code = main(["warehouse", "check", "--data-dir", str(data_dir), "--report", str(out)])
    return code, json.loads(out.read_text()), capsys.readouterr().out


def damage_kinds(report: dict) -> list[tuple[str, str]]:
    return [(f["path"], f["kind"]) for f in report["files"]]


def test_manifest_keeps_checksum_and_row_count_and_files_are_read_only(data_dir, build):
    land_all(data_dir, build)
    with Warehouse(data_dir, read_only=True) as wh:
        rows = wh.sql("select path, row_count, sha256, landing_id from manifest").to_pylist()
    assert len(rows) == 2 * 5  # per family: tasks, task_rejections, rollouts, steps, step_scores
    for row in rows:
        file = data_dir / row["path"]
        assert row["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
        assert row["row_count"] == pq.read_metadata(file).num_rows
        assert stat.S_IMODE(file.stat().st_mode) == 0o444
    # The files of one landing share its id; the two landings have two.
    assert len({r["landing_id"] for r in rows}) == 2


def test_a_deleted_file_is_confined_reported_repaired_and_relanded(data_dir, build, capsys):
    before = land_all(data_dir, build)
    victim = lake_file(data_dir, "steps")
    relative = victim.relative_to(data_dir).as_posix()
    victim.unlink()

    with Warehouse(data_dir, read_only=True) as wh:  # opening works; other tables answer
        assert wh.count("tasks") == before["tasks"] and wh.count("rollouts") == before["rollouts"]
        with pytest.raises(DamagedWarehouse, match=f"{relative}.*warehouse repair"):
            wh.sql("select count(*) from steps")
        with pytest.raises(DamagedWarehouse, match="warehouse repair"):  # in a join, and in a subquery
            wh.sql("select count(*) from rollouts r join steps s using (rollout_id)")
        with pytest.raises(DamagedWarehouse, match="warehouse repair"):
            wh.load_rollouts("rollout_id in (select rollout_id from steps)")
        assert wh.sql("select count(*) as n from success_by_cell").to_pylist() == [{"n": 2}]
    assert main(["sql", "--data-dir", str(data_dir), "select count(*) as n from tasks"]) == 0
    assert main(["sql", "--data-dir", str(data_dir), "select * from steps"]) == 1
    err = capsys.readouterr().err
    assert "DamagedWarehouse" in err and relative in err and "gymfoundry warehouse repair" in err
    assert "IO Error" not in err
    # A plain DuckDB client gets the same message from the stored views, once a writer rebuilt them.
    Warehouse(data_dir).close()
    con = duckdb.connect(str(data_dir / "catalog.duckdb"), read_only=True)
    with pytest.raises(duckdb.Error, match="warehouse repair"):
        con.execute("select * from steps").fetchall()
    con.close()

    code, report, printed = check_json(data_dir, capsys)
    assert code == 1 and report["success"] is False
    assert damage_kinds(report) == [(relative, "missing")]
    assert "MISSING" in printed and relative in printed
    # The intact rest was still validated: the coding steps, every other table.
    assert report["tables"]["steps"]["rows"] == 3 and report["tables"]["tasks"]["rows"] == 4

    repair_and_reland(data_dir, build, capsys, before, relative, "file_missing")


def repair_and_reland(data_dir: Path, build, capsys, before: dict, relative: str, expectation: str) -> None:
    assert main(["warehouse", "repair", "--data-dir", str(data_dir)]) == 0
    assert "QUARANTINED 5 files" in capsys.readouterr().out
    with Warehouse(data_dir, read_only=True) as wh:
        [q] = wh.sql("select * from quarantine").to_pylist()
        failures = json.loads(q["failures"])
        assert [(f["expectation"], f["examples"]) for f in failures] == [(expectation, [relative])]
        assert sorted(q["tables"]) == ["rollouts", "step_scores", "steps", "task_rejections", "tasks"]
        # The inventory landing is gone whole; coding is whole and queryable.
        after = counts(wh)
        assert wh.sql("select distinct task_family from steps").to_pylist() == [{"task_family": "coding"}]
        assert after == {**before, "tasks": 2, "task_rejections": 1, "rollouts": 1, "steps": 3, "step_scores": 3}
    folder = data_dir / q["path"]
    moved = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.parquet"))
    assert len(moved) == 5 - (expectation == "file_missing") and (folder / "report.json").exists()
    code, report, _ = check_json(data_dir, capsys)
    assert code == 0 and report["files"] == []

    land_all(data_dir, build)  # the same records again: the lost rows land, under the same names
    with Warehouse(data_dir, read_only=True) as wh:
        assert counts(wh) == before
    assert (data_dir / relative).exists()
    assert check_json(data_dir, capsys)[0] == 0


def test_a_flipped_bit_is_reported_as_changed_then_repaired(data_dir, build, capsys):
    before = land_all(data_dir, build)
    victim = lake_file(data_dir, "steps")
    relative = victim.relative_to(data_dir).as_posix()
    os.chmod(victim, 0o644)  # an attacker or a bad disk does not ask
    data = bytearray(victim.read_bytes())
    data[len(data) // 3] ^= 0x10
    victim.write_bytes(bytes(data))

    code, report, printed = check_json(data_dir, capsys)
    assert code == 1
    assert damage_kinds(report) == [(relative, "changed")]
    assert "sha256 is" in report["files"][0]["reason"] and "CHANGED" in printed
    repair_and_reland(data_dir, build, capsys, before, relative, "file_changed")


@pytest.mark.parametrize("where", [0.05, 0.5, 0.8, 0.97, -9])
def test_any_single_bit_flip_is_found_and_never_breaks_other_tables(data_dir, build, capsys, where):
    land_all(data_dir, build)
    victim = lake_file(data_dir, "steps")
    os.chmod(victim, 0o644)
    data = bytearray(victim.read_bytes())
    data[int(len(data) * where) if where > 0 else where] ^= 0x01
    victim.write_bytes(bytes(data))
    code, report, _ = check_json(data_dir, capsys)
    assert code == 1 and damage_kinds(report) == [(victim.relative_to(data_dir).as_posix(), "changed")]
    with Warehouse(data_dir, read_only=True) as wh:
        assert wh.count("rollouts") == 2 and wh.count("step_scores") == 6


def test_a_file_overwritten_behind_the_console_is_reported_and_repaired(data_dir, build, capsys):
    before = land_all(data_dir, build)
    victim = lake_file(data_dir, "rollouts")
    relative = victim.relative_to(data_dir).as_posix()
    os.chmod(victim, 0o644)
    con = duckdb.connect()  # what `COPY ... TO` did through the console before it refused writes
    con.execute(f"COPY (SELECT * FROM read_parquet('{victim}') UNION ALL SELECT * FROM read_parquet('{victim}')) "
                f"TO '{victim}' (FORMAT parquet)")
    con.close()
    code, report, _ = check_json(data_dir, capsys)
    assert code == 1 and damage_kinds(report) == [(relative, "changed")]
    repair_and_reland(data_dir, build, capsys, before, relative, "file_changed")


def test_repair_follows_references_into_later_landings(data_dir, build, capsys):
    before = land_all(data_dir, build)
    task, rollout, _ = records(build, "inventory", 0)
    rescored = [build.score(rollout, i, version="2") for i in range(3)]
    with Warehouse(data_dir) as wh:  # a later landing of scores for the inventory steps
        wh.land(scores=rescored).checked()
        before = counts(wh)
    lake_file(data_dir, "tasks").unlink()
    assert main(["warehouse", "repair", "--data-dir", str(data_dir)]) == 0
    with Warehouse(data_dir, read_only=True) as wh:
        rows = wh.sql("select failures from quarantine order by created_at").to_pylist()
        expectations = sorted(f["expectation"] for r in rows for f in json.loads(r["failures"]))
        assert expectations == ["file_missing", "references_quarantined_rows"]
        assert wh.count("step_scores") == 3  # coding's only: the rescore of lost steps went too
    assert check_json(data_dir, capsys)[0] == 0
    land_all(data_dir, build)
    with Warehouse(data_dir) as wh:
        wh.land(scores=rescored).checked()
        assert counts(wh) == before


def test_repair_follows_dataset_lineage_to_rollouts_of_a_later_landing(data_dir, build, capsys):
    # The task landed earlier; a later landing adds a second sample's rollout, and a dataset names both.
    # Damage to the later landing must take the dataset with it: none of its rows may name a lost rollout.
    from gymfoundry.envs.records import DatasetManifest, DatasetRow

    land_all(data_dir, build)
    task, first, _ = records(build, "inventory", 0)
    second = build.rollout(task, seed=7)
    manifest = DatasetManifest(dataset_id="sft-x", kind="sft", rows=1, families=["inventory"], learnability="p(1-p)")
    row = DatasetRow(dataset_id="sft-x", row_id="abc", row_index=0, family="inventory", task_id=task.task_id,
                     difficulty=2, rollout_ids=[first.rollout_id, second.rollout_id], weight=1.0)
    with Warehouse(data_dir) as wh:
        wh.land(rollouts=[second], scores=[build.score(second, 0)]).checked()
        wh.land(datasets=[manifest], dataset_rows=[row]).checked()
        before = counts(wh)
        [victim] = [f for f in wh.files("rollouts") if second.rollout_id in pq.read_table(f)["rollout_id"].to_pylist()]
    os.chmod(victim, 0o644)
    victim.write_bytes(victim.read_bytes()[:-9] + b"x" + victim.read_bytes()[-8:])
    assert main(["warehouse", "repair", "--data-dir", str(data_dir)]) == 0
    with Warehouse(data_dir, read_only=True) as wh:
        assert wh.count("dataset_rows") == 0 and wh.count("datasets") == 0
        assert wh.count("tasks") == before["tasks"]  # the earlier landing stays
    code, report, printed = check_json(data_dir, capsys)
    assert code == 0, printed
    with Warehouse(data_dir) as wh:  # the same records land again, the dataset with them
        wh.land(rollouts=[second], scores=[build.score(second, 0)]).checked()
        wh.land(datasets=[manifest], dataset_rows=[row]).checked()
        assert counts(wh) == before


def test_damage_in_one_table_does_not_stop_landing_in_others(data_dir, build):
    land_all(data_dir, build)
    lake_file(data_dir, "steps").unlink()
    with Warehouse(data_dir) as wh:
        assert wh.land(tasks=[build.task("inventory", 40)]).checked() == {"tasks": 1}
        task, rollout, _ = records(build, "inventory", 41)
        with pytest.raises(DamagedWarehouse, match="warehouse repair"):  # landing steps needs the steps table
            wh.land(tasks=[task], rollouts=[rollout])
        assert wh.count("tasks") == 5


def test_run_on_a_damaged_warehouse_fails_before_any_episode(data_dir, build, capsys):
    land_all(data_dir, build)
    victim = lake_file(data_dir, "rollouts", "coding")
    victim.unlink()
    assert main(["run", "--data-dir", str(data_dir), "--tasks", "2"]) == 1
    err = capsys.readouterr().err
    assert "DamagedWarehouse" in err and victim.relative_to(data_dir).as_posix() in err
    assert "gymfoundry warehouse repair" in err


def test_temp_and_unregistered_files_are_reported_not_damage(data_dir, build, capsys):
    land_all(data_dir, build)
    folder = lake_file(data_dir, "steps").parent
    (folder / ".b-abc.4242.tmp").write_bytes(b"PAR1 half a file")
    (folder / "b-stray.parquet").write_bytes(b"not registered")
    code, report, printed = check_json(data_dir, capsys)
    assert code == 0, printed
    base = folder.relative_to(data_dir).as_posix()
    assert damage_kinds(report) == [(f"{base}/.b-abc.4242.tmp", "temp"), (f"{base}/b-stray.parquet", "unregistered")]
    assert main(["warehouse", "repair", "--data-dir", str(data_dir)]) == 0
    assert "removed" in capsys.readouterr().out and not (folder / ".b-abc.4242.tmp").exists()
    assert (folder / "b-stray.parquet").exists()  # not ours to delete: it may be a killed run's batch


def test_a_catalog_from_before_checksums_keeps_working(data_dir, build, capsys, caplog):
    before = land_all(data_dir, build)
    con = duckdb.connect(str(data_dir / "catalog.duckdb"))  # a manifest from before checksums
    con.execute("ALTER TABLE manifest DROP COLUMN sha256")
    con.execute("ALTER TABLE manifest DROP COLUMN landing_id")
    con.close()
    code, report, _ = check_json(data_dir, capsys)  # read-only: checksums unknown, row counts still checked
    assert code == 0 and {f["kind"] for f in report["files"]} == {"unknown_checksum"} and len(report["files"]) == 10
    lake_file(data_dir, "steps").unlink()
    with caplog.at_level(logging.WARNING, logger="gymfoundry.warehouse"):
        with Warehouse(data_dir) as wh:  # the first writer migrates, trusting the files as they are
            assert catalog.manifest_columns(wh.con) >= {"sha256", "landing_id"}
    assert "recorded the checksums of 9 lake files" in caplog.text and "1 registered lake files" in caplog.text
    code, report, _ = check_json(data_dir, capsys)
    assert code == 1 and [f["kind"] for f in report["files"]] == ["missing"]
    assert main(["warehouse", "repair", "--data-dir", str(data_dir)]) == 0  # old landings group by landed_at
    land_all(data_dir, build)
    with Warehouse(data_dir, read_only=True) as wh:
        assert counts(wh) == before
    assert check_json(data_dir, capsys)[0] == 0


def test_check_never_crashes_without_a_report(tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "catalog.duckdb").write_bytes(b"this is no database")
    out = tmp_path / "report.json"
    assert main(["warehouse", "check", "--data-dir", str(broken), "--report", str(out)]) == 1
    assert json.loads(out.read_text())["success"] is False


def flip_footer_bit(file: Path) -> None:
    """Bit rot in the footer: the same size, inode and times, and neither pyarrow nor DuckDB reads it."""
    st = file.stat()
    os.chmod(file, 0o644)
    data = bytearray(file.read_bytes())
    data[-9] ^= 0x01
    data[-1] ^= 0x01
    file.write_bytes(bytes(data))
    os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_remembered_footer_is_parsed_again_once_its_bytes_change(data_dir, build, monkeypatch):
    """A view's rebuild parses only footers whose bytes it has not seen; a footer damaged since,
    even keeping the file's size and times, is parsed again and the damage confined as before."""
    monkeypatch.setattr(catalog, "_FOOTERS", {})
    land_all(data_dir, build)
    files = len(list((data_dir / "lake").rglob("*.parquet")))
    read = []
    footer = catalog.footer
    monkeypatch.setattr(catalog, "footer", lambda file: read.append(file.name) or footer(file))
    Warehouse(data_dir).close()
    with Warehouse(data_dir, read_only=True) as wh:
        assert wh.count("steps") == 6
    assert read == []  # every footer was parsed when its landing rebuilt the views

    victim = lake_file(data_dir, "steps")
    relative = victim.relative_to(data_dir).as_posix()
    flip_footer_bit(victim)
    with Warehouse(data_dir, read_only=True) as wh:  # opens; the other tables answer
        assert read == [victim.name]  # only the changed footer parsed again
        assert wh.count("rollouts") == 2 and wh.count("step_scores") == 6
        with pytest.raises(DamagedWarehouse, match=f"{relative}.*warehouse repair"):
            wh.sql("select count(*) from steps")
    assert files == 10


def test_a_long_lived_writer_confines_damage_found_after_it_parsed_the_footer(data_dir, build):
    """`damage in one table does not stop landing in others`, in one writer that rebuilt its views
    (and remembered the footers) before the disk flipped a bit."""
    land_all(data_dir, build)
    with Warehouse(data_dir) as wh:
        assert wh.land(tasks=[build.task("inventory", 40)]).checked() == {"tasks": 1}
        flip_footer_bit(lake_file(data_dir, "steps"))
        task = build.task("inventory", 41)
        assert wh.land(tasks=[build.task("inventory", 42)]).checked() == {"tasks": 1}  # views rebuilt
        with pytest.raises(DamagedWarehouse, match="warehouse repair"):  # landing steps needs the steps table
            wh.land(tasks=[task], rollouts=[build.rollout(task, seed=41)])
        assert wh.count("tasks") == 6
