"""The catalog as users' own tools see it: the DuckDB CLI from PyPI opens it and runs the README's
queries, a moved or copied data dir reads its own lake, and a reader globbing the lake's folders
directly counts only registered batches."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from gymfoundry.envs.records import Termination
from gymfoundry.warehouse import TABLES, Warehouse, catalog
from gymfoundry.warehouse.lake import write_batch
from gymfoundry.warehouse.store import _row

DUCKDB_CLI = Path(sys.executable).parent / "duckdb"  # duckdb-cli, installed in the venv running the tests
# The query of the README's tour and of docs/warehouse.md's "Analysis views".
README_QUERY = ("select task_family, difficulty_level, policy_version, success_rate, rollouts "
                "from success_by_cell order by all")


def cli(catalog_file: str, query: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(DUCKDB_CLI), "-readonly", "-csv", catalog_file, "-c", query], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def land(data_dir, build, n: int = 3, family: str = "inventory"):
    """n tasks of one family, one rollout each; every third one fails."""
    tasks = [build.task(family, i) for i in range(n)]
    rollouts = [build.rollout(t, seed=i, termination=Termination.failure if i % 3 == 2 else Termination.success)
                for i, t in enumerate(tasks)]
    with Warehouse(data_dir) as wh:
        wh.land(tasks=tasks, rollouts=rollouts).checked()
    return tasks, rollouts


@pytest.fixture(autouse=True)
def _cli_installed():
    assert DUCKDB_CLI.is_file(), "the dev dependency duckdb-cli (the CLI users install from PyPI) is missing"


@pytest.mark.integration  # the duckdb CLI in a subprocess
def test_the_duckdb_cli_from_pypi_runs_a_readme_query_on_the_catalog(data_dir, tmp_path, build):
    land(data_dir, build)
    assert catalog.storage_number(data_dir / "catalog.duckdb") == catalog.READABLE_STORAGE
    opened_in_dir = cli("catalog.duckdb", README_QUERY, cwd=data_dir)  # what docs/warehouse.md says: cd there
    assert opened_in_dir.returncode == 0, opened_in_dir.stderr
    assert opened_in_dir.stdout.splitlines() == [
        "task_family,difficulty_level,policy_version,success_rate,rollouts", "inventory,2,1,0.6666666666666666,3"]
    # From elsewhere, with the data dir as the search path for the lake's relative paths.
    elsewhere = cli(str(data_dir / "catalog.duckdb"), f"set file_search_path = '{data_dir}'; {README_QUERY}",
                    cwd=tmp_path)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert elsewhere.stdout == opened_in_dir.stdout


@pytest.mark.integration  # the duckdb CLI in a subprocess
def test_a_catalog_in_a_newer_storage_version_is_copied_into_the_readable_one(data_dir, build, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(catalog, "CONFIG", {})  # what gymfoundry wrote before: DuckDB 2's own storage version
        tasks, rollouts = land(data_dir, build)
    path = data_dir / "catalog.duckdb"
    newer = catalog.storage_number(path)
    assert newer > catalog.READABLE_STORAGE
    refused = cli("catalog.duckdb", "select count(*) from rollouts", cwd=data_dir)
    assert refused.returncode != 0 and "version" in refused.stderr
    with Warehouse(data_dir, read_only=True) as wh:  # a reader leaves the file as it is
        assert wh.count("rollouts") == 3
    assert catalog.storage_number(path) == newer

    with Warehouse(data_dir) as wh:  # the first writer copies it into the readable version
        assert wh.count("rollouts") == 3 and wh.count("tasks") == 3
        assert wh.sql("select count(*) as n from manifest").to_pylist() == [{"n": 3}]
        assert wh.land(tasks=tasks, rollouts=rollouts).counts == {"tasks": 0, "rollouts": 0, "steps": 0}
    assert catalog.storage_number(path) == catalog.READABLE_STORAGE
    backup = data_dir / f"catalog.duckdb.v{newer}.bak"
    assert catalog.storage_number(backup) == newer  # the old file is kept
    opened = cli("catalog.duckdb", "select count(*) as n from rollouts", cwd=data_dir)
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout.splitlines() == ["n", "3"]
    con = duckdb.connect(str(path), read_only=True)  # keys survive the copy
    assert con.execute("select constraint_type from duckdb_constraints() where table_name = 'manifest' "
                       "and constraint_type = 'PRIMARY KEY'").fetchall() == [("PRIMARY KEY",)]
    con.close()


@pytest.mark.integration  # the duckdb CLI in a subprocess
def test_a_copied_data_dir_reads_its_own_lake(data_dir, tmp_path, build):
    land(data_dir, build)
    copy = tmp_path / "copy"
    shutil.copytree(data_dir, copy)
    land(data_dir, build, n=6)  # the original grows: the copy must not see it
    with Warehouse(data_dir, read_only=True) as wh:
        assert wh.count("rollouts") == 6
    with Warehouse(copy, read_only=True) as wh:
        assert wh.count("rollouts") == 3 and wh.count("steps") == 9
        assert all(p.is_relative_to(copy) for p in wh.files("steps"))
    assert cli("catalog.duckdb", "select count(*) as n from rollouts", cwd=copy).stdout.splitlines() == ["n", "3"]

    shutil.rmtree(data_dir)  # and it never needed the original's files
    with Warehouse(copy, read_only=True) as wh:
        assert wh.count("rollouts") == 3
        assert wh.sql("select count(*) as n from success_by_cell join tasks using (task_family)").to_pylist() \
            == [{"n": 3}]
    with Warehouse(copy) as wh:
        assert wh.count("steps") == 9
        tasks, rollouts = [build.task("inventory", 7)], [build.rollout(build.task("inventory", 7), seed=7)]
        assert wh.land(tasks=tasks, rollouts=rollouts).checked()["rollouts"] == 1
        assert wh.count("rollouts") == 4
    result = cli("catalog.duckdb", README_QUERY, cwd=copy)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1] == "inventory,2,1,0.75,4"


def test_a_direct_reader_of_the_lake_counts_only_registered_batches(data_dir, build):
    land(data_dir, build)
    # A landing killed after writing its batch, before registering it, leaves the file in staging.
    orphan_task = build.task("inventory", 9)
    orphan = write_batch(data_dir, TABLES["rollouts"], "inventory", [_row(TABLES["rollouts"], build.rollout(orphan_task))])
    assert (data_dir / "staging" / orphan.path.removeprefix("lake/")).is_file()
    direct = duckdb.connect()
    glob = f"{data_dir}/lake/rollouts/**/*.parquet"
    assert direct.execute(f"select count(*) from read_parquet('{glob}')").fetchall() == [(3,)]
    with Warehouse(data_dir, read_only=True) as wh:
        kinds = {p["path"]: p["kind"] for p in wh.check().files}
        assert kinds == {"staging/" + orphan.path.removeprefix("lake/"): "unregistered"}
    with Warehouse(data_dir) as wh:  # the next writer removes what no landing registered
        assert wh.count("rollouts") == 3
    assert not [p for p in (data_dir / "staging").rglob("*") if p.is_file()]
    assert direct.execute(f"select count(*) from read_parquet('{glob}')").fetchall() == [(3,)]


def test_a_landing_killed_after_registering_is_completed_by_the_next_writer(data_dir, build, monkeypatch):
    land(data_dir, build)
    task = build.task("inventory", 5)
    with monkeypatch.context() as m:
        m.setattr(catalog, "publish", lambda data_dir, path: None)  # killed right after the commit
        land_more = Warehouse(data_dir)
        land_more.land(tasks=[task], rollouts=[build.rollout(task, seed=5)]).checked()
        land_more.close()
    with Warehouse(data_dir, read_only=True) as wh:
        staged = sorted(p["path"] for p in wh.check().files if p["kind"] == "staged")
        assert [p.split("/")[1] for p in staged] == ["rollouts", "steps", "tasks"]
        assert wh.check().success  # no damage: nothing was lost
    with Warehouse(data_dir) as wh:
        assert wh.count("rollouts") == 4 and wh.count("steps") == 12
    assert all((data_dir / p).is_file() for p in staged)
    assert not [p for p in (data_dir / "staging").rglob("*") if p.is_file()]
    direct = duckdb.connect()
    assert direct.execute(f"select count(*) from read_parquet('{data_dir}/lake/rollouts/**/*.parquet')") \
        .fetchall() == [(4,)]
