import argparse
import base64
import io
import json
import re
from pathlib import Path

import pytest
from matplotlib.cbook import boxplot_stats
from matplotlib.image import imread
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
from prefect.context import get_run_context

from gymfoundry.envs.records import TrainingRun
from gymfoundry.flows.factory import factory
from gymfoundry.flows import report as report_module
from gymfoundry.flows.report import (PNG_SIGNATURE, TITLES, _figure, _png, charts, publish_run_artifacts,
                          publish_training_artifacts, publishing_run_artifacts, read_report, reward_boxes, reward_chart,
                          success_chart, training_chart, write_html_report)
from gymfoundry.flows.cli.report import add_report_command
from gymfoundry.warehouse import TABLES, Warehouse

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
    assert sum(b["steps"] for b in data["reward_boxes"]) == sql(data_dir, "select count(score) as n from step_scores")[0]["n"]
    assert [(b["task_family"], b["layer"]) for b in data["reward_boxes"]] == [("inventory", "combined"),
                                                                             ("inventory", "rules")]
    datasets = {d["dataset_id"] for d in report["datasets"].values()}
    assert {r["dataset_id"] for r in data["dataset_composition"]} == datasets
    assert [(r["run_id"], r["method"], r["steps"], r["final_loss"], r["heldout_success"])
            for r in data["training_runs"]] == [(sft_run.run_id, "sft", 4, 1.25, 0.25),
                                                (dpo_run.run_id, "dpo", 2, 0.5, None)]
    assert data["curves"] == {sft_run.run_id: {"loss": [tuple(p) for p in LOSS], "heldout": {1: 0.5, 2: 0.0}},
                              dpo_run.run_id: {"loss": [(1, 0.75), (2, 0.5)], "heldout": {}}}
    other = read_report(data_dir, ["coding"])
    assert all(other[name] == [] for name in TITLES) and other["reward_boxes"] == [] and other["curves"] == {}
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


def scores_by_box(data_dir):
    """Every scored step reward, per family and layer, in step order: what the chart drew from before."""
    groups = {}
    for r in sql(data_dir, "select task_family, layer, score from step_scores where score is not null "
                           "order by task_family, layer, scorer_version, rollout_id, step_index"):
        groups.setdefault((r["task_family"], r["layer"]), []).append(r["score"])
    return groups


def test_reward_boxes_are_the_statistics_of_every_step_score(run_dir):
    data_dir, _, _ = run_dir
    groups = scores_by_box(data_dir)
    with Warehouse(data_dir, read_only=True) as wh:
        boxes = reward_boxes(wh, ["inventory"])
        assert reward_boxes(wh, ["coding"]) == []
    assert [(b["task_family"], b["layer"]) for b in boxes] == list(groups)
    for box, scores in zip(boxes, groups.values()):
        expected = boxplot_stats(scores)[0]  # what ax.boxplot computed from the scores themselves
        assert box["steps"] == len(scores)
        assert [box[k] for k in ("q1", "med", "q3", "whislo", "whishi")] == \
            [expected[k] for k in ("q1", "med", "q3", "whislo", "whishi")]
        assert box["fliers"] == list(expected["fliers"]) and box["fliers"]  # same values, same order
        assert box["mean"] == pytest.approx(expected["mean"], rel=1e-12, abs=0)  # summed in another order


def test_a_score_that_is_no_finite_number_changes_no_box(run_dir, tmp_path):
    """NaN and infinities reached `step_scores` around the gates: DuckDB orders NaN above every number,
    so a NaN whisker made every score a flier. They are left out of the boxes and the fliers."""
    import shutil

    from gymfoundry.warehouse import catalog
    from gymfoundry.warehouse.lake import write_batch
    from gymfoundry.warehouse.store import _row

    data_dir, _, _ = run_dir
    copy = tmp_path / "copy"
    shutil.copytree(data_dir, copy)
    with Warehouse(copy) as wh:
        expected, before = reward_boxes(wh, ["inventory"]), wh.count("step_scores")
        template = wh.sql("select * from step_scores where layer = 'rules' limit 1").to_pylist()[0]
        rows = [{**template, "scorer_version": f"odd-{i}", "score": v}
                for i, v in enumerate([float("nan"), float("inf"), float("-inf")])]
        batch = write_batch(copy, TABLES["step_scores"], "inventory", rows)
        catalog.register(wh.con, wh.data_dir, [batch], "2026-01-01 00:00:00")
        assert wh.count("step_scores") == before + 3
        assert reward_boxes(wh, ["inventory"]) == expected


def test_reward_chart_is_the_box_plot_of_every_step_score(run_dir):
    data_dir, _, _ = run_dir
    groups = scores_by_box(data_dir)
    fig, (ax,) = _figure()  # the chart as it was drawn from every step score
    ax.boxplot(list(groups.values()), tick_labels=[f"{f}\n{layer}" for f, layer in groups], showmeans=True)
    ax.set(title="Step reward distribution by layer", xlabel="family / layer", ylabel="step score")
    ax.tick_params(axis="x", labelsize="small")
    assert reward_chart(read_report(data_dir, ["inventory"])["reward_boxes"]) == _png(fig)


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
                     "dataset-composition": "table", "training-runs": "table", "gameability-audits": "table",
                     "success-by-level-chart": "image",
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
    with pytest.raises(ValueError, match=r"no warehouse there \(no catalog.duckdb\); nothing was done"):
        args.func(args)
    assert not (tmp_path / "none").exists()


def test_the_docs_python_snippet_runs(run_dir, tmp_path, monkeypatch):
    data_dir, _, _ = run_dir
    doc = (Path(__file__).resolve().parents[2] / "docs" / "report.md").read_text()
    (snippet,) = re.findall(r"```python\n(.*?)```", doc, re.S)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".gymfoundry").symlink_to(data_dir)
    scope = {}
    exec(snippet, scope)
    assert scope["path"] == Path("report.html") and (tmp_path / "report.html").read_text().count("<img ") == 3


def test_a_factory_run_publishes_its_artifacts_before_it_ends(run_dir):
    data_dir, report, _ = run_dir
    (flow_run_id,) = {r["flow_run_id"] for r in sql(data_dir, "select distinct flow_run_id from rollouts")}
    found = {a.key: a for a in read_artifacts(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))}
    assert {"factory-report", "success-by-level", "failure-classes", "reward-by-layer", "dataset-composition",
            "gameability-audits", "success-by-level-chart", "reward-by-layer-chart"} == set(found)
    audits = json.loads(found["gameability-audits"].data)  # the run audited inventory before assembling
    assert {(r["task_family"], r["adversary"]) for r in audits} >= {("inventory", "oracle"), ("inventory", "stall")}
    assert all(r["passed"] for r in audits) and report["audits"]["inventory"]["passed"]
    png = base64.b64decode(found["reward-by-layer-chart"].data.split(",", 1)[1])
    assert png == reward_chart(read_report(data_dir, ["inventory"])["reward_boxes"])
    assert {r["dataset_id"] for r in json.loads(found["dataset-composition"].data)} == \
        {d["dataset_id"] for d in report["datasets"].values()}


@pytest.mark.parametrize("where", ["charts", "read_report"])
def test_a_failure_to_publish_fails_the_factory_run(tmp_path, monkeypatch, where):
    """Drawing or reading the report fails: the flow run fails, but the run was recorded and its
    datasets announced before (a failing read lost both: review finding)."""
    import gymfoundry.flows.factory as factory_module

    def broken(*args, **kwargs):
        raise RuntimeError("the report broke")

    announced = []
    monkeypatch.setattr(report_module, where, broken)
    monkeypatch.setattr(factory_module, "announce_dataset", lambda kind, *args: announced.append(kind))
    state = factory(families=["inventory"], tasks_per_family=4, seed=5, data_dir=str(tmp_path), return_state=True)
    assert state.is_failed()
    with pytest.raises(RuntimeError, match="the report broke"):
        state.result()
    # the run itself was recorded before: what it landed stays
    assert sql(tmp_path, "select status from runs") == [{"status": "completed"}]
    assert sorted(announced) == ["dpo", "grpo", "sft"]


def test_publishing_beside_a_body_that_raises_keeps_the_body_error(run_dir, monkeypatch, caplog):
    data_dir, _, _ = run_dir
    monkeypatch.setattr(report_module, "charts", lambda data: (_ for _ in ()).throw(RuntimeError("chart broke")))

    @flow
    def tiny():
        with publishing_run_artifacts(data_dir, ["inventory"]):
            raise ValueError("body broke")

    with pytest.raises(ValueError, match="body broke"):
        tiny()
    assert "publishing the run's artifacts failed too" in caplog.text and "chart broke" in caplog.text

    @flow
    def quiet():
        with publishing_run_artifacts(data_dir, ["inventory"]) as published:
            pass
        return published

    with pytest.raises(RuntimeError, match="chart broke"):
        quiet()
