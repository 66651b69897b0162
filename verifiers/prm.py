"""The process reward model: combine the layers into one step reward.

    raw      = Σ w_l · score_l / Σ w_l over the layers that scored the step with weight > 0
               (w from the family's `score_weights.layers`; a judge that is not configured or
               failed on the step contributes nothing, so without a judge raw = the rule score)
    reward   = calibrator(raw) where the family has a calibrator, else raw

Rows produced per step: `calibrated` (where a calibrator applies; scorer_version = the
calibrator's version) and `combined` (the reward the trainer sees). The combined row's
`scorer_version` names everything that produced it, e.g.
`prm1|rules:2+wab12cd|judge:none|cal:isotonic-3f2a...|layers:9e8d7c`, and its components keep
each layer's score and weight, the raw value and the calibrated one."""

from __future__ import annotations

from envs.profile import DomainProfile
from envs.records import StepScore, content_hash
from verifiers.calibration import Calibrator

PRM_VERSION = "1"


def layers_version(profile: DomainProfile) -> str:
    return content_hash(sorted(profile.score_weights.layers.items()), 6)


def judge_label(score: StepScore | None, weight: float) -> str:
    if score is None or score.status == "not_configured" or weight <= 0:
        return "none"
    if score.status != "ok":
        return "error"  # a later re-score that reaches the judge lands beside this one
    return f"{score.scorer_id.removeprefix('judge:')}@{score.scorer_version}"


def combine(rule_scores: list[StepScore], judge_scores: list[StepScore], profiles: dict[str, DomainProfile],
            family_of: dict[str, str], calibrators: dict[str, Calibrator] | None = None) -> list[StepScore]:
    """The `calibrated` and `combined` rows for every step that has a rule score."""
    calibrators = calibrators or {}
    judged = {(s.rollout_id, s.step_index): s for s in judge_scores}
    raw_rows = []
    for rules in rule_scores:
        family = family_of[rules.rollout_id]
        weights = profiles[family].score_weights.layers
        judge = judged.get((rules.rollout_id, rules.step_index))
        parts = {"rules": (weights.get("rules", 0.0), rules.score if rules.status == "ok" else None),
                 "judge": (weights.get("judge", 0.0), judge.score if judge and judge.status == "ok" else None)}
        used = {name: (w, s) for name, (w, s) in parts.items() if w > 0 and s is not None}
        total = sum(w for w, _ in used.values())
        raw = sum(w * s for w, s in used.values()) / total if total else None
        components = {**{name: s for name, (_, s) in used.items()}, **{f"w_{name}": w for name, (w, _) in used.items()}}
        version = (f"prm{PRM_VERSION}|rules:{rules.scorer_version}|judge:{judge_label(judge, weights.get('judge', 0.0))}"
                   f"|layers:{layers_version(profiles[family])}")
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
            out.append(StepScore(**key, layer="combined", scorer_id="prm", scorer_version=f"{version}|cal:{cal_label}",
                                 score=round(reward, 6), components={**components, "raw": round(raw, 6)}))
    return out
