import argparse
import base64
import io
import json
import re
from pathlib import Path

import pytest
from matplotlib.image import imread
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
from prefect.context import get_run_context

from envs.records import TrainingRun
from flows.factory import factory
from flows.report import (PNG_SIGNATURE, TITLES, charts, publish_run_artifacts, publish_training_artifacts,
                          read_report, reward_chart, success_chart, training_chart, write_html_report)
from flows.report_cli import add_report_command
from warehouse import TABLES, Warehouse

pytestmark = pytest.mark.usefixtures("prefect_harness")

LOSS = [[1, 2.0], [2, 1.75], [3, 1.5], [4, 1.25]]
SIZE = (350, 600)  # FIGSIZE x DPI, in pixels (rows, columns)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, prefect_harness):
    """A small factory run and two training runs (one evaluated on held-out tasks, one not), landed
    without training a model."""
    data_dir = tmp_path_factory.mktemp("report")
    report = factory(families=["inventory"], tasks_per_family=12, seed=3, data_dir=str(data_dir))
    sft = report["datasets"]["sft"]["dataset_id"]
    runs = [TrainingRun(method="sft", base_model="tiny", dataset_id=sft, families=["inventory"],
                        metrics={"steps": 4, "final_loss": 1.25, "loss_history": LOSS,
                                 "heldout": {"success_rate": 0.25, "by_level": {"2": 0.0, "1": 0.5}}},
                        started_at="2026-01-01T00:00:00"),
            TrainingRun(method="dpo", base_model="tiny", families=["inventory"], started_at="2026-01-02T00:00:00",
                        metrics={"steps": 2, "final_loss": 0.5, "loss_history": [[1, 0.75], [2, 0.5]]})]
    with Warehouse(data_dir) as wh:
        wh.land_rows({"training_runs": [TABLES["training_runs"].row(r) for r in runs]}).checked()
    return data_dir, report, runs


def sql(data_dir, query, params=None):
    with Warehouse(data_dir, read_only=True) as wh:
        return wh.sql(query, params).to_pylist()


def test_tables_are_the_views_of_the_families(run_dir):
    data_dir, report, (sft_run, dpo_run) = run_dir
    data = read_report(data_dir, ["inventory"])
    assert data["success_by_level"] == sql(data_dir, "select * from success_by_cell order by task_family, policy_id, "
                                                     "policy_version, difficulty_level")
    assert data["failure_classes"] == sql(data_dir, "select * from failure_classes order by all")
    assert data["reward_by_layer"] == sql(data_dir, "select * from reward_by_layer order by task_family, layer")
    assert data["dataset_composition"] == sql(data_dir, "select * from dataset_composition order by kind, dataset_id, "
                                                        "difficulty")
    rollouts = sql(data_dir, "select count(*) as n from rollouts")[0]["n"]
    assert sum(r["rollouts"] for r in data["success_by_level"]) == sum(r["rollouts"] for r in data["failure_classes"]) \
        == rollouts == data["counts"]["rollouts"] > 0
    assert {"rules", "combined"} <= {r["layer"] for r in data["reward_by_layer"]}
    assert len(data["step_scores"]) == sql(data_dir, "select count(score) as n from step_scores")[0]["n"]
    datasets = {d["dataset_id"] for d in report["datasets"].values()}
    assert {r["dataset_id"] for r in data["dataset_composition"]} == datasets
    assert [(r["run_id"], r["method"], r["steps"], r["final_loss"], r["heldout_success"])
            for r in data["training_runs"]] == [(sft_run.run_id, "sft", 4, 1.25, 0.25),
                                                (dpo_run.run_id, "dpo", 2, 0.5, None)]
    assert data["curves"] == {sft_run.run_id: {"loss": [tuple(p) for p in LOSS], "heldout": {1: 0.5, 2: 0.0}},
                              dpo_run.run_id: {"loss": [(1, 0.75), (2, 0.5)], "heldout": {}}}
    other = read_report(data_dir, ["coding"])
    assert all(other[name] == [] for name in TITLES) and other["step_scores"] == [] and other["curves"] == {}
    sft = report["datasets"]["sft"]["dataset_id"]
    only = read_report(data_dir, ["inventory"], dataset_ids=[sft])["dataset_composition"]
    assert only == [r for r in data["dataset_composition"] if r["dataset_id"] == sft] and only


def assert_png(png):
    assert png.startswith(PNG_SIGNATURE)
    assert imread(io.BytesIO(png), format="png").shape == (*SIZE, 4)


def test_charts_are_deterministic_pngs_of_the_set_size(run_dir):
    data_dir, _, _ = run_dir
    drawn = charts(read_report(data_dir))
    assert set(drawn) == {"success-by-level", "reward-by-layer", "training"}
    for png in drawn.values():
        assert_png(png)
    assert charts(read_report(data_dir)) == drawn
    assert success_chart([]) is None and reward_chart([]) is None and training_chart({}) is None
    assert training_chart({"r": {"loss": [], "heldout": {}}}) is None
    assert_png(training_chart({"r": {"loss": [], "heldout": {1: 1.0}}}))  # evaluated, no loss logged


def test_html_report_is_self_contained(run_dir, tmp_path):
    data_dir, report, (sft_run, _) = run_dir
    out = write_html_report(data_dir, tmp_path / "sub" / "r.html")
    text = out.read_text()
    images = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(images) == 3 == text.count("<img ")
    for image in images:
        assert_png(base64.b64decode(image))
    for needle in ("http://", "https://", 'src="//', "<script", "<link", "url("):
        assert needle not in text
    assert f"<code>{data_dir.resolve()}</code>" in text
    assert all(title in text for title in TITLES.values())
    assert text.count("<table>") == len(TITLES)
    assert all(f"<td>{d['dataset_id']}</td>" in text for d in report["datasets"].values())
    assert f"<td>{sft_run.run_id}</td>" in text and '<td class="num">1.25</td>' in text


def read_artifacts(**filters):
    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(**filters))


def test_artifacts_of_a_flow_run(run_dir):
    data_dir, report, (sft_run, _) = run_dir

    @flow
    def tiny():
        return (str(get_run_context().flow_run.id), publish_run_artifacts(data_dir, ["inventory"], run_id="run-x"),
                publish_training_artifacts(data_dir, sft_run.run_id))

    flow_run_id, run_ids, training_ids = tiny()
    found = {a.key: a for a in read_artifacts(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))}
    types = {key: a.type for key, a in found.items()}
    assert types == {"success-by-level": "table", "failure-classes": "table", "reward-by-layer": "table",
                     "dataset-composition": "table", "training-runs": "table", "success-by-level-chart": "image",
                     "reward-by-layer-chart": "image", "training-chart": "image",
                     "training-run": "table", "training-run-chart": "image"}
    assert {**run_ids, **training_ids} == {key: str(a.id) for key, a in found.items()}
    data = read_report(data_dir, ["inventory"])
    for key, a in found.items():
        if a.type == "image":
            assert a.data.startswith("data:image/png;base64,")
            assert_png(base64.b64decode(a.data.split(",", 1)[1]))
        elif key != "training-run":
            assert json.loads(a.data) == data[key.replace("-", "_")]
    assert [r["run_id"] for r in json.loads(found["training-run"].data)] == [sft_run.run_id]
    assert found["success-by-level"].description == f"Factory run run-x: {TITLES['success_by_level']}"


def test_outside_a_flow_run_nothing_is_published(run_dir):
    data_dir, _, (sft_run, _) = run_dir
    before = len(read_artifacts(key=ArtifactFilterKey(any_=["failure-classes", "training-run"])))
    assert publish_run_artifacts(data_dir, ["inventory"]) == {}
    assert publish_training_artifacts(data_dir, sft_run.run_id) == {}
    assert len(read_artifacts(key=ArtifactFilterKey(any_=["failure-classes", "training-run"]))) == before


def test_report_command(run_dir, tmp_path, capsys):
    data_dir, _, _ = run_dir
    parser = argparse.ArgumentParser()
    add_report_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", "--data-dir", str(data_dir)])
    assert args.func(args) == 0
    default = data_dir / "reports" / "report.html"
    assert capsys.readouterr().out.strip() == str(default) and default.read_text().count("<img ") == 3
    args = parser.parse_args(["report", "--data-dir", str(data_dir), "--out", str(tmp_path / "x.html")])
    assert args.func(args) == 0 and capsys.readouterr().out.strip() == str(tmp_path / "x.html")
    args = parser.parse_args(["report", "--data-dir", str(tmp_path / "none")])
    with pytest.raises(FileNotFoundError, match="no warehouse catalog"):
        args.func(args)


def test_the_docs_python_snippet_runs(run_dir, tmp_path, monkeypatch):
    data_dir, _, _ = run_dir
    doc = (Path(__file__).resolve().parents[2] / "docs" / "report.md").read_text()
    (snippet,) = re.findall(r"```python\n(.*?)```", doc, re.S)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".gymfoundry").symlink_to(data_dir)
    scope = {}
    exec(snippet, scope)
    assert scope["path"] == Path("report.html") and (tmp_path / "report.html").read_text().count("<img ") == 3
