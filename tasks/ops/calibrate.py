"""Stage: human calibration of the PRM (layer 3).

    export_label_sample(data_dir, out)      a stratified sample of steps to label (CSV + Parquet)
    import_labels(data_dir, path)           labels -1 / 0 / +1 with a labeller id, checked, stored
    fit_calibrators(data_dir)               per family: fit on labelled steps, report agreement on
                                            held-out rollouts, store as the family's current calibrator

Labels live beside the warehouse as immutable Parquet files `<data_dir>/labels/labels-<hash>.parquet`
(importing the same labels twice adds nothing); calibrators under `<data_dir>/calibrators/`."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from gymfoundry.envs.records import content_hash
from gymfoundry.tasks.stages.score import newest_scores, score_steps
from gymfoundry.verifiers.calibration import agreement, fit_calibrator, save_calibrator
from gymfoundry.verifiers.judge import JudgeSettings
from gymfoundry.warehouse import Warehouse
from gymfoundry.warehouse.catalog import quote_literal

LABEL_DIR = "labels"
BUCKETS = ([-0.5, -0.05, 0.05, 0.5], ["<=-0.5", "(-0.5,-0.05]", "(-0.05,0.05]", "(0.05,0.5]", ">0.5"])
HISTORY_STEPS = 3
TEXT_LIMIT = 1500
LABEL_SCHEMA = {"rollout_id": pl.String, "step_index": pl.Int64, "task_family": pl.String, "label": pl.Int8,
                "labeller_id": pl.String, "comment": pl.String, "source": pl.String, "imported_at": pl.String}


# -- export --------------------------------------------------------------------------------

def label_candidates(data_dir: str | os.PathLike, families: list[str] | None = None) -> pl.DataFrame:
    """Every landed step with the context a person needs to label it and its newest scores."""
    where = f"r.task_family in ({', '.join(quote_literal(f) for f in families)})" if families else "true"
    with Warehouse(data_dir, read_only=True) as wh:
        steps = wh.sql_df(f"""
            select s.rollout_id, s."index" as step_index, r.task_family, r.termination, r.policy_id,
                   t.difficulty_level, t.goal, s.thought, s.action_text, s.tool_call, s.result, s.error,
                   count(*) over (partition by s.rollout_id) as n_steps
            from steps s join rollouts r using (rollout_id) join tasks t using (task_id)
            where {where}""")
        scores = newest_scores(wh, ("rules", "judge", "combined"))
    if steps.is_empty():
        return steps
    action = (pl.when(pl.col("tool_call").is_not_null()).then(pl.col("tool_call"))
              .otherwise(pl.col("action_text").fill_null("")))
    line = pl.format("[{}] {} -> {}", pl.col("step_index"), action.str.slice(0, 300), pl.col("result").str.slice(0, 300))
    steps = steps.sort("rollout_id", "step_index").with_columns(line=line)
    earlier = [pl.col("line").shift(k).over("rollout_id") for k in range(HISTORY_STEPS, 0, -1)]
    steps = steps.with_columns(history=pl.concat_str(earlier, separator="\n", ignore_nulls=True).fill_null(""),
                               action=action, observation=pl.col("result"))
    wide = {layer: scores.filter(pl.col("layer") == layer).select(
                "rollout_id", "step_index", pl.col("score").alias(f"{layer}_score"),
                pl.col("scorer_version").alias(f"{layer}_version"),
                pl.col("components").alias(f"{layer}_components"), pl.col("rationale").alias(f"{layer}_rationale"))
            for layer in ("rules", "judge", "combined")}
    for layer, frame in wide.items():
        steps = steps.join(frame, on=["rollout_id", "step_index"], how="left")
    steps = steps.with_columns(score_bucket=_bucket(pl.coalesce("combined_score", "rules_score")))
    return steps.select(
        pl.format("{}:{}", "rollout_id", "step_index").alias("sample_id"), "task_family", "rollout_id", "step_index",
        "n_steps", "termination", "difficulty_level", "score_bucket",
        *[_clipped(c) for c in ("goal", "history", "thought", "action", "observation")],
        "error", "rules_score", "rules_components", "judge_score", "judge_rationale", "combined_score",
        "combined_version")


def _bucket(score: pl.Expr) -> pl.Expr:
    """The bucket of a score: (-inf, a], (a, b], ... with the edges of BUCKETS."""
    edges, names = BUCKETS
    bucket = pl.when(score.is_null()).then(pl.lit("unscored"))
    for edge, name in zip(edges, names):
        bucket = bucket.when(score <= edge).then(pl.lit(name))
    return bucket.otherwise(pl.lit(names[-1]))


def _clipped(column: str) -> pl.Expr:
    text = pl.col(column).fill_null("")
    return (pl.when(text.str.len_chars() > TEXT_LIMIT).then(text.str.slice(0, TEXT_LIMIT) + " …[truncated]")
            .otherwise(text).alias(column))


def stratified_sample(candidates: pl.DataFrame, n: int, seed: int = 0) -> pl.DataFrame:
    """Up to `n` steps spread evenly over the strata (family × score bucket × termination): every
    stratum gives one step before any gives a second, so rare strata are covered."""
    if candidates.is_empty():
        return candidates
    strata = ["task_family", "score_bucket", "termination"]
    shuffled = candidates.sort("sample_id").sample(fraction=1.0, shuffle=True, seed=seed)
    ranked = shuffled.with_columns(stratum_rank=pl.int_range(pl.len()).over(strata))
    return ranked.sort("stratum_rank", maintain_order=True).head(n).drop("stratum_rank").sort(strata + ["sample_id"])


def export_label_sample(data_dir: str | os.PathLike, out: str | os.PathLike, n: int = 200, seed: int = 0,
                        families: list[str] | None = None) -> dict[str, Any]:
    """Write `<out>.csv` and `<out>.parquet`: the sample with empty `label`, `labeller_id` and
    `comment` columns to fill in (label -1, 0 or +1)."""
    sample = stratified_sample(label_candidates(data_dir, families), n, seed).with_columns(
        label=pl.lit(None, pl.String), labeller_id=pl.lit(None, pl.String), comment=pl.lit(None, pl.String))
    stem = Path(out)
    stem = stem.with_suffix("") if stem.suffix in (".csv", ".parquet") else stem
    stem.parent.mkdir(parents=True, exist_ok=True)
    csv_path, parquet_path = stem.with_name(stem.name + ".csv"), stem.with_name(stem.name + ".parquet")
    sample.write_csv(csv_path)
    sample.write_parquet(parquet_path)
    strata = sample.group_by("task_family", "score_bucket", "termination").len().height if sample.height else 0
    return {"rows": sample.height, "strata": strata, "csv": str(csv_path), "parquet": str(parquet_path)}


# -- import --------------------------------------------------------------------------------

def _parse_label(value: Any) -> int | None:
    if value is None:
        return None
    text = str(value).strip()
    if text == "":
        return None
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"label {text!r} is not -1, 0 or +1") from None
    if number not in (-1.0, 0.0, 1.0):
        raise ValueError(f"label {text!r} is not -1, 0 or +1")
    return int(number)


def read_label_file(path: str | os.PathLike) -> pl.DataFrame:
    path = Path(path)
    if path.suffix == ".parquet":
        return pl.read_parquet(path)
    if path.suffix == ".csv":
        return pl.read_csv(path, infer_schema=False)  # everything as text; labels are parsed below
    raise ValueError(f"{path}: expected a .csv or .parquet label file")


def import_labels(data_dir: str | os.PathLike, path: str | os.PathLike, labeller_id: str | None = None) -> dict[str, Any]:
    """Check and store the labelled rows of a label file (unlabelled rows are skipped). Every
    labelled row needs a labeller id (its own column, or `labeller_id` for the whole file) and
    must name a landed step."""
    frame = read_label_file(path)
    missing = {"rollout_id", "step_index", "label"} - set(frame.columns)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}")
    rows, errors, skipped = [], [], 0
    for row in frame.iter_rows(named=True):
        where = f"{row['rollout_id']}:{row['step_index']}"
        try:
            label = _parse_label(row["label"])
        except ValueError as exc:
            errors.append(f"{where}: {exc}")
            continue
        if label is None:
            skipped += 1
            continue
        labeller = str(row.get("labeller_id") or labeller_id or "").strip()
        if not labeller:
            errors.append(f"{where}: no labeller_id (add the column or pass --labeller)")
            continue
        rows.append({"rollout_id": str(row["rollout_id"]), "step_index": int(row["step_index"]), "label": label,
                     "labeller_id": labeller, "comment": str(row.get("comment") or "") or None})
    if errors:
        raise ValueError(f"{path}: {len(errors)} bad row(s): " + "; ".join(errors[:5]))
    if not rows:
        return {"imported": 0, "skipped_unlabelled": skipped, "path": None}
    keys = pl.DataFrame({"rollout_id": [r["rollout_id"] for r in rows], "step_index": [r["step_index"] for r in rows]})
    with Warehouse(data_dir, read_only=True) as wh:
        wh.con.register("label_keys", keys.to_arrow())
        try:
            found = wh.sql_df("""select k.rollout_id, k.step_index, s.task_family from label_keys k
                                 join steps s on s.rollout_id = k.rollout_id and s."index" = k.step_index""")
        finally:
            wh.con.unregister("label_keys")
    family = {(r["rollout_id"], r["step_index"]): r["task_family"] for r in found.iter_rows(named=True)}
    unknown = [f"{r['rollout_id']}:{r['step_index']}" for r in rows if (r["rollout_id"], r["step_index"]) not in family]
    if unknown:
        raise ValueError(f"{path}: {len(unknown)} label(s) name no landed step: {unknown[:5]}")
    imported_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for r in rows:
        r.update(task_family=family[(r["rollout_id"], r["step_index"])], source=Path(path).name,
                 imported_at=imported_at)
    content = sorted([r["rollout_id"], r["step_index"], r["label"], r["labeller_id"], r["comment"]] for r in rows)
    target = Path(data_dir) / LABEL_DIR / f"labels-{content_hash(content, 16)}.parquet"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        pl.DataFrame(rows, schema=LABEL_SCHEMA).write_parquet(temp)
        os.replace(temp, target)
    return {"imported": len(rows), "skipped_unlabelled": skipped, "path": str(target),
            "by_label": dict(sorted(Counter(r["label"] for r in rows).items())),
            "labellers": sorted({r["labeller_id"] for r in rows})}


def load_labels(data_dir: str | os.PathLike, families: list[str] | None = None) -> pl.DataFrame:
    """All imported labels; a labeller's newest label of a step replaces their earlier ones."""
    files = sorted((Path(data_dir) / LABEL_DIR).glob("labels-*.parquet"))
    if not files:
        return pl.DataFrame(schema=LABEL_SCHEMA)
    labels = pl.concat([pl.read_parquet(f) for f in files]).sort("imported_at", "source")
    labels = labels.unique(["rollout_id", "step_index", "labeller_id"], keep="last", maintain_order=True)
    if families:
        labels = labels.filter(pl.col("task_family").is_in(families))
    return labels.sort("task_family", "rollout_id", "step_index", "labeller_id")


# -- fit -----------------------------------------------------------------------------------

def is_holdout(rollout_id: str, fraction: float, seed: int) -> bool:
    """Held-out by whole rollout, so steps of one episode never sit on both sides."""
    digest = hashlib.sha256(f"{seed}:{rollout_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64 < fraction


def fit_calibrators(data_dir: str | os.PathLike, families: list[str] | None = None, kind: str = "isotonic",
                    holdout: float = 0.3, seed: int = 0, judge: JudgeSettings | None = None,
                    min_labels: int = 20, profiles: dict | None = None) -> dict[str, dict[str, Any]]:
    """Per family with labels: the labelled rollouts are re-scored now, uncalibrated, with the
    current rules, judge and profile (so the calibrator learns the scale it will be applied to);
    it is fitted on the rollouts outside the held-out fraction, its agreement with the held-out
    labels is reported before (raw score) and after (calibrated), and it becomes the family's
    current calibrator. Returns a report per family."""
    labels = load_labels(data_dir, families)
    reports: dict[str, dict[str, Any]] = {}
    for family in sorted(set(labels["task_family"].to_list())):
        family_labels = labels.filter(pl.col("task_family") == family)
        if family_labels.height < min_labels:
            reports[family] = {"family": family, "skipped": f"{family_labels.height} labels, fewer than {min_labels}"}
            continue
        ids = sorted(set(family_labels["rollout_id"].to_list()))
        with Warehouse(data_dir, read_only=True) as wh:
            wh.con.register("label_rollouts", pl.DataFrame({"rollout_id": ids}).to_arrow())
            try:
                rollouts = wh.load_rollouts("rollout_id in (select rollout_id from label_rollouts)")
                tasks = wh.load_tasks("task_id in (select task_id from rollouts where rollout_id in "
                                      "(select rollout_id from label_rollouts))")
            finally:
                wh.con.unregister("label_rollouts")
        run = score_steps(rollouts, tasks, data_dir, judge, profiles=profiles, use_calibrators=False)
        combined = [s for s in run.scores if s.layer == "combined" and s.status == "ok"]
        raw = pl.DataFrame({"rollout_id": [s.rollout_id for s in combined],
                            "step_index": [s.step_index for s in combined],
                            "raw": [s.components["raw"] for s in combined]},
                           schema={"rollout_id": pl.String, "step_index": pl.Int64, "raw": pl.Float64})
        data = family_labels.join(raw, on=["rollout_id", "step_index"], how="inner").with_columns(
            heldout=pl.col("rollout_id").map_elements(lambda r: is_holdout(r, holdout, seed), return_dtype=pl.Boolean))
        train, test = data.filter(~pl.col("heldout")), data.filter(pl.col("heldout"))
        if train.is_empty() or test.is_empty():
            reports[family] = {"family": family, "skipped": f"no {'training' if train.is_empty() else 'held-out'} "
                                                              f"rollouts among {len(ids)} labelled ones"}
            continue
        fitted_on = Counter(s.scorer_version.rsplit("|cal:", 1)[0] for s in combined).most_common(1)[0][0]
        calibrator = fit_calibrator(train["raw"].to_numpy(), train["label"].to_numpy(), family, kind,
                                    fitted_on={"prm": fitted_on})
        before = agreement(test["raw"].to_numpy(), test["label"].to_numpy())
        after = agreement(calibrator.apply(test["raw"].to_numpy()), test["label"].to_numpy())
        calibrator = calibrator.model_copy(update={"n_holdout": test.height,
                                                   "agreement": {"before": before, "after": after}})
        path = save_calibrator(data_dir, calibrator)
        reports[family] = {"family": family, "version": calibrator.version, "kind": kind, "n_train": train.height,
                           "n_holdout": test.height, "before": before, "after": after, "path": str(path),
                           "fitted_on": fitted_on}
    return reports


def render_agreement(reports: dict[str, dict[str, Any]]) -> str:
    lines = ["| family | calibrator | held-out | spearman before → after | kappa before → after | "
             "accuracy before → after |", "|---|---|---|---|---|---|"]
    for r in reports.values():
        if "skipped" in r:
            lines.append(f"| {r['family']} | skipped: {r['skipped']} | | | | |")
            continue
        cells = [f"{_fmt(r['before'][m])} → {_fmt(r['after'][m])}" for m in ("spearman", "kappa", "accuracy")]
        lines.append(f"| {r['family']} | `{r['version']}` | {r['n_holdout']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
