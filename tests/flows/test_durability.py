"""Durability: a factory process killed with SIGKILL while it lands leaves no partial batch
visible, and a re-run completes it with exactly the rows of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gymfoundry.flows.cli import main
from gymfoundry.warehouse import TABLES, Warehouse

pytestmark = pytest.mark.usefixtures("prefect_harness")

REPO = Path(__file__).resolve().parents[2]
RUN = ["run", "--families", "inventory", "--tasks", "8", "--seed", "13", "--samples", "2"]
# Columns that measure the run rather than describe the data (timings, clocks).
VOLATILE = {"steps": {"latency_s"}, "runs": {"started_at", "finished_at"}, "datasets": {"created_at"},
            "outcomes": {"verified_at"}, "rollouts": {"flow_run_id"}, "family_audits": {"audited_at"}}


def contents(data_dir: Path) -> dict:
    """Every table's rows without their volatile columns, the manifest and the lake's files."""
    out = {}
    with Warehouse(data_dir, read_only=True) as wh:
        for name, table in TABLES.items():
            rows = []
            for row in wh.sql(f"select * from {name}").to_pylist():
                row = {k: v for k, v in row.items() if k not in VOLATILE.get(name, set())}
                if name == "rollouts":
                    row["cost"] = {k: v for k, v in json.loads(row["cost"]).items() if k != "wall_time_s"}
                rows.append(json.dumps(row, sort_keys=True, default=str))
            out[name] = sorted(rows)
        out["manifest"] = sorted(map(str, wh.sql(
            "select table_name, task_family, if(table_name = 'family_audits', '', path) as path, row_count "
            "from manifest").to_pylist()))
    # A file's name comes from its rows' keys; an audit's key holds when it was landed (volatile).
    out["lake"] = sorted(_lake_name(p.relative_to(data_dir)) for p in (data_dir / "lake").rglob("*") if p.is_file())
    return out


def _lake_name(path: Path) -> str:
    return (path.parent if "family_audits" in path.parts else path).as_posix()


def kill_during_landing(data_dir: Path, marker: Path) -> str:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "GYMFOUNDRY_PAUSE_LANDING": str(marker),
           "GYMFOUNDRY_PAUSE_LANDING_S": "300", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "gymfoundry.flows.cli", *RUN, "--data-dir", str(data_dir)], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the factory never reached landing:\n{proc.stdout.read().decode()[-3000:]}")
        time.sleep(0.2)
    assert int(marker.read_text()) == proc.pid  # paused inside the registering transaction of its first batch
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    return proc.stdout.read().decode()


def test_sigkill_during_landing_then_rerun_equals_an_uninterrupted_run(tmp_path):
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    kill_during_landing(killed, tmp_path / "landing.pid")

    written = [p for p in (killed / "staging").rglob("*.parquet")]
    assert written  # the batch's files were on disk, staged ...
    assert not list((killed / "lake").rglob("*.parquet"))  # ... outside the lake direct readers scan ...
    with Warehouse(killed, read_only=True) as wh:  # ... and no reader saw any of them
        assert {name: wh.count(name) for name in TABLES} == {name: 0 for name in TABLES}
        assert wh.sql("select count(*) as n from manifest").to_pylist() == [{"n": 0}]

    assert main([*RUN, "--data-dir", str(killed)]) == 0   # the re-run completes the batch
    assert main([*RUN, "--data-dir", str(clean)]) == 0    # a run that was never interrupted
    after, expected = contents(killed), contents(clean)
    assert after["rollouts"] and after["steps"] and after["dataset_rows"]
    assert after == expected
    assert not [p for p in (killed / "lake").rglob("*") if p.name.endswith(".tmp")]
    with Warehouse(killed, read_only=True) as wh:
        assert wh.check().success
