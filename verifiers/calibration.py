"""PRM layer 3: human calibration. A calibrator maps a step's raw PRM score (the weighted
combination of the rule and judge layers) to a calibrated step reward in [-1, 1] fitted on
human labels (-1 / 0 / +1, as in PRM800K).

    calibrator = fit_calibrator(raw_train, labels_train, family="inventory", kind="isotonic")
    report = agreement(calibrator.apply(raw_heldout), labels_heldout)   # spearman, kappa, accuracy
    save_calibrator(data_dir, calibrator)                                # becomes the family's current one
    load_current(data_dir, "inventory").apply(raw)

Fitting uses scikit-learn (`IsotonicRegression`, or multinomial `LogisticRegression` whose
calibrated reward is the expected label P(+1) - P(-1)); the fitted parameters are stored as
plain JSON (isotonic breakpoints, logistic coefficients) and applied with numpy, so no pickle is
ever loaded. A continuous score is read as a label by rounding to the nearest of -1, 0, +1."""

from __future__ import annotations

import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from gymfoundry.envs.records import content_hash

LABELS = (-1, 0, 1)
CALIBRATOR_DIR = "calibrators"


class Calibrator(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str
    family: str
    kind: Literal["isotonic", "logistic"]
    x: list[float] = Field(default_factory=list)          # isotonic: breakpoints of the raw score
    y: list[float] = Field(default_factory=list)          # isotonic: calibrated value at each breakpoint
    classes: list[int] = Field(default_factory=list)      # logistic
    coef: list[float] = Field(default_factory=list)       # logistic: one slope per class
    intercept: list[float] = Field(default_factory=list)  # logistic: one intercept per class
    fitted_on: dict[str, str] = Field(default_factory=dict)  # versions of the layers whose raw scores it saw
    n_train: int = 0
    n_holdout: int = 0
    agreement: dict[str, dict[str, float | None]] = Field(default_factory=dict)  # before / after on held-out
    created_at: str = ""

    def apply(self, raw) -> np.ndarray:
        raw = np.asarray(raw, dtype=float)
        if self.kind == "isotonic":
            return np.interp(raw, self.x, self.y)  # constant beyond the ends, as sklearn's out_of_bounds="clip"
        logits = raw[:, None] * np.asarray(self.coef)[None, :] + np.asarray(self.intercept)[None, :]
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        return p @ np.asarray(self.classes, dtype=float)


def to_labels(scores) -> np.ndarray:
    """A continuous score read as the nearest label."""
    return np.clip(np.rint(np.asarray(scores, dtype=float)), -1, 1).astype(int)


def agreement(scores, labels) -> dict[str, float | None]:
    """Spearman's rho of score vs label, and Cohen's kappa and accuracy of the nearest label."""
    from scipy.stats import spearmanr
    from sklearn.metrics import cohen_kappa_score

    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=int)
    if len(labels) == 0:
        return {"n": 0, "spearman": None, "kappa": None, "accuracy": None}
    predicted = to_labels(scores)
    rho = spearmanr(scores, labels).statistic if len(set(scores)) > 1 and len(set(labels)) > 1 else float("nan")
    kappa = cohen_kappa_score(labels, predicted, labels=list(LABELS))
    return {"n": int(len(labels)), "spearman": _finite(rho), "kappa": _finite(kappa),
            "accuracy": round(float((predicted == labels).mean()), 6)}


def _finite(value: float) -> float | None:
    return round(float(value), 6) if value is not None and math.isfinite(value) else None


def fit_calibrator(raw, labels, family: str, kind: str = "isotonic",
                   fitted_on: dict[str, str] | None = None) -> Calibrator:
    raw, labels = np.asarray(raw, dtype=float), np.asarray(labels, dtype=int)
    if len(raw) < 2 or len(set(labels)) < 2:
        raise ValueError(f"calibrating {family} needs at least two labels of different values, "
                         f"got {len(raw)} label(s)")
    if not set(labels) <= set(LABELS):
        raise ValueError(f"labels must be -1, 0 or 1, got {sorted(set(labels) - set(LABELS))}")
    if kind == "isotonic":
        from sklearn.isotonic import IsotonicRegression

        model = IsotonicRegression(y_min=-1.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit(raw, labels)
        params = {"x": [float(v) for v in model.X_thresholds_], "y": [float(v) for v in model.y_thresholds_]}
    elif kind == "logistic":
        from sklearn.linear_model import LogisticRegression

        model = LogisticRegression(C=10.0, max_iter=1000).fit(raw[:, None], labels)
        classes = [int(c) for c in model.classes_]
        coef, intercept = model.coef_[:, 0], model.intercept_
        if len(classes) == 2:  # sklearn keeps one row for two classes: P(second) = sigmoid(row)
            coef, intercept = np.array([0.0, coef[0]]), np.array([0.0, intercept[0]])
        params = {"classes": classes, "coef": [float(v) for v in coef], "intercept": [float(v) for v in intercept]}
    else:
        raise ValueError(f"unknown calibrator kind {kind!r}; use isotonic or logistic")
    fitted_on = dict(fitted_on or {})
    version = f"{kind}-" + content_hash([family, kind, params, fitted_on], 10)
    return Calibrator(version=version, family=family, kind=kind, fitted_on=fitted_on, n_train=len(raw),
                      created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), **params)


# -- storage: <data_dir>/calibrators/<family>/<version>.json and a CURRENT pointer -----------

def _family_dir(data_dir: str | os.PathLike, family: str) -> Path:
    return Path(data_dir) / CALIBRATOR_DIR / family


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(text, encoding="utf-8")
    os.replace(temp, path)


def save_calibrator(data_dir: str | os.PathLike, calibrator: Calibrator, make_current: bool = True) -> Path:
    path = _family_dir(data_dir, calibrator.family) / f"{calibrator.version}.json"
    _write_atomic(path, calibrator.model_dump_json(indent=2))
    if make_current:
        _write_atomic(path.with_name("CURRENT"), calibrator.version + "\n")
    return path


def load_calibrator(data_dir: str | os.PathLike, family: str, version: str) -> Calibrator:
    path = _family_dir(data_dir, family) / f"{version}.json"
    return Calibrator.model_validate_json(path.read_text(encoding="utf-8"))


def load_current(data_dir: str | os.PathLike, family: str) -> Calibrator | None:
    pointer = _family_dir(data_dir, family) / "CURRENT"
    if not pointer.exists():
        return None
    return load_calibrator(data_dir, family, pointer.read_text(encoding="utf-8").strip())


def current_calibrators(data_dir: str | os.PathLike | None, families: list[str]) -> dict[str, Calibrator]:
    if data_dir is None:
        return {}
    found = {f: load_current(data_dir, f) for f in families}
    return {f: c for f, c in found.items() if c is not None}
