import json
from pathlib import Path

import datasets
import pytest

from gymfoundry.flows.cli import main
from gymfoundry.flows.factory import factory
from gymfoundry.warehouse import Warehouse

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, prefect_harness):
    data_dir = tmp_path_factory.mktemp("factory")
    report = factory(families=["inventory"], tasks_per_family=20, seed=1, data_dir=str(data_dir))
    return data_dir, report


def counts(data_dir):
    with Warehouse(data_dir, read_only=True) as wh:
        return {t: wh.sql(f"select count(*) as n from {t}").to_pylist()[0]["n"]
                for t in ("tasks", "rollouts", "steps", "step_scores", "task_rejections")}


def test_factory_lands_a_mix_of_outcomes_partitioned_by_family(run_dir):
    data_dir, report = run_dir
    n = counts(data_dir)
    assert n["tasks"] + n["task_rejections"] == 20
    # every step: a rules row, a judge row (not configured here) and the combined reward
    assert n["rollouts"] == 2 * n["tasks"] and 3 * n["steps"] == n["step_scores"] and n["steps"] > n["rollouts"]
    terminations = {r["termination"] for r in report["summary"]}
    assert "success" in terminations and len(terminations) >= 2
    files = list((Path(data_dir) / "lake" / "rollouts").rglob("*.parquet"))
    assert files and all(f.parent.name == "task_family=inventory" for f in files)


def test_rerunning_with_the_same_inputs_lands_nothing(run_dir):
    data_dir, _ = run_dir
    before = counts(data_dir)
    files_before = sorted(Path(data_dir).rglob("*.parquet"))
    report = factory(families=["inventory"], tasks_per_family=20, seed=1, data_dir=str(data_dir))
    assert all(v == 0 for v in report["landed"].values())
    assert counts(data_dir) == before and sorted(Path(data_dir).rglob("*.parquet")) == files_before


def test_batch_size_changes_no_id(run_dir, tmp_path):
    """The run_dir run chose its batch size (4 batches of 5 on 2 cores); 7 batches of 3 land the
    same rows and assemble the same datasets (ids are content hashes; episode seeds come from the
    task)."""
    data_dir, report = run_dir
    again = factory(families=["inventory"], tasks_per_family=20, seed=1, batch_size=3, data_dir=str(tmp_path))
    assert counts(tmp_path) == counts(data_dir) and again["landed"] == report["landed"]
    assert {k: d["dataset_id"] for k, d in again["datasets"].items()} == \
        {k: d["dataset_id"] for k, d in report["datasets"].items()}


@pytest.mark.parametrize("tasks, workers, given, size", [
    (1000, 2, None, 250),   # 4 batches: two per worker
    (20, 2, None, 5),
    (10, 2, None, 3),       # 3, 3, 3, 1
    (3, 16, None, 1),       # never an empty batch
    (5000, 2, None, 500),   # at most 500 tasks a batch: 10 batches
    (5000, 2, 25, 25),      # --batch-size wins
])
def test_batch_size_is_chosen_from_the_work(tasks, workers, given, size):
    from gymfoundry.flows.factory import batch_size_for

    assert batch_size_for(tasks, workers, given) == size


def test_records_flow_unchanged_into_the_datasets(run_dir):
    data_dir, report = run_dir
    sft = datasets.Dataset.from_parquet(report["datasets"]["sft"]["path"])
    dpo = datasets.Dataset.from_parquet(report["datasets"]["dpo"]["path"])
    assert len(sft) == report["datasets"]["sft"]["rows"] > 0 and len(dpo) > 0
    with Warehouse(data_dir, read_only=True) as wh:
        row = sft[0]
        (rollout,) = wh.load_rollouts(f"rollout_id = '{row['rollout_id']}'")
        assert rollout.termination == "success"
        (task,) = wh.load_tasks(f"task_id = '{rollout.task_id}'")
    assert task.split == "train"
    assistant = [m for m in row["messages"] if m["role"] == "assistant"]
    assert len(assistant) == len(rollout.steps) == len(row["step_rewards"])
    for message, step in zip(assistant, rollout.steps):
        if step.tool_call:
            call = message["tool_calls"][0]["function"]
            assert call["name"] == step.tool_call.name and json.loads(call["arguments"]) == step.tool_call.arguments
    assert row["messages"][1]["content"] == rollout.steps[0].observation
    assert {t["function"]["name"] for t in json.loads(row["tools"])} == set(task.allowed_tools)
    for pair in dpo:
        assert pair["chosen"] != pair["rejected"] and pair["prompt"][1]["role"] == "user"


def test_cli_run_and_sql(tmp_path, capsys):
    data_dir = str(tmp_path / "d")
    assert main(["run", "--families", "inventory", "--tasks", "10", "--seed", "2", "--data-dir", data_dir]) == 0
    assert "rollouts by family and termination" in capsys.readouterr().out
    assert main(["sql", "--data-dir", data_dir, "select termination, count(*) as n from rollouts group by 1"]) == 0
    out = capsys.readouterr().out
    assert "termination" in out and "success" in out
    query = "select count(*) as n, min(task_family) as family from rollouts"
    assert main(["sql", "--data-dir", data_dir, "--format", "csv", query]) == 0
    assert capsys.readouterr().out == "n,family\n20,inventory\n"
    assert main(["sql", "--data-dir", data_dir, "--format", "json", query]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 20, "family": "inventory"}]
    assert main(["sql", "--data-dir", data_dir, "select * from no_such_table"]) == 1
    assert "error" in capsys.readouterr().err


def test_task_runner_choice():
    from prefect.task_runners import ThreadPoolTaskRunner

    from gymfoundry.flows.factory import make_task_runner

    assert isinstance(make_task_runner("threads"), ThreadPoolTaskRunner)
    with pytest.raises(ValueError, match="unknown task runner"):
        make_task_runner("spark")
    with pytest.raises(ValueError, match="the threads task runner takes no cluster address"):
        make_task_runner("threads", address="tcp://127.0.0.1:8786")
    from prefect_dask import DaskTaskRunner  # the dev extra has it (tests/flows/test_dask_runner.py runs it)

    remote, local = make_task_runner("dask", address="tcp://127.0.0.1:8786"), make_task_runner("dask")
    assert isinstance(remote, DaskTaskRunner) and (remote.address, local.address) == ("tcp://127.0.0.1:8786", None)
    try:
        import prefect_ray  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match=r"pip install -e '\.\[ray\]'"):
            make_task_runner("ray")


def test_the_family_subflow_is_tagged_its_task_runs_are_not(run_dir):
    """Prefect asks its server for a concurrency slot for every tagged task run (seconds per run
    under load), so the family's tag marks its subflow run only."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId

    data_dir, _ = run_dir
    with Warehouse(data_dir, read_only=True) as wh:
        (parent,) = [r["flow_run_id"] for r in wh.sql("select distinct flow_run_id from rollouts").to_pylist()]
    with get_client(sync_client=True) as client:
        (family,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent])))
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[family.id])))
    assert family.name == "inventory" and "family:inventory" in family.tags
    names = {r.name for r in runs}
    assert {"inventory · generate", "inventory · score"} <= names and any(n.startswith("inventory · rollout 1/")
                                                                         for n in names)
    assert [r.tags for r in runs] == [[]] * len(runs)


def test_family_runs_hand_their_output_over_before_their_runs_close():
    """The factory lands a family's records while Prefect still closes its subflow run; the
    block's exit waits for every run and raises what a run raised after its hand-off."""
    import threading

    from gymfoundry.flows.factory import _family_runs, _handoff

    from prefect.utilities.annotations import quote

    closing, landed = threading.Event(), threading.Event()

    def pipeline(family, data_dir, **options):
        _handoff.get().set_result({"family": family, **options})
        assert landed.wait(10), "the body did not run while the subflow was still open"
        closing.set()
        if family == "b":
            raise RuntimeError(f"{family}: closing the run failed")
        return quote({})

    with pytest.raises(RuntimeError, match="b: closing the run failed"):
        with _family_runs(pipeline, ["a", "b"], "dir", {"seed": 3}) as outs:
            assert outs == [{"family": "a", "seed": 3}, {"family": "b", "seed": 3}]
            assert not closing.is_set()
            landed.set()
    assert closing.is_set()


def test_a_family_that_fails_before_its_hand_off_fails_the_block():
    from gymfoundry.flows.factory import _family_runs

    def pipeline(family, data_dir, **options):
        raise ValueError(f"{family} broke")

    with pytest.raises(ValueError, match="a broke"):
        with _family_runs(pipeline, ["a"], "dir", {}):
            pytest.fail("the body ran without the family's output")


def test_the_family_subflow_hands_over_what_it_returns(tmp_path):
    from concurrent.futures import Future

    from gymfoundry.flows.factory import _handoff, family_pipeline

    handoff = Future()
    token = _handoff.set(handoff)
    try:
        out = family_pipeline("inventory", 3, 0, "scripted", None, 2, data_dir=str(tmp_path)).unquote()
    finally:
        _handoff.reset(token)
    assert handoff.result(timeout=0) is out
    assert (len(out["tasks"]), len(out["rollouts"]), out["error"]) == (3, 6, None)


def test_a_family_subflow_that_fails_after_its_hand_off_lands_nothing(tmp_path, monkeypatch):
    """The factory stages while the subflow runs close, and lands only once all ended well: a run
    that fails after handing its output over leaves no rows but its failed `runs` row."""
    import gymfoundry.flows.factory as ff

    hand_over = ff._hand_over

    def then_fail(out):
        hand_over(out)
        raise RuntimeError("the subflow failed after its hand-off")

    monkeypatch.setattr(ff, "_hand_over", then_fail)
    with pytest.raises(RuntimeError, match="failed after its hand-off"):
        factory(families=["inventory"], tasks_per_family=3, seed=0, data_dir=str(tmp_path))
    with Warehouse(tmp_path, read_only=True) as wh:
        assert {t: wh.count(t) for t in ("tasks", "rollouts", "steps")} == {"tasks": 0, "rollouts": 0, "steps": 0}
        assert [(r.status, r.error, r.landed) for r in wh.load("runs")] == \
            [("failed", "RuntimeError: the subflow failed after its hand-off", {})]
    assert [p for p in (tmp_path / "incoming").rglob("*") if p.is_file()] == []
