"""The PRM flows under Prefect: `rescore` lands new versions beside the old ones, `calibrate`
fits on imported labels and later scoring runs (rescore, the factory) apply the calibrator;
and the CLI commands that drive them."""

import polars as pl
import pytest
import yaml

from gymfoundry.envs.inventory import InventoryEnv
from gymfoundry.flows.cli import main
from gymfoundry.flows.scoring import calibrate, rescore
from gymfoundry.tasks.ops.calibrate import export_label_sample, import_labels
from gymfoundry.tasks.stages.score import latest_step_rewards, newest_scores
from tests.verifiers.openai_stub import OpenAIStub
from tests.verifiers.prm_data import build_warehouse, label_sample
from gymfoundry.warehouse import Warehouse

pytestmark = pytest.mark.usefixtures("prefect_harness")

SIDE_BY_SIDE = """
    select rollout_id, step_index,
           max(score) filter (where scorer_version = ?) as old,
           max(score) filter (where scorer_version = ?) as new
    from step_scores where layer = ? group by all order by all"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, prefect_harness):
    path = tmp_path_factory.mktemp("scoring")
    build_warehouse(path, n_tasks=16, seed=5)
    return path


def versions(data_dir, layer):
    with Warehouse(data_dir, read_only=True) as wh:
        return wh.sql_df(f"select scorer_version, count(*) as n from step_scores where layer = '{layer}' "
                         "group by 1 order by 1")


def test_rescore_with_a_judge_lands_a_second_version_side_by_side(data_dir):
    before = versions(data_dir, "combined")
    assert before.height == 1 and "|judge:none|" in before["scorer_version"][0]
    steps = int(before["n"][0])

    with OpenAIStub() as server:
        report = rescore(data_dir=str(data_dir), judge_base_url=server.base_url, judge_model="stub-judge")
        # identical prompts (the same opening step of two samples of a task) are asked once
        assert 0 < report["judge"]["requests"] <= steps and report["judge"]["errors"] == 0
        again = rescore(data_dir=str(data_dir), judge_base_url=server.base_url, judge_model="stub-judge")
    assert again["landed"]["step_scores"] == 0 and again["judge"]["cache_hits"] == steps  # same versions: nothing new

    after = versions(data_dir, "combined")
    assert after.height == 2 and after["n"].to_list() == [steps, steps]
    old, new = sorted(after["scorer_version"], key=lambda v: "judge:none" not in v)
    assert "|judge:stub-judge@" in new
    with Warehouse(data_dir, read_only=True) as wh:
        pairs = wh.sql_df(SIDE_BY_SIDE, [old, new, "combined"])
        judged = wh.sql_df("select count(*) as n from step_scores where layer = 'judge' and status = 'ok' "
                           "and scorer_id = 'judge:stub-judge'")
        rewards = latest_step_rewards(wh)
        newest = newest_scores(wh, ("combined",))
    assert pairs.height == steps and pairs["old"].null_count() == pairs["new"].null_count() == 0
    assert (pairs["old"] != pairs["new"]).sum() > 0  # the judge changed rewards (layers: rules 1, judge 0.5)
    assert judged["n"][0] == steps
    assert set(newest["scorer_version"]) == {new}  # the newest run wins per step
    first = pairs.filter(pl.col("rollout_id") == pairs["rollout_id"][0]).sort("step_index")
    assert rewards[first["rollout_id"][0]] == first["new"].to_list()


def test_rescore_under_new_weights_lands_a_new_rules_version(data_dir, tmp_path):
    profile = InventoryEnv.profile.model_dump(mode="json")
    profile["score_weights"]["rules"]["progress"] = 0.5
    path = tmp_path / "inventory-halved.yaml"
    path.write_text(yaml.safe_dump(profile))
    report = rescore(data_dir=str(data_dir), profile_paths=[str(path)])
    assert report["landed"]["step_scores"] > 0
    rules = versions(data_dir, "rules")
    [new] = [v["scorer_version"] for v in report["versions"] if v["layer"] == "rules"]
    [old] = [v for v in rules["scorer_version"] if v != new]
    assert rules.height == 2 and old.split("+")[0] == new.split("+")[0]  # same rules, other weights
    with Warehouse(data_dir, read_only=True) as wh:
        pairs = wh.sql_df(SIDE_BY_SIDE, [old, new, "rules"])
    changed = pairs.filter(pl.col("old") != pl.col("new"))
    assert changed.height > 0  # the weights demonstrably change step rewards


def test_calibrate_flow_and_later_scoring_runs_use_the_calibrator(data_dir, tmp_path):
    sample = pl.read_parquet(export_label_sample(data_dir, tmp_path / "sample", n=300, seed=4)["parquet"])
    label_sample(sample, noise=0.05, seed=1).write_csv(tmp_path / "labelled.csv")
    import_labels(data_dir, tmp_path / "labelled.csv")

    reports = calibrate(data_dir=str(data_dir), holdout=0.3, min_labels=20)
    report = reports["inventory"]
    assert report["after"]["kappa"] > report["before"]["kappa"]
    assert report["after"]["accuracy"] > report["before"]["accuracy"]

    rescored = rescore(data_dir=str(data_dir))
    assert rescored["calibrators"] == {"inventory": report["version"]}
    with Warehouse(data_dir, read_only=True) as wh:
        calibrated = wh.sql_df("select distinct scorer_version from step_scores where layer = 'calibrated'")
        combined = wh.sql_df(f"""select count(*) as n from step_scores where layer = 'combined'
                                 and scorer_version like '%|cal:{report['version']}'""")
    assert calibrated["scorer_version"].to_list() == [report["version"]] and combined["n"][0] > 0

    # the factory scores new rollouts with it too
    from gymfoundry.flows.factory import factory

    with Warehouse(data_dir, read_only=True) as wh:
        known = set(wh.sql_df("select rollout_id from rollouts")["rollout_id"])
    factory(families=["inventory"], tasks_per_family=4, seed=11, data_dir=str(data_dir))
    with Warehouse(data_dir, read_only=True) as wh:
        fresh = wh.sql_df(f"select rollout_id, scorer_version from step_scores where layer = 'combined'")
    fresh = fresh.filter(~pl.col("rollout_id").is_in(list(known)))
    assert fresh.height > 0 and all(v.endswith(f"|cal:{report['version']}") for v in fresh["scorer_version"])


def test_cli_labels_calibrate_rescore(tmp_path, capsys):
    data_dir = tmp_path / "d"
    build_warehouse(data_dir, n_tasks=12, seed=8)
    out = tmp_path / "to-label"
    assert main(["labels", "export", "--data-dir", str(data_dir), "--out", str(out), "--n", "200"]) == 0
    assert "strata" in capsys.readouterr().out
    labelled = label_sample(pl.read_csv(f"{out}.csv"), noise=0.0).drop("labeller_id")
    labelled.write_csv(tmp_path / "done.csv")
    assert main(["labels", "import", str(tmp_path / "done.csv"), "--data-dir", str(data_dir),
                 "--labeller", "ann"]) == 0
    assert "labels imported" in capsys.readouterr().out
    assert main(["calibrate", "--data-dir", str(data_dir), "--min-labels", "10"]) == 0
    printed = capsys.readouterr().out
    assert "kappa before" in printed and "isotonic-" in printed
    assert main(["rescore", "--data-dir", str(data_dir)]) == 0
    printed = capsys.readouterr().out
    assert "calibrated" in printed and "new score rows" in printed
    assert main(["labels", "import", str(tmp_path / "missing.csv"), "--data-dir", str(data_dir)]) == 2
    assert "no such file" in capsys.readouterr().err
