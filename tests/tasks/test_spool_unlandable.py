"""A spooled batch that cannot be landed (a torn or hand-edited file, records that no longer
validate) is set aside with its reason and never holds up the batches spooled after it."""

from __future__ import annotations

import json
import logging

from gymfoundry.envs.records import HoldoutLock, RetryPolicy, Run
from gymfoundry.tasks.stages.land import land_or_spool, land_run
from gymfoundry.warehouse import Warehouse, spool


def test_an_unlandable_spool_file_is_set_aside_and_the_rest_lands(tmp_path, caplog):
    first = spool.save(tmp_path, {"holdout_locks": [HoldoutLock(family="inventory", holdout_fraction=0.2)]}, {})
    torn = first.with_name("00000000T000000000000Z-torn.json")  # sorts first: landed before the others
    torn.write_text('{"spooled_at": "2026-12-07T00:00:00+00:00", "options": {}, "records": {"tasks": [{"task_')
    invalid = first.with_name("00000000T000000000001Z-invalid.json")
    invalid.write_text('{"spooled_at": "x", "options": {}, "records": {"holdout_locks": [{"family": 3}]}}\n')
    with caplog.at_level(logging.ERROR, "gymfoundry.warehouse"):
        landing = land_or_spool(str(tmp_path), {"holdout_locks": [HoldoutLock(family="coding", holdout_fraction=0.2)]})
    assert landing.ok and landing.drained == [first]
    with Warehouse(tmp_path, read_only=True) as wh:
        rows = wh.sql("SELECT family FROM holdout_locks ORDER BY family").to_pylist()
    assert rows == [{"family": "coding"}, {"family": "inventory"}]
    assert spool.pending(tmp_path) == []
    aside = tmp_path / spool.SPOOL_DIR / spool.UNLANDABLE_DIR
    assert sorted(p.name for p in aside.iterdir()) == sorted([invalid.name, f"{invalid.stem}.reason.txt", torn.name,
                                                             f"{torn.stem}.reason.txt"])
    assert (aside / f"{torn.stem}.reason.txt").read_text().startswith("JSONDecodeError: ")
    assert (aside / f"{invalid.stem}.reason.txt").read_text().startswith("ValidationError: ")
    assert [r.message.split(" could not be landed")[0] for r in caplog.records] == [
        f"the batch spooled at {torn.name}", f"the batch spooled at {invalid.name}"]


def test_a_run_row_waiting_behind_a_set_aside_batch_names_it(tmp_path):
    """The run row lands with the counts of the batches that landed and names the one set aside:
    its `landed` alone would read as if the run had collected less."""
    good = spool.save(tmp_path, {"holdout_locks": [HoldoutLock(family="inventory", holdout_fraction=0.2)]}, {})
    bad = good.with_name(good.name.replace(".json", "-bad.json"))
    bad.write_text('{"spooled_at": "x", "options": {}, "records": {"holdout_locks": [{"family": 3}]}}\n')
    run = Run(params={"families": ["inventory"]}, retry_policy=RetryPolicy())
    assert land_run(str(tmp_path), run, spooled=[good, bad]) == {}  # waits in the spool behind them
    land_or_spool(str(tmp_path), {})
    with Warehouse(tmp_path, read_only=True) as wh:
        [row] = wh.sql("SELECT landed, quarantined FROM runs").to_pylist()
    aside = tmp_path / spool.SPOOL_DIR / spool.UNLANDABLE_DIR / bad.name
    assert json.loads(row["landed"]) == {"holdout_locks": 1}  # a JSON column
    assert row["quarantined"] == [str(aside)] and aside.exists()
