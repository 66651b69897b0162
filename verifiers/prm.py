"""The process reward model: combine the layers into one step reward.

    raw      = Σ w_l · score_l / Σ w_l over the layers that scored the step with weight > 0
               (w from the family's `score_weights.layers`; a judge that is not configured or
               failed on the step contributes nothing, so without a judge raw = the rule score)
    reward   = calibrator(raw) where the family has a calibrator, else raw

Prompt injection: from the first step of a rollout whose rule components flag an
`injection_attempt` on, the judge's score is not used: those steps' judge prompts show the
injected text (the step itself, or its history), so a judge that obeyed it would be rewarding
the injection. Where the judge ran (a row with status ok or error), the judge layer is taken at
its floor, -1, instead; so whatever the judge said, the combined reward of such a step is never
above that of the same step without the injection (the rule score only falls, the judge term
only falls). The row's version says `judge:withheld` and its components `judge_withheld: 1`.

Rows produced per step: `calibrated` (where a calibrator applies; scorer_version = the
calibrator's version) and `combined` (the reward the trainer sees). The combined row's
`scorer_version` names everything that produced it, e.g.
`prm2|rules:3+wab12cd|judge:none|layers:9e8d7c|cal:isotonic-3f2a...`, and its components keep
each layer's score and weight, the raw value and the calibrated one."""

from __future__ import annotations

import math

from gymfoundry.envs.profile import DomainProfile
from gymfoundry.envs.records import StepScore, construct, content_hash
from gymfoundry.verifiers.calibration import Calibrator
from gymfoundry.verifiers.rules import round6

PRM_VERSION = "2"  # 2: the judge is withheld from an injection onwards
JUDGE_FLOOR = -1.0


def layers_version(profile: DomainProfile) -> str:
    return content_hash(sorted(profile.score_weights.layers.items()), 6)


def judge_label(score: StepScore | None, weight: float, withheld: bool = False) -> str:
    if score is None or score.status == "not_configured" or weight <= 0:
        return "none"
    if withheld:
        return "withheld"
    if score.status != "ok":
        return "error"  # a later re-score that reaches the judge lands beside this one
    return f"{score.scorer_id.removeprefix('judge:')}@{score.scorer_version}"


def injection_starts(rule_scores: list[StepScore]) -> dict[str, int]:
    """rollout_id -> the index of its first step flagged `injection_attempt` by the rule layer."""
    starts: dict[str, int] = {}
    for s in rule_scores:
        if s.components.get("injection_attempt", 0.0) < 0:
            starts[s.rollout_id] = min(s.step_index, starts.get(s.rollout_id, s.step_index))
    return starts


def combine(rule_scores: list[StepScore], judge_scores: list[StepScore], profiles: dict[str, DomainProfile],
            family_of: dict[str, str], calibrators: dict[str, Calibrator] | None = None) -> list[StepScore]:
    """The `calibrated` and `combined` rows for every step that has a rule score."""
    calibrators = calibrators or {}
    judged = {(s.rollout_id, s.step_index): s for s in judge_scores}
    first_injection = injection_starts(rule_scores)
    layer_versions = {family: layers_version(profile) for family, profile in profiles.items()}
    versions: dict[tuple[str, str, str], str] = {}  # (rules version, judge label, family) -> the row's version
    by_family: dict[str, list[tuple]] = {}
    for rules in rule_scores:
        family = family_of[rules.rollout_id]
        weights = profiles[family].score_weights.layers
        judge = judged.get((rules.rollout_id, rules.step_index))
        if judge is None or judge.status == "not_configured":  # the rules alone (no endpoint): as in _mixed
            w_rules = weights.get("rules", 0.0)
            score = rules.score if rules.status == "ok" else None
            if w_rules > 0 and score is not None:  # sums from 0, as _mixed's (0 + -0.0 is 0.0)
                raw, components = (0 + w_rules * score) / (0 + w_rules), {"rules": score, "w_rules": w_rules}
            else:
                raw, components = None, {}
            label = "none"
        else:
            raw, components, label = _mixed(rules, judge, weights, first_injection)
        key = (rules.scorer_version, label, family)
        version = versions.get(key)
        if version is None:
            version = versions[key] = (f"prm{PRM_VERSION}|rules:{rules.scorer_version}|judge:{label}"
                                       f"|layers:{layer_versions[family]}")
        rows = by_family.get(family)
        if rows is None:
            rows = by_family[family] = []
        rows.append((rules, raw, components, version))

    out = []
    for family in sorted(by_family):
        rows = by_family[family]
        calibrator = calibrators.get(family)
        calibrated = calibrator.apply([r[1] if r[1] is not None else 0.0 for r in rows]) if calibrator else None
        for i, (rules, raw, components, version) in enumerate(rows):
            if raw is None:
                out.append(StepScore(rollout_id=rules.rollout_id, step_index=rules.step_index, layer="combined",
                                     scorer_id="prm", scorer_version=version + "|cal:none",
                                     status="not_configured", components=components,
                                     rationale="no layer with a positive weight scored this step"))
                continue
            reward, cal_label = raw, "none"
            if calibrated is not None:
                reward, cal_label = round(float(calibrated[i]), 6), calibrator.version
                out.append(StepScore(rollout_id=rules.rollout_id, step_index=rules.step_index, layer="calibrated",
                                     scorer_id=f"calibrator:{family}", scorer_version=calibrator.version,
                                     score=reward, components={"raw": round(raw, 6)}))
                components = {**components, "calibrated": reward}
            components["raw"] = round6(raw)
            out.append(_score_row({"rollout_id": rules.rollout_id, "step_index": rules.step_index, "layer": "combined",
                                   "scorer_id": "prm", "scorer_version": f"{version}|cal:{cal_label}", "status": "ok",
                                   "score": round6(float(reward)), "components": components, "rationale": None}))
    return out


def _mixed(rules: StepScore, judge: StepScore, weights: dict[str, float],
           first_injection: dict[str, int]) -> tuple[float | None, dict[str, float], str]:
    """(raw, components, judge label) of a step with a judge row that is not `not_configured`."""
    withheld = (judge.status in ("ok", "error")
                and rules.step_index >= first_injection.get(rules.rollout_id, rules.step_index + 1))
    judge_score = JUDGE_FLOOR if withheld else (judge.score if judge.status == "ok" else None)
    parts = {"rules": (weights.get("rules", 0.0), rules.score if rules.status == "ok" else None),
             "judge": (weights.get("judge", 0.0), judge_score)}
    used = {name: (w, s) for name, (w, s) in parts.items() if w > 0 and s is not None}
    total = sum(w for w, _ in used.values())
    raw = sum(w * s for w, s in used.values()) / total if total else None
    components = {**{name: s for name, (_, s) in used.items()}, **{f"w_{name}": w for name, (w, _) in used.items()}}
    if withheld and "judge" in used:
        components["judge_withheld"] = 1.0
    return raw, components, judge_label(judge, weights.get("judge", 0.0), withheld)


def _score_row(fields: dict) -> StepScore:
    """A StepScore of values made here from validated rows: built without validating them again
    where every number is a finite float (the record refuses anything else, and still does)."""
    score = fields["score"]
    if type(score) is float and math.isfinite(score) and all(
            type(v) is float and math.isfinite(v) for v in fields["components"].values()):
        return construct(StepScore, fields)
    return StepScore(**fields)
