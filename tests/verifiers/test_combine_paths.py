"""`combine` takes a shortcut for steps the judge was not asked about (no endpoint): every row it
makes is the one the general path made before the shortcut (the function below is that code),
for rule scores of every kind, signed zeros included, beside judged and withheld steps."""

from __future__ import annotations

import json

from gymfoundry.envs.profile import DomainProfile
from gymfoundry.envs.records import StepScore
from gymfoundry.verifiers.prm import JUDGE_FLOOR, PRM_VERSION, combine, injection_starts, judge_label, layers_version


def reference_row(**fields) -> StepScore:
    return StepScore(**fields)


def reference_combine(rule_scores: list[StepScore], judge_scores: list[StepScore], profiles: dict[str, DomainProfile],
            family_of: dict[str, str], calibrators: dict[str, Calibrator] | None = None) -> list[StepScore]:
    """The `calibrated` and `combined` rows for every step that has a rule score."""
    calibrators = calibrators or {}
    judged = {(s.rollout_id, s.step_index): s for s in judge_scores}
    first_injection = injection_starts(rule_scores)
    layer_versions = {family: layers_version(profile) for family, profile in profiles.items()}
    raw_rows = []
    for rules in rule_scores:
        family = family_of[rules.rollout_id]
        weights = profiles[family].score_weights.layers
        judge = judged.get((rules.rollout_id, rules.step_index))
        withheld = (judge is not None and judge.status in ("ok", "error")
                    and rules.step_index >= first_injection.get(rules.rollout_id, rules.step_index + 1))
        judge_score = JUDGE_FLOOR if withheld else (judge.score if judge and judge.status == "ok" else None)
        parts = {"rules": (weights.get("rules", 0.0), rules.score if rules.status == "ok" else None),
                 "judge": (weights.get("judge", 0.0), judge_score)}
        used = {name: (w, s) for name, (w, s) in parts.items() if w > 0 and s is not None}
        total = sum(w for w, _ in used.values())
        raw = sum(w * s for w, s in used.values()) / total if total else None
        components = {**{name: s for name, (_, s) in used.items()}, **{f"w_{name}": w for name, (w, _) in used.items()}}
        if withheld and "judge" in used:
            components["judge_withheld"] = 1.0
        label = judge_label(judge, weights.get("judge", 0.0), withheld)
        version = f"prm{PRM_VERSION}|rules:{rules.scorer_version}|judge:{label}|layers:{layer_versions[family]}"
        raw_rows.append((rules, family, raw, components, version))

    out = []
    for family in sorted({family for _, family, *_ in raw_rows}):
        rows = [r for r in raw_rows if r[1] == family]
        calibrator = calibrators.get(family)
        calibrated = calibrator.apply([r[2] if r[2] is not None else 0.0 for r in rows]) if calibrator else None
        for i, (rules, _, raw, components, version) in enumerate(rows):
            key = {"rollout_id": rules.rollout_id, "step_index": rules.step_index}
            if raw is None:
                out.append(StepScore(**key, layer="combined", scorer_id="prm", scorer_version=version + "|cal:none",
                                     status="not_configured", components=components,
                                     rationale="no layer with a positive weight scored this step"))
                continue
            reward, cal_label = raw, "none"
            if calibrated is not None:
                reward, cal_label = round(float(calibrated[i]), 6), calibrator.version
                out.append(StepScore(**key, layer="calibrated", scorer_id=f"calibrator:{family}",
                                     scorer_version=calibrator.version, score=reward,
                                     components={"raw": round(raw, 6)}))
                components = {**components, "calibrated": reward}
            out.append(reference_row(**key, layer="combined", scorer_id="prm", scorer_version=f"{version}|cal:{cal_label}",
                                  status="ok", score=round(float(reward), 6),
                                  components={**components, "raw": round(raw, 6)}, rationale=None))
    return out




def profile(rules: float, judge: float) -> DomainProfile:
    return DomainProfile.model_validate({"name": "p", "tools": [], "score_weights": {
        "layers": {"rules": rules, "judge": judge}, "rules": {"progress": 1.0}}})


def rule(rollout: str, index: int, score: float | None, status: str = "ok", injected: bool = False) -> StepScore:
    return StepScore(rollout_id=rollout, step_index=index, layer="rules", scorer_id="rules", scorer_version="5+wabc",
                     status=status, score=score, components={"injection_attempt": -1.0 if injected else 0.0})


def judged(rollout: str, index: int, status: str, score: float | None = None) -> StepScore:
    return StepScore(rollout_id=rollout, step_index=index, layer="judge", scorer_id="judge:m", scorer_version="j1",
                     status=status, score=score)


def dumped(rows: list[StepScore]) -> str:
    return json.dumps([r.model_dump(mode="json") for r in rows])


RULES = [rule("a", 0, 0.25), rule("a", 1, -0.0), rule("a", 2, 0.0), rule("a", 3, -0.7), rule("a", 4, None, "error"),
         rule("b", 0, 1.0), rule("b", 1, 0.1, injected=True), rule("b", 2, 0.3), rule("c", 0, -1.0), rule("c", 1, 0.5)]
JUDGE = [judged("a", 0, "not_configured"), judged("a", 1, "not_configured"), judged("b", 0, "ok", 0.5),
         judged("b", 1, "ok", 1.0), judged("b", 2, "error"), judged("c", 0, "not_configured")]


def test_every_row_is_the_general_paths_row():
    for weights in [(1.0, 0.0), (0.6, 0.4), (0.0, 1.0), (0.0, 0.0), (2.0, 1.0)]:
        profiles = {"f": profile(*weights), "g": profile(1.0, 0.5)}
        family_of = {"a": "f", "b": "f", "c": "g"}
        for judge in (JUDGE, [], [j for j in JUDGE if j.status == "not_configured"]):
            got, expected = combine(RULES, judge, profiles, family_of), reference_combine(RULES, judge, profiles, family_of)
            assert dumped(got) == dumped(expected), (weights, len(judge))


def test_a_negative_zero_rule_score_is_combined_as_the_sum_made_it():
    rows = combine([rule("a", 0, -0.0)], [], {"f": profile(1.0, 0.0)}, {"a": "f"})
    assert json.dumps(rows[0].score) == "0.0" and rows[0].components == {"rules": -0.0, "w_rules": 1.0, "raw": 0.0}


def test_with_a_calibrator_the_rows_are_the_general_paths_too():
    class Half:  # what combine reads of a calibrator: its version and apply
        version = "half-1"

        def apply(self, values):
            return [v / 2 for v in values]

    profiles = {"f": profile(0.6, 0.4), "g": profile(1.0, 0.0)}
    family_of = {"a": "f", "b": "f", "c": "g"}
    cals = {"f": Half(), "g": Half()}
    assert dumped(combine(RULES, JUDGE, profiles, family_of, cals)) == dumped(
        reference_combine(RULES, JUDGE, profiles, family_of, cals))
