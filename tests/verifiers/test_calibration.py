"""PRM layer 3: calibrators (fit, store, apply), agreement, and the label export / import / fit
workflow on a small landed warehouse (plain functions; the Prefect flows are in tests/flows)."""

import json

import numpy as np
import polars as pl
import pytest

from gymfoundry.envs.inventory import InventoryEnv
from gymfoundry.envs.records import StepScore
from gymfoundry.tasks.ops.calibrate import export_label_sample, fit_calibrators, import_labels, load_labels, stratified_sample
from gymfoundry.tasks.stages.score import score_steps
from tests.verifiers.prm_data import build_warehouse, distorted_label, label_sample
from gymfoundry.verifiers.calibration import (Calibrator, agreement, fit_calibrator, load_current, save_calibrator,
                                   to_labels)
from gymfoundry.verifiers.judge import JudgeSettings
from gymfoundry.verifiers.prm import combine

RNG = np.random.default_rng(0)


def synthetic(n, noise=0.1):
    progress = RNG.uniform(-0.4, 0.9, n)
    labels = np.array([distorted_label(p) for p in progress])
    flip = RNG.random(n) < noise
    labels[flip] = RNG.choice([-1, 0, 1], flip.sum())
    return progress, labels


def test_isotonic_breakpoints_reproduce_sklearn_and_survive_json():
    from sklearn.isotonic import IsotonicRegression

    x, y = synthetic(400)
    calibrator = fit_calibrator(x, y, "inventory", "isotonic")
    model = IsotonicRegression(y_min=-1, y_max=1, out_of_bounds="clip").fit(x, y)
    probe = np.linspace(-1.2, 1.2, 97)
    assert np.allclose(calibrator.apply(probe), model.predict(probe))
    again = Calibrator.model_validate_json(calibrator.model_dump_json())
    assert np.allclose(again.apply(probe), calibrator.apply(probe))
    assert np.all(np.diff(calibrator.apply(probe)) >= 0) and calibrator.apply(probe).max() <= 1.0


def test_logistic_calibrator_is_the_expected_label_of_sklearn_probabilities():
    from sklearn.linear_model import LogisticRegression

    x, y = synthetic(400)
    calibrator = fit_calibrator(x, y, "inventory", "logistic")
    model = LogisticRegression(C=10.0, max_iter=1000).fit(x[:, None], y)
    probe = np.linspace(-1, 1, 41)
    assert np.allclose(calibrator.apply(probe), model.predict_proba(probe[:, None]) @ model.classes_)
    binary = fit_calibrator(x, (y > 0).astype(int), "inventory", "logistic")  # two classes: 0 and 1
    model = LogisticRegression(C=10.0, max_iter=1000).fit(x[:, None], (y > 0).astype(int))
    assert np.allclose(binary.apply(probe), model.predict_proba(probe[:, None])[:, 1])


@pytest.mark.parametrize("kind", ["isotonic", "logistic"])
def test_calibration_raises_agreement_with_held_out_labels(kind):
    x, y = synthetic(600)
    train, test = slice(0, 400), slice(400, 600)
    calibrator = fit_calibrator(x[train], y[train], "inventory", kind)
    before, after = agreement(x[test], y[test]), agreement(calibrator.apply(x[test]), y[test])
    assert after["kappa"] > before["kappa"] + 0.2 and after["accuracy"] > before["accuracy"] + 0.15
    assert after["spearman"] > 0.5 and before["n"] == after["n"] == 200


def test_agreement_and_fit_edge_cases():
    assert list(to_labels([-0.7, -0.4, 0.49, 0.51, 3])) == [-1, 0, 0, 1, 1]
    assert agreement([], [])["kappa"] is None
    assert agreement([0.0, 0.0], [1, -1])["spearman"] is None  # constant scores: undefined, not NaN
    with pytest.raises(ValueError, match="two labels"):
        fit_calibrator([0.1, 0.2], [1, 1], "inventory")
    with pytest.raises(ValueError, match="-1, 0 or 1"):
        fit_calibrator([0.1, 0.2], [2, 0], "inventory")
    with pytest.raises(ValueError, match="unknown calibrator kind"):
        fit_calibrator([0.1, 0.2], [1, 0], "inventory", kind="magic")


def test_calibrators_are_stored_with_a_version_and_a_current_pointer(tmp_path):
    x, y = synthetic(200)
    first = fit_calibrator(x, y, "inventory", "isotonic")
    assert first.version.startswith("isotonic-") and fit_calibrator(x, y, "inventory").version == first.version
    assert load_current(tmp_path, "inventory") is None
    path = save_calibrator(tmp_path, first)
    assert path == tmp_path / "calibrators" / "inventory" / f"{first.version}.json"
    assert json.loads(path.read_text())["x"] == first.x  # plain JSON, no pickle
    second = fit_calibrator(x, -y, "inventory", "logistic")
    save_calibrator(tmp_path, second)
    assert load_current(tmp_path, "inventory").version == second.version


def test_combine_applies_the_family_calibrator():
    profiles = {"inventory": InventoryEnv.profile}
    rules = [StepScore(rollout_id="r", step_index=i, layer="rules", scorer_id="rules", scorer_version="2+wx", score=s)
             for i, s in enumerate([0.0, 0.2, 0.7])]
    plain = combine(rules, [], profiles, {"r": "inventory"})
    assert [s.score for s in plain] == [0.0, 0.2, 0.7] and {s.layer for s in plain} == {"combined"}
    calibrator = Calibrator(version="isotonic-test", family="inventory", kind="isotonic", x=[0.0, 0.2], y=[0.0, 1.0])
    out = combine(rules, [], profiles, {"r": "inventory"}, {"inventory": calibrator})
    combined = [s for s in out if s.layer == "combined"]
    calibrated = [s for s in out if s.layer == "calibrated"]
    assert [s.score for s in combined] == [s.score for s in calibrated] == [0.0, 1.0, 1.0]
    assert all(s.scorer_version == "isotonic-test" and s.scorer_id == "calibrator:inventory" for s in calibrated)
    assert all(s.scorer_version.endswith("|cal:isotonic-test") for s in combined)
    assert [s.components["raw"] for s in combined] == [0.0, 0.2, 0.7]


# -- the workflow on a landed warehouse ----------------------------------------------------------

@pytest.fixture(scope="module")
def landed(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("prm")
    return data_dir, build_warehouse(data_dir)


def test_export_is_a_stratified_sample_with_context(landed, tmp_path):
    data_dir, built = landed
    out = export_label_sample(data_dir, tmp_path / "sample", n=60, seed=1)
    csv, parquet = pl.read_csv(out["csv"]), pl.read_parquet(out["parquet"])
    assert out["rows"] == csv.height == parquet.height == 60
    assert set(csv["sample_id"]) == set(parquet["sample_id"])
    for column in ("goal", "history", "thought", "action", "observation", "termination", "score_bucket",
                   "rules_score", "combined_score", "label", "labeller_id"):
        assert column in csv.columns
    assert csv["label"].null_count() == 60 and csv["goal"].null_count() == 0
    # every stratum is represented before any stratum gets a second step
    strata = parquet.group_by("task_family", "score_bucket", "termination").len()
    assert out["strata"] == strata.height >= 4
    # the hidden fields never reach a labeller
    secrets = {s for t in built["tasks"] for s in t.hidden.secrets}
    text = out and open(out["csv"]).read()
    assert not any(secret in text for secret in secrets)


def test_stratified_sample_covers_rare_strata_first():
    frame = pl.DataFrame({"sample_id": [f"s{i}" for i in range(103)], "task_family": ["inventory"] * 103,
                          "score_bucket": ["a"] * 100 + ["b", "c", "d"], "termination": ["success"] * 103})
    sample = stratified_sample(frame, 6, seed=0)
    assert sorted(sample["score_bucket"]) == ["a", "a", "a", "b", "c", "d"]
    assert stratified_sample(frame, 6, seed=0).equals(sample)


def test_import_checks_labels(landed, tmp_path):
    data_dir, _ = landed
    sample = pl.read_parquet(export_label_sample(data_dir, tmp_path / "s", n=10)["parquet"])
    bad = sample.with_columns(label=pl.lit("2"), labeller_id=pl.lit("ann"))
    bad.write_csv(tmp_path / "bad.csv")
    with pytest.raises(ValueError, match="not -1, 0 or \\+1"):
        import_labels(data_dir, tmp_path / "bad.csv")
    anonymous = sample.with_columns(label=pl.lit("1"))
    anonymous.write_csv(tmp_path / "anon.csv")
    with pytest.raises(ValueError, match="labeller"):
        import_labels(data_dir, tmp_path / "anon.csv")
    ghost = sample.head(1).with_columns(rollout_id=pl.lit("r-nope"), label=pl.lit("0"), labeller_id=pl.lit("ann"))
    ghost.write_csv(tmp_path / "ghost.csv")
    with pytest.raises(ValueError, match="no landed step"):
        import_labels(data_dir, tmp_path / "ghost.csv")
    assert load_labels(data_dir).height == 0  # nothing of a bad file is stored


def test_labels_fit_a_calibrator_that_later_scoring_applies(landed, tmp_path):
    data_dir, built = landed
    sample = pl.read_parquet(export_label_sample(data_dir, tmp_path / "batch", n=400, seed=2)["parquet"])
    labelled = label_sample(sample, noise=0.1, seed=3)
    half = labelled.height // 2
    labelled.head(half).write_csv(tmp_path / "part1.csv")
    labelled.tail(labelled.height - half).drop("labeller_id").write_parquet(tmp_path / "part2.parquet")
    first = import_labels(data_dir, tmp_path / "part1.csv")
    assert first["imported"] == half and first["labellers"] == ["synthetic-1"]
    assert import_labels(data_dir, tmp_path / "part1.csv")["path"] == first["path"]  # idempotent
    import_labels(data_dir, tmp_path / "part2.parquet", labeller_id="synthetic-2")
    assert load_labels(data_dir).height == labelled.height

    reports = fit_calibrators(data_dir, judge=JudgeSettings(), holdout=0.3, seed=0)
    report = reports["inventory"]
    assert report["n_holdout"] > 30 and report["n_train"] > report["n_holdout"]
    assert report["after"]["kappa"] > report["before"]["kappa"] + 0.1
    assert report["after"]["accuracy"] > report["before"]["accuracy"] + 0.1
    assert load_current(data_dir, "inventory").version == report["version"]

    # a later scoring run applies it, and says so on every new score
    run = score_steps(built["rollouts"][:4], built["tasks"], data_dir, JudgeSettings())
    calibrated = [s for s in run.scores if s.layer == "calibrated"]
    combined = [s for s in run.scores if s.layer == "combined"]
    assert calibrated and {s.scorer_version for s in calibrated} == {report["version"]}
    assert all(s.scorer_version.endswith(f"|cal:{report['version']}") for s in combined)
    assert run.calibrators == {"inventory": report["version"]}
    progress_steps = [s for s in combined if s.components["raw"] == 0.2]
    assert progress_steps and all(s.score > 0.5 for s in progress_steps)  # an authorisation is a good step
