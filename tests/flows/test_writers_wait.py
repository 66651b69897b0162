"""Every writer waits for a held catalog and spools when the wait runs out, as the factory's landing
does; a run is recorded whatever stage fails; a spooled batch is assembled and announced by the run
that lands it; validation retries environment faults. The reader is a real second process holding
`duckdb.connect(catalog, read_only=True)`, as a notebook left open does."""

from __future__ import annotations

import errno
import json
import logging
import re
import subprocess
import sys
import threading
import time

import pytest

import gymfoundry.flows.factory as factory_module
from gymfoundry.envs.records import RetryPolicy
from gymfoundry.flows.factory import factory
from tests.envs.test_person import email_task, llm_customer
from tests.verifiers.openai_stub import OpenAIStub
from gymfoundry.warehouse import Warehouse

pytestmark = pytest.mark.usefixtures("prefect_harness")

# Holds a read-only connection until the file argv[2] exists (or argv[3] seconds pass).
HOLD = ("import duckdb, os, sys, time\n"
        "con = duckdb.connect(sys.argv[1], read_only=True)\n"
        "print('held', flush=True)\n"
        "deadline = time.monotonic() + float(sys.argv[3])\n"
        "while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n")


class Notebook:
    """A second process with the catalog open read-only, until `close()`."""

    def __init__(self, data_dir, tmp_path, max_s: float = 600):
        self.release = tmp_path / "release"
        self.proc = subprocess.Popen([sys.executable, "-c", HOLD, str(data_dir / "catalog.duckdb"),
                                      str(self.release), str(max_s)], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"
        self.pid = self.proc.pid

    def close(self) -> None:
        self.release.touch()
        self.proc.wait(timeout=60)


class RunLog(logging.Handler):
    """What Prefect's run loggers (`get_run_logger()`) were given, with the run each line belongs to."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[str, str | None]] = []

    def emit(self, record):
        self.lines.append((record.getMessage(), getattr(record, "flow_run_id", None)))

    def __enter__(self):
        for name in ("prefect.flow_runs", "prefect.task_runs"):
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc):
        for name in ("prefect.flow_runs", "prefect.task_runs"):
            logging.getLogger(name).removeHandler(self)


def sql(data_dir, query, params=None):
    with Warehouse(data_dir, read_only=True) as wh:
        return wh.sql(query, params).to_pylist()


def announcements(monkeypatch) -> list[tuple[str, str, str]]:
    announced: list[tuple[str, str, str]] = []
    monkeypatch.setattr(factory_module, "announce_dataset",
                        lambda kind, d, data_dir, run_id: announced.append((kind, d["dataset_id"], run_id)))
    return announced


def test_a_run_waits_for_a_notebooks_reader_says_who_holds_it_and_completes_once_it_closes(tmp_path, monkeypatch):
    monkeypatch.setenv("GYMFOUNDRY_LOCK_WAIT_S", "300")
    data_dir = tmp_path / "data"
    Warehouse(data_dir).close()
    notebook = Notebook(data_dir, tmp_path)
    out: dict = {}

    def run():
        try:
            out["report"] = factory(families=["inventory"], tasks_per_family=3, samples_per_task=1, seed=1,
                                    data_dir=str(data_dir))
        except BaseException as exc:  # noqa: BLE001  shown by the assertions below
            out["error"] = exc

    with RunLog() as logged:
        thread = threading.Thread(target=run)
        thread.start()
        waiting = re.compile(rf"waiting for \S*python\S* \(PID {notebook.pid}\)")
        while thread.is_alive() and not any(waiting.search(line) and run_id for line, run_id in logged.lines):
            time.sleep(0.1)
        # the run waits (its own log says for whom); meanwhile the spool holds only the holdout lock,
        # which the run's first landing lands before the run's rows
        assert thread.is_alive(), out.get("error")
        assert all(set(json.loads(p.read_text())["records"]) == {"holdout_locks"}
                   for p in (data_dir / "spool").glob("*.json"))
        notebook.close()
        thread.join(timeout=600)
    assert "error" not in out, out.get("error")
    report = out["report"]
    assert report["landed"]["rollouts"] == 3 and report["spooled"] == []
    assert list((data_dir / "spool").glob("*.json")) == []
    assert sql(data_dir, "SELECT family, holdout_fraction FROM holdout_locks") == \
        [{"family": "inventory", "holdout_fraction": 0.1}]
    (run,) = sql(data_dir, "SELECT run_id, status, landed FROM runs")
    assert run["status"] == "completed" and json.loads(run["landed"])["rollouts"] == 3
    assert sql(data_dir, "SELECT count(*) AS n FROM rollouts WHERE run_id = ?", [run["run_id"]]) == [{"n": 3}]


def test_a_reader_held_past_the_wait_spools_the_run_and_the_next_run_lands_assembles_and_announces_it(
        tmp_path, monkeypatch):
    monkeypatch.setenv("GYMFOUNDRY_LOCK_WAIT_S", "1")
    data_dir = tmp_path / "data"
    announced = announcements(monkeypatch)
    first = factory(families=["inventory"], tasks_per_family=6, samples_per_task=1, seed=1, data_dir=str(data_dir))
    earlier = {d["dataset_id"] for d in first["datasets"].values()}
    assert sorted(announced) == sorted((k, d["dataset_id"], first["run"]["run_id"])
                                       for k, d in first["datasets"].items() if d["rows"])
    announced.clear()

    notebook = Notebook(data_dir, tmp_path)
    try:
        spooled = factory(families=["inventory"], tasks_per_family=6, samples_per_task=1, seed=2,
                          data_dir=str(data_dir))
    finally:
        notebook.close()
    # nothing of it landed, so it assembles nothing and announces nothing (on HEAD: the datasets of
    # the run before, announced again as its own)
    assert spooled["spooled"] and spooled["datasets"] == {} and announced == []
    spooled_run = spooled["run"]["run_id"]
    assert sql(data_dir, "SELECT count(*) AS n FROM rollouts WHERE run_id = ?", [spooled_run]) == [{"n": 0}]
    assert sql(data_dir, "SELECT count(*) AS n FROM runs WHERE run_id = ?", [spooled_run]) == [{"n": 0}]

    later = factory(families=["inventory"], tasks_per_family=6, samples_per_task=1, seed=3, data_dir=str(data_dir))
    assert list((data_dir / "spool").glob("*.json")) == []
    # the spooled run's row landed behind its batch, with what that batch landed
    (row,) = sql(data_dir, "SELECT status, landed FROM runs WHERE run_id = ?", [spooled_run])
    landed = json.loads(row["landed"])
    assert row["status"] == "completed" and landed["rollouts"] == 6
    assert sql(data_dir, "SELECT count(*) AS n FROM rollouts WHERE run_id = ?", [spooled_run]) == [{"n": 6}]
    assert later["landed"]["rollouts"] == 6  # its own, not the spooled run's
    # the run that landed the spool assembled it (the spooled run's train tasks are in its GRPO set)
    # and announced its own datasets only, none of an earlier run's
    spooled_train = {r["task_id"] for r in sql(
        data_dir, "SELECT DISTINCT r.task_id FROM rollouts r JOIN tasks t USING (task_id) "
                  "WHERE r.run_id = ? AND t.split = 'train'", [spooled_run])}
    assert spooled_train
    grpo = later["datasets"]["grpo"]["dataset_id"]
    in_grpo = {r["task_id"] for r in sql(data_dir, "SELECT task_id FROM dataset_rows WHERE dataset_id = ?", [grpo])}
    assert spooled_train <= in_grpo
    assert sorted(announced) == sorted((k, d["dataset_id"], later["run"]["run_id"])
                                       for k, d in later["datasets"].items() if d["rows"])
    assert not {i for _, i, _ in announced} & earlier


def test_a_run_that_lands_nothing_new_announces_nothing_again(tmp_path, monkeypatch):
    announced = announcements(monkeypatch)
    first = factory(families=["inventory"], tasks_per_family=8, seed=5, data_dir=str(tmp_path))
    assert len(announced) == len([d for d in first["datasets"].values() if d["rows"]]) >= 2
    again = factory(families=["inventory"], tasks_per_family=8, seed=5, data_dir=str(tmp_path))
    assert again["datasets"] == first["datasets"]  # the same datasets, built again from the same rows
    assert all(v == 0 for v in again["landed"].values()) and again["announced"] == []
    assert len(announced) == len([d for d in first["datasets"].values() if d["rows"]])


def test_a_failure_at_assemble_still_records_the_run_with_its_error(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "datasets/sft.parquet")

    monkeypatch.setattr(factory_module, "assemble", broken)
    with pytest.raises(OSError, match="No space left"):
        factory(families=["inventory"], tasks_per_family=4, samples_per_task=1, seed=3, data_dir=str(tmp_path))
    (run,) = sql(tmp_path, "SELECT run_id, status, error, landed FROM runs")
    assert run["status"] == "failed"
    assert run["error"] == "OSError: [Errno 28] No space left on device: 'datasets/sft.parquet'"
    # the row is the run its landed rollouts name, with what it landed
    assert sql(tmp_path, "SELECT DISTINCT run_id FROM rollouts") == [{"run_id": run["run_id"]}]
    assert json.loads(run["landed"])["rollouts"] == 4


def test_a_failure_before_anything_landed_records_the_run_too(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the generator broke")

    monkeypatch.setattr(factory_module, "generate_tasks", broken)
    with pytest.raises(RuntimeError, match="the generator broke"):
        factory(families=["inventory"], tasks_per_family=2, samples_per_task=1, seed=3, data_dir=str(tmp_path))
    assert sql(tmp_path, "SELECT status, error, landed FROM runs") == [
        {"status": "failed", "error": "RuntimeError: the generator broke", "landed": "{}"}]


def test_one_simulator_500_during_validation_is_retried_and_the_task_validated(monkeypatch):
    from gymfoundry.tasks.stages.validate import ReplayEnvFault, validate_tasks

    task = email_task()
    failures = {"left": 1}

    def once_500(body, headers):
        if failures["left"]:
            failures["left"] -= 1
            return 500, {"error": {"message": "overloaded"}}
        return llm_customer(body, headers)

    monkeypatch.setenv("GYMFOUNDRY_USER_SIMULATOR", "llm")
    monkeypatch.setenv("GYMFOUNDRY_USER_MODEL", "stub-customer")
    with OpenAIStub(respond=once_500) as server:
        monkeypatch.setenv("GYMFOUNDRY_USER_BASE_URL", server.base_url)
        valid, rejected = validate_tasks([task])  # the default retry policy, as a factory run's
        assert (valid, rejected) == ([task], []) and failures["left"] == 0
        # a policy that retries nothing stops the run at the fault, naming the environment
        failures["left"] = 1
        with pytest.raises(ReplayEnvFault, match="user simulator"):
            validate_tasks([task], RetryPolicy(max_retries=0))


def test_the_factorys_validate_stage_uses_the_runs_retry_policy(monkeypatch):
    seen = []
    monkeypatch.setattr(factory_module, "validate_tasks", lambda tasks, retry=None: seen.append(retry) or (tasks, []))
    policy = RetryPolicy(max_retries=5, backoff_s=0)
    factory_module.validate.fn([], policy)
    assert seen == [policy]


def test_evaluation_rollouts_land_with_their_verdict_rows(tmp_path):
    from gymfoundry.flows.evaluation import evaluate

    data_dir = str(tmp_path / "data")
    factory(families=["inventory"], tasks_per_family=12, samples_per_task=1, seed=3, data_dir=data_dir)
    report = evaluate(family="inventory", data_dir=data_dir, policy="scripted", limit=3, samples_per_task=2,
                      policy_kwargs={"mistake_rate": 0.3}, reuse=False)
    assert report["landed"]["rollouts"] == report["episodes"] > 0
    rows = sql(data_dir, "SELECT r.rollout_id, r.termination AS rollout_termination, o.termination, o.verifier_id "
                         "FROM rollouts r LEFT JOIN outcomes o USING (rollout_id) "
                         "WHERE r.policy_version = ? AND r.run_id IS NULL", [report["policy_version"]])
    assert len(rows) == report["episodes"]
    assert all(r["termination"] == r["rollout_termination"] and r["verifier_id"] for r in rows), rows


def test_a_full_disk_while_the_views_are_rebuilt_reports_the_disk_not_a_missing_file(tmp_path, monkeypatch):
    from gymfoundry.envs.records import Termination
    from gymfoundry.tasks.stages.land import land_records
    from tests.warehouse.conftest import make_rollout, make_task
    from gymfoundry.warehouse import catalog

    data_dir = tmp_path / "data"
    Warehouse(data_dir).close()
    tasks = [make_task("inventory", i) for i in range(2)]
    rollouts = [make_rollout(t, seed=i, termination=Termination.success) for i, t in enumerate(tasks)]
    rebuild = catalog.rebuild_views

    def full_disk(con, data_dir, tables=None, temporary=False):
        if tables is not None and not temporary:  # the stored views, after the landing's commit
            raise OSError(errno.ENOSPC, "No space left on device")
        return rebuild(con, data_dir, tables, temporary)

    monkeypatch.setattr(catalog, "rebuild_views", full_disk)
    with pytest.raises(OSError) as raised:
        land_records(str(data_dir), tasks, [], rollouts, [])
    assert type(raised.value) is OSError and raised.value.errno == errno.ENOSPC
    monkeypatch.setattr(catalog, "rebuild_views", rebuild)
    # the batch did land (its manifest committed): the next opening rebuilds the views and shows it whole
    assert sql(data_dir, "SELECT count(*) AS n FROM rollouts") == [{"n": 2}]
    with Warehouse(data_dir, read_only=True) as wh:
        assert wh.check().success


def test_every_writers_records_spool_and_land_with_the_next_landing(tmp_path, monkeypatch):
    """Training runs and re-verified verdicts (as the train and reverify flows hand them to
    `land_or_spool`) wait in the spool while a reader holds the catalog past the wait."""
    from gymfoundry.envs.records import Termination, TrainingRun, Verdict
    from gymfoundry.tasks.stages.land import land_or_spool, land_records
    from tests.warehouse.conftest import make_rollout, make_task

    monkeypatch.setenv("GYMFOUNDRY_LOCK_WAIT_S", "0.5")
    data_dir = tmp_path / "data"
    tasks = [make_task("inventory", i) for i in range(2)]
    rollouts = [make_rollout(t, seed=i, termination=Termination.success) for i, t in enumerate(tasks)]
    land_records(str(data_dir), tasks, [], rollouts, []).checked()
    training = TrainingRun(method="sft", base_model="tiny", families=["inventory"],
                           started_at="2026-01-01T00:00:00+00:00")
    verdicts = [Verdict.of_rollout(r).model_copy(update={"source": "reverify", "verifier_version": "next"})
                for r in rollouts]
    notebook = Notebook(data_dir, tmp_path)
    try:
        spooled = [land_or_spool(str(data_dir), {"training_runs": [training]}),
                   land_or_spool(str(data_dir), {"outcomes": verdicts})]
    finally:
        notebook.close()
    assert all(s.spooled is not None and s.counts == {} for s in spooled)
    assert sql(data_dir, "SELECT count(*) AS n FROM training_runs") == [{"n": 0}]

    more = [make_task("inventory", 9)]
    landing = land_records(str(data_dir), more, [], [make_rollout(more[0], seed=9)], [])
    assert landing.drained == [s.spooled for s in spooled] and list((data_dir / "spool").glob("*.json")) == []
    with Warehouse(data_dir, read_only=True) as wh:
        assert wh.load("training_runs") == [training]
        assert sorted(v.rollout_id for v in wh.load("outcomes", "verifier_version = 'next'")) == \
            sorted(r.rollout_id for r in rollouts)
