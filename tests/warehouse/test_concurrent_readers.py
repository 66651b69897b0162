"""Readers of one catalog open at once in one process (the factory's families check the landed
splits side by side) share DuckDB's database instance: each reads, none loosens the confinement."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import duckdb
import pytest

from gymfoundry.warehouse import Warehouse


def test_readers_open_at_once_all_read_and_stay_confined(data_dir, build):
    tasks = [build.task("inventory", n) for n in range(3)]
    with Warehouse(data_dir) as wh:
        wh.land(tasks=tasks).checked()
    with Warehouse(data_dir, read_only=True) as first, Warehouse(data_dir, read_only=True) as second:
        assert first.count("tasks") == second.count("tasks") == 3
        assert second.sql("SELECT task_id FROM tasks").num_rows == 3  # what isolate asks, after the check
        for wh in (first, second):
            with pytest.raises(duckdb.Error, match="disabled|Permission|not allowed"):
                wh.con.execute("SELECT * FROM read_blob('/etc/hostname')").fetchall()

    def count(_):
        with Warehouse(data_dir, read_only=True) as wh:
            return wh.sql("SELECT count(*) AS n FROM tasks").to_pylist()[0]["n"]

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(count, range(32))) == [3] * 32
