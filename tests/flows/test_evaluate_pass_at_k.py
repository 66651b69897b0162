"""`gymfoundry evaluate --samples n` reports pass@k and pass^k for k = 1..n, the values the
warehouse's pass_at_k view gives for the landed rollouts."""

from __future__ import annotations

import pytest

from gymfoundry.flows.cli import build_parser
from gymfoundry.flows.evaluation import evaluate, render_report
from gymfoundry.flows.factory import factory
from gymfoundry.warehouse import Warehouse

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_evaluate_reports_pass_at_k_as_the_view_does(tmp_path):
    data_dir = str(tmp_path / "data")
    factory(families=["inventory"], tasks_per_family=12, seed=3, data_dir=data_dir)
    report = evaluate(family="inventory", data_dir=data_dir, policy="scripted", limit=3, samples_per_task=3,
                      policy_kwargs={"mistake_rate": 0.3})
    by_k = report["pass_at_k"]["inventory"]
    assert list(by_k) == [1, 2, 3] and report["episodes"] in (6, 9)
    for v in by_k.values():
        assert 0.0 <= v["pass^k"] <= v["pass@k"] <= 1.0
    with Warehouse(data_dir, read_only=True) as wh:
        rows = wh.sql("select k, pass_at_k, pass_hat_k from pass_at_k where task_id is not null and policy_id = ? "
                      "and policy_version = ?", [report["policy_id"], report["policy_version"]]).to_pylist()
    for k, v in by_k.items():
        of_k = [r for r in rows if r["k"] == k]
        assert v["tasks"] == len(of_k)
        assert v["pass@k"] == pytest.approx(sum(r["pass_at_k"] for r in of_k) / len(of_k), abs=1e-12)
        assert v["pass^k"] == pytest.approx(sum(r["pass_hat_k"] for r in of_k) / len(of_k), abs=1e-12)
    if report["excluded"] == 0:
        assert by_k[1]["pass@k"] == pytest.approx(report["success_rate"], abs=1e-4)
    markdown = render_report(report)
    assert "| k | pass@k | pass^k | tasks |" in markdown and "| 3 |" in markdown


def test_cli_evaluate_takes_samples():
    args = build_parser().parse_args(["evaluate", "--model", "m", "--samples", "4"])
    assert args.samples_per_task == 4
