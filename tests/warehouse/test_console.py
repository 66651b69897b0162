"""The SQL console (`gymfoundry sql`, a read-only `Warehouse`) runs queries and nothing that writes
files or changes the catalog; every hostile statement is refused before any of the text runs, and
the lake's files, their checksums and `warehouse check` are unchanged afterwards. A query past the
console's time or memory bound is cancelled and its reader closed."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import duckdb
import pytest

from gymfoundry.flows.cli import main
from gymfoundry.warehouse import ConsoleRefused, Warehouse
from gymfoundry.warehouse.statements import check_query


def land(data_dir, build):
    task = build.task("inventory", 0)
    rollout = build.rollout(task)
    with Warehouse(data_dir) as wh:
        wh.land(tasks=[task], rollouts=[rollout], scores=[build.score(rollout, i) for i in range(3)]).checked()
        return [data_dir / p for (p,) in wh.con.execute("select path from manifest order by path").fetchall()]


def state(data_dir):
    """Every file under the data dir but reports, with its checksum."""
    return {p.relative_to(data_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(data_dir.rglob("*")) if p.is_file() and "reports" not in p.parts}


def hostile(data_dir, registered):
    target, steps = registered[0].as_posix(), [f for f in registered if "/steps/" in f.as_posix()][0].as_posix()
    return {
        "copy onto a registered file": f"COPY (SELECT 1 AS a) TO '{target}' (FORMAT parquet)",
        "copy a new file into the lake": f"COPY (SELECT 1 AS a) TO '{data_dir}/lake/steps/new.parquet'",
        "copy into the data dir": f"COPY steps TO '{data_dir}/dump.csv'",
        "export database": f"EXPORT DATABASE '{data_dir}/export'",
        "attach then create": f"ATTACH '{data_dir}/other.duckdb' AS o; CREATE TABLE o.t AS SELECT 1",
        "a copy hidden after a select": f"SELECT 1; COPY (SELECT 2) TO '{steps}'",
        "a copy hidden after a comment": f"/* select */ SELECT 1 -- ;\n; COPY (SELECT 2) TO '{steps}'",
        "explain analyze of a copy": f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{target}'",
        "explain with options": "EXPLAIN (FORMAT json) SELECT 1",
        "install": "INSTALL httpfs",
        "load": "LOAD json",
        "create temp table": "CREATE TEMP TABLE t AS SELECT 1",
        "create view": "CREATE TEMP VIEW steps AS SELECT 1 AS a",
        "insert": "INSERT INTO manifest SELECT * FROM manifest",
        "update": "UPDATE manifest SET sha256 = 'x'",
        "delete": "DELETE FROM manifest",
        "drop": "DROP VIEW steps",
        "set external access": "SET enable_external_access = true",
        "set a profiling output file": f"SET profiling_output = '{data_dir}/lake/p.json'",
        "pragma that writes": "PRAGMA enable_profiling = 'json'",
        "call": "CALL checkpoint()",
        "prepare a copy": f"PREPARE p AS COPY (SELECT 1) TO '{target}'",
        "execute": "EXECUTE p",
        "use another catalog": "USE memory",
        "begin": "BEGIN TRANSACTION",
        "vacuum": "VACUUM",
        "a kind the Python API cannot name": "UPDATE EXTENSIONS",
    }


def test_every_hostile_statement_is_refused_and_nothing_changes(data_dir, build, capsys):
    registered = land(data_dir, build)
    before = state(data_dir)
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o444 for f in registered)
    for name, statement in hostile(data_dir, registered).items():
        with Warehouse(data_dir, read_only=True) as wh, pytest.raises(ConsoleRefused, match="only runs queries"):
            wh.sql(statement)
        assert main(["sql", "--data-dir", str(data_dir), statement]) == 1, name  # ran and was refused
        assert "ConsoleRefused" in capsys.readouterr().err, name
    assert state(data_dir) == before
    out = data_dir / "check.json"
    assert main(["warehouse", "check", "--data-dir", str(data_dir), "--report", str(out)]) == 0
    assert json.loads(out.read_text())["files"] == []


def test_functions_with_side_effects_and_files_outside_the_lake_are_refused_by_duckdb(data_dir, build, tmp_path):
    # Queries by the statement check, but they write files anywhere (logging, profiling) or change the
    # connection; and the console reads no file outside the lake (`/etc/shadow` as root).
    registered = land(data_dir, build)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.csv").write_text("s3cret")
    before, outside_before = state(data_dir), sorted(outside.rglob("*"))
    lake = data_dir / "lake"
    writes = [f"SELECT * FROM enable_logging(storage = 'file', storage_path = '{outside}/logs')",
              f"SELECT * FROM enable_logging(storage = 'file', storage_path = '{lake}/steps/logs')",
              f"SELECT * FROM system.main.\"Enable_Logging\"(storage = 'file', storage_path = '{registered[0]}')",
              f"SELECT * FROM enable_profiling(save_location = '{outside}/profile.json')",
              "SELECT * FROM add_grammar_extension('x')"]
    reads = [f"SELECT * FROM read_text('{outside}/secret.csv')", f"SELECT * FROM read_blob('{outside}/secret.csv')",
             f"SELECT * FROM read_csv('{outside}/secret.csv')", f"SELECT * FROM '{outside}/secret.csv'",
             f"SELECT * FROM glob('{outside}/*')", f"SELECT * FROM read_text('{lake}/../../outside/secret.csv')"]
    for statement in writes + reads:
        with Warehouse(data_dir, read_only=True) as wh:
            with pytest.raises(Exception, match="locked|disabled by configuration"):
                wh.sql(statement)
            wh.sql("SELECT count(*) FROM steps")  # still a working console
            assert wh.sql("SELECT count(*) AS n FROM duckdb_logs").to_pylist() == [{"n": 0}], statement
    assert state(data_dir) == before and sorted(outside.rglob("*")) == outside_before
    with Warehouse(data_dir, read_only=True) as wh:  # the lake itself still reads, through views and by path
        assert wh.sql(f"SELECT count(*) AS n FROM read_parquet('{registered[0]}')").num_rows == 1


def test_a_lake_partition_symlinked_onto_another_disk_stays_readable(data_dir, build, tmp_path):
    registered = land(data_dir, build)
    partition = [f for f in registered if "/steps/" in f.as_posix()][0].parent
    moved = tmp_path / "other-disk" / "steps-inventory"
    moved.parent.mkdir()
    partition.rename(moved)
    partition.symlink_to(moved)
    with Warehouse(data_dir, read_only=True) as wh:
        assert wh.sql("select count(*) as n from steps").to_pylist() == [{"n": 3}]
        with pytest.raises(Exception, match="disabled by configuration"):  # its neighbours are not the lake's
            wh.sql(f"select * from read_text('{moved.parent}/*')")


def test_the_message_names_the_refused_statement():
    with pytest.raises(ConsoleRefused, match=r"COPY \(statement 2 of 2\)"):
        check_query("select 1; copy (select 1) to 'x.csv'")
    with pytest.raises(ConsoleRefused, match="ATTACH"):
        check_query("attach 'x.db'")


def test_queries_of_every_allowed_kind_run(data_dir, build):
    registered = land(data_dir, build)
    before = state(data_dir)
    steps = [f for f in registered if "/steps/" in f.as_posix()][0]
    with Warehouse(data_dir, read_only=True) as wh:
        assert wh.sql("select count(*) as n from steps").to_pylist() == [{"n": 3}]
        assert wh.sql("with s as (select * from steps) select max(index) as m from s").to_pylist() == [{"m": 2}]
        assert wh.sql("from rollouts select termination").to_pylist() == [{"termination": "success"}]
        assert wh.sql(f"select count(*) as n from read_parquet('{steps}')").to_pylist() == [{"n": 3}]
        assert wh.sql("values (1), (2)").num_rows == 2
        assert wh.sql("describe steps").num_rows > 5
        assert "steps" in {r["name"] for r in wh.sql("show tables").to_pylist()}
        assert wh.sql("summarize select reward from steps").num_rows == 1
        assert wh.sql("pivot (select index from steps) on index using count(*)").num_columns == 3
        assert wh.sql("unpivot (select 1 as a, 2 as b) on a, b into name k value v").num_rows == 2
        assert wh.sql("explain select * from steps").num_rows >= 1
        assert wh.sql("explain analyze select count(*) from steps").num_rows >= 1
        assert wh.sql("select 1 as a; select 2 as b").to_pylist() == [{"b": 2}]
        assert wh.sql("select * from steps where rollout_id = ?", ["nope"]).num_rows == 0
    assert main(["sql", "--data-dir", str(data_dir), "select task_family, count(*) from steps group by all"]) == 0
    assert state(data_dir) == before


def test_a_writer_keeps_its_full_sql(wh):
    # Landing code needs DDL; only the read-only path is the console.
    assert wh.sql("create temp view scratch as select 1 as a").num_rows == 0



def test_render_prints_a_result_as_table_csv_or_json(data_dir, build):
    import json
    from datetime import datetime

    import pyarrow as pa

    from gymfoundry.envs.records import RetryPolicy, Run
    from gymfoundry.warehouse.console import render

    land(data_dir, build)
    with Warehouse(data_dir) as wh:
        wh.land(runs=[Run(params={}, retry_policy=RetryPolicy(), started_at="2026-05-01T12:00:00+00:00")]).checked()
    with Warehouse(data_dir, read_only=True) as wh:
        result = wh.sql("select r.task_family, r.seed, r.success, r.tokens, r.run_id, [1, 2] as ids, "
                        "'a, \"b\"' as text, u.started_at from rollouts r, runs u")
    assert render(result, "csv", 10) == ('task_family,seed,success,tokens,run_id,ids,text,started_at\n'
                                         'inventory,0,true,42,,"[1, 2]","a, ""b""",2026-05-01T12:00:00')
    assert json.loads(render(result, "json", 10)) == [
        {"task_family": "inventory", "seed": 0, "success": True, "tokens": 42, "run_id": None, "ids": [1, 2],
         "text": 'a, "b"', "started_at": "2026-05-01T12:00:00"}]
    assert render(result.slice(0, 0), "json", 10) == "[]"
    assert render(result.slice(0, 0), "csv", 10) == "task_family,seed,success,tokens,run_id,ids,text,started_at"
    table = render(result, "table", 10)  # what `gymfoundry sql` printed before it had formats
    assert table.splitlines()[0] == "shape: (1, 8)" and "2026-05-01 12:00:00" in table and "inventory" in table

    many = pa.table({"n": list(range(30)), "at": [datetime(2026, 1, 1, 0, 0, i) for i in range(30)]})
    short = render(many, "table", 5)
    assert short.splitlines()[0] == "shape: (30, 2)" and "…" in short and " 29 " in short and " 12 " not in short
    assert " 12 " in render(many, "table", 50)
    assert len(render(many, "csv", 5).splitlines()) == 31  # machine formats hold every row
    assert len(json.loads(render(many, "json", 5))) == 30
    with pytest.raises(ValueError, match="table, csv, json"):
        render(many, "xml", 5)


ENDLESS = "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM t) SELECT count(*) FROM t"


def test_a_query_past_the_time_bound_is_cancelled_and_the_catalog_freed(data_dir, build):
    from gymfoundry.warehouse.console import QueryCancelled, query

    land(data_dir, build)
    with pytest.raises(QueryCancelled, match=r"^the query ran past the console's time limit of 1.5 s \(--timeout\) "
                                             r"and was cancelled$"):
        query(data_dir, ENDLESS, timeout_s=1.5)
    with Warehouse(data_dir, lock_timeout_s=0) as wh:  # a writer opens at once: the reader is closed
        assert wh.count("steps") == 3
    assert query(data_dir, "select count(*) as n from steps", timeout_s=60).to_pylist() == [{"n": 3}]


def test_a_query_past_the_memory_bound_is_cancelled_and_the_bounds_are_set(data_dir, build):
    from gymfoundry.warehouse.console import QueryCancelled, default_max_memory, query

    land(data_dir, build)
    with pytest.raises(QueryCancelled, match=r"^the query needed more than the console's memory limit of 50MB "
                                             r"\(--max-memory\) and was cancelled$"):
        query(data_dir, "SELECT len(list(i)) FROM range(100000000) t(i)", max_memory="50MB")
    settings = "select current_setting('memory_limit') as m, current_setting('max_temp_directory_size') as t"
    assert query(data_dir, settings, max_memory="300MB").to_pylist() == [{"m": "286.1 MiB", "t": "286.1 MiB"}]
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert default_max_memory() == f"{total // 4 // 2**20}MiB"
    with duckdb.connect() as con:  # the default is what the console sets
        con.execute("SET memory_limit = ?", [default_max_memory()])
        expected = con.execute("select current_setting('memory_limit')").fetchall()[0][0]
    assert query(data_dir, settings).to_pylist()[0]["m"] == expected
    with pytest.raises(ConsoleRefused):  # the bounds are the console's, not the query's to change
        query(data_dir, "SET memory_limit = '100GB'")
