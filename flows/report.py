"""Pictures and tables of a data dir: Prefect artifacts for a run, and a self-contained HTML report.

The tables are the warehouse's analysis views (warehouse/views.py) read as they are, filtered to
the families (and datasets) asked for; the charts draw those tables, and the reward chart the
step scores behind `reward_by_layer` (their box-plot statistics, summed up in SQL). Charts are PNG
bytes from a `matplotlib.figure.Figure` on its own Agg canvas, never pyplot, so flows drawing in
threads share no figure state.

Images reach the Prefect UI as image artifacts whose URL is a `data:image/png;base64,...` URI:
the UI's image artifact is `<img src=artifact.data>`, so it shows with no network, and the server
stores the URI like any other artifact data (no size rule for artifacts in Prefect 3.9).
"""

from __future__ import annotations

import base64
import contextvars
import html
import io
import json
import logging
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gymfoundry.warehouse import Warehouse

log = logging.getLogger("gymfoundry.report")

FIGSIZE = (6.0, 3.5)  # inches
DPI = 100
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_CHARTED_RUNS = 8  # training runs in one chart; the table lists them all

# Displayed tables: name -> (title, what each row is)
TITLES = {
    "success_by_level": "Success by family × difficulty level (per policy)",
    "failure_classes": "Failure classes: how rollouts end, per family and policy",
    "reward_by_layer": "Step rewards per PRM layer and scorer version",
    "dataset_composition": "Dataset composition per family and difficulty",
    "training_runs": "Training runs",
    "gameability_audits": "Gameability audits: each adversary beside the oracle (newest audit per family)",
}
COUNTED = ("tasks", "task_rejections", "rollouts", "steps", "step_scores", "datasets", "training_runs")


# Tables ------------------------------------------------------------------------------------------

def _rows(wh: Warehouse, query: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    # JSON-safe values: a table artifact is JSON, and a timestamp column must not break it
    return json.loads(json.dumps(wh.sql(query, params).to_pylist(), default=str))


def _where(column: str, values: list[str] | None) -> tuple[str, list[Any]]:
    return (f"WHERE {column} IN (SELECT unnest(?))", [list(values)]) if values is not None else ("", [])


def success_by_level(wh: Warehouse, families: list[str] | None = None) -> list[dict[str, Any]]:
    where, params = _where("task_family", families)
    return _rows(wh, f"SELECT * FROM success_by_cell {where} "
                     "ORDER BY task_family, policy_id, policy_version, difficulty_level", params)


def failure_classes(wh: Warehouse, families: list[str] | None = None) -> list[dict[str, Any]]:
    where, params = _where("task_family", families)
    return _rows(wh, f"SELECT * FROM failure_classes {where} "
                     "ORDER BY task_family, policy_id, policy_version, termination", params)


def reward_by_layer(wh: Warehouse, families: list[str] | None = None) -> list[dict[str, Any]]:
    where, params = _where("task_family", families)
    return _rows(wh, f"SELECT * FROM reward_by_layer {where} "
                     "ORDER BY task_family, layer, scorer_id, scorer_version", params)


def dataset_composition(wh: Warehouse, families: list[str] | None = None,
                        dataset_ids: list[str] | None = None) -> list[dict[str, Any]]:
    where, params = _where("task_family", families)
    if dataset_ids is not None:
        where = (where + " AND " if where else "WHERE ") + "dataset_id IN (SELECT unnest(?))"
        params.append(list(dataset_ids))
    return _rows(wh, f"SELECT * FROM dataset_composition {where} ORDER BY kind, dataset_id, task_family, difficulty",
                 params)


def reward_boxes(wh: Warehouse, families: list[str] | None = None) -> list[dict[str, Any]]:
    """Per family and PRM layer with scored steps (in that order): the box the reward chart draws,
    matplotlib's box-plot statistics of the step scores (`steps`, `mean`, `q1`, `med`, `q3`,
    whiskers `whislo`/`whishi` at 1.5 IQR, `fliers`). DuckDB sums up how many steps have each
    distinct score, matplotlib's `boxplot_stats` reads the statistics off those, and the fliers
    come back in the order `boxplot` lists them (low ones first, each side in step order), so the
    chart is the one the scores themselves draw, without pulling every step into Python. A score
    that is no finite number (the gates refuse one; `Warehouse.check` reports one landed around
    them) is left out of both."""
    import numpy as np
    from matplotlib.cbook import boxplot_stats

    where, params = _where("task_family", families)
    where = (where + " AND " if where else "WHERE ") + "score IS NOT NULL AND isfinite(score)"
    counted: dict[tuple[str, str], tuple[list[float], list[int]]] = {}
    for r in wh.sql(f"SELECT task_family, layer, score, count(*) AS n FROM step_scores {where} "
                    "GROUP BY ALL ORDER BY ALL", params).to_pylist():
        scores, ns = counted.setdefault((r["task_family"], r["layer"]), ([], []))
        scores.append(r["score"])
        ns.append(r["n"])
    boxes = {}
    for (family, layer), (scores, ns) in counted.items():
        stats = boxplot_stats(np.repeat(scores, ns))[0]
        boxes[family, layer] = {"task_family": family, "layer": layer, "steps": sum(ns),
                                **{k: float(stats[k]) for k in ("mean", "q1", "med", "q3", "whislo", "whishi")},
                                "fliers": []}
    if boxes:
        bounds = [{"task_family": b["task_family"], "layer": b["layer"], "lo": b["whislo"], "hi": b["whishi"]}
                  for b in boxes.values()]
        for r in wh.sql("SELECT s.task_family, s.layer, s.score FROM step_scores s "
                        "JOIN (SELECT unnest(?, recursive := true)) b USING (task_family, layer) "
                        "WHERE (s.score < b.lo OR s.score > b.hi) AND isfinite(s.score) "
                        "ORDER BY s.task_family, s.layer, s.score > b.hi, s.scorer_version, s.rollout_id, s.step_index",
                        [bounds]).to_pylist():
            boxes[r["task_family"], r["layer"]]["fliers"].append(r["score"])
    return list(boxes.values())


def gameability_audits(wh: Warehouse, families: list[str] | None = None) -> list[dict[str, Any]]:
    """Per family (its newest audit) and adversary: episodes, the highest success rate and mean
    return over its levels beside the oracle's lowest return, and the levels where it failed."""
    where, params = _where("task_family", families)
    return _rows(wh, f"""
        WITH latest AS (SELECT task_family, max(audited_at) AS audited_at,
                               arg_max(audit_id, audited_at) AS audit_id FROM family_audits
                        {where} GROUP BY task_family)
        SELECT a.task_family, a.audit_id, any_value(a.verifier_version) AS verifier_version, a.adversary,
               CAST(sum(a.episodes) AS BIGINT) AS episodes, max(a.success_rate) AS max_success_rate, max(a.floor) AS floor,
               max(a.mean_return) AS max_mean_return, min(a.oracle_return) AS min_oracle_return,
               bool_and(a.passed) AS passed,
               string_agg(CAST(a.level AS VARCHAR), ', ' ORDER BY a.level) FILTER (WHERE NOT a.passed) AS failed_levels
        FROM family_audits a JOIN latest USING (task_family, audit_id, audited_at)
        GROUP BY a.task_family, a.audit_id, a.adversary
        ORDER BY a.task_family, a.adversary != 'oracle', a.adversary""", params)


_TRAINING_COLUMNS = """run_id, method, dataset_id, families, status,
    CAST(json_extract(metrics, '$.steps') AS BIGINT) AS steps,
    CAST(json_extract(metrics, '$.final_loss') AS DOUBLE) AS final_loss,
    CAST(json_extract(metrics, '$.heldout.success_rate') AS DOUBLE) AS heldout_success,
    started_at, finished_at"""


def training_runs(wh: Warehouse, families: list[str] | None = None,
                  run_ids: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per training run (its metrics' steps, final loss and held-out success), oldest first."""
    where, params = ("WHERE list_has_any(families, ?)", [list(families)]) if families is not None else ("", [])
    if run_ids is not None:
        where = (where + " AND " if where else "WHERE ") + "run_id IN (SELECT unnest(?))"
        params.append(list(run_ids))
    return _rows(wh, f"SELECT {_TRAINING_COLUMNS} FROM training_runs {where} ORDER BY started_at, run_id", params)


def training_curves(wh: Warehouse, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Per run: `loss` [(step, loss)] from metrics.loss_history, `heldout` {level: success rate}
    from metrics.heldout.by_level (empty where the run was not evaluated)."""
    out = {}
    for row in _rows(wh, "SELECT run_id, metrics FROM training_runs WHERE run_id IN (SELECT unnest(?)) "
                         "ORDER BY run_id", [list(run_ids)]):
        metrics = json.loads(row["metrics"]) if isinstance(row["metrics"], str) else row["metrics"] or {}
        by_level = (metrics.get("heldout") or {}).get("by_level") or {}
        out[row["run_id"]] = {"loss": [(int(s), float(v)) for s, v in metrics.get("loss_history") or []],
                              "heldout": {int(k): float(by_level[k]) for k in sorted(by_level, key=int)}}
    return {run_id: out[run_id] for run_id in run_ids if run_id in out}


def read_report(data_dir: str | os.PathLike, families: list[str] | None = None,
                dataset_ids: list[str] | None = None) -> dict[str, Any]:
    """Everything the artifacts and the HTML report show, from one read-only connection:
    the `TITLES` tables, plus `reward_boxes`, `curves` (per training run) and `counts` (per table)."""
    with Warehouse(data_dir, read_only=True) as wh:
        runs = training_runs(wh, families)
        return {"success_by_level": success_by_level(wh, families),
                "failure_classes": failure_classes(wh, families),
                "reward_by_layer": reward_by_layer(wh, families),
                "dataset_composition": dataset_composition(wh, families, dataset_ids),
                "training_runs": runs,
                "gameability_audits": gameability_audits(wh, families),
                "reward_boxes": reward_boxes(wh, families),
                "curves": training_curves(wh, [r["run_id"] for r in runs]),
                "counts": {t: wh.count(t) for t in COUNTED}}


# Charts ------------------------------------------------------------------------------------------

def _figure(ncols: int = 1) -> tuple[Any, list[Any]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # imported when drawing: the CLI starts fast
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, list(fig.subplots(1, ncols, squeeze=False)[0])


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})  # no version stamp: same data, same bytes
    return buf.getvalue()


def success_chart(rows: list[dict[str, Any]]) -> bytes | None:
    """Success rate by difficulty level, one line per family and policy (rows of `success_by_level`)."""
    lines: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["success_rate"] is not None:
            label = f"{r['task_family']} · {r['policy_id']} {r['policy_version']}"
            lines.setdefault(label, []).append((r["difficulty_level"], r["success_rate"]))
    if not lines:
        return None
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    fig, (ax,) = _figure()
    for label, points in lines.items():
        ax.plot(*zip(*points), marker="o", label=label)
    ax.set(title="Success rate by difficulty level", xlabel="difficulty level", ylabel="success rate", ylim=(0, 1.05))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.legend(fontsize="x-small")
    return _png(fig)


def reward_chart(boxes: list[dict[str, Any]]) -> bytes | None:
    """Box plot of step scores (mean marked), one box per family and PRM layer (`reward_boxes`)."""
    if not boxes:
        return None
    fig, (ax,) = _figure()
    ax.bxp([{**b, "label": f"{b['task_family']}\n{b['layer']}"} for b in boxes], showmeans=True)
    ax.set(title="Step reward distribution by layer", xlabel="family / layer", ylabel="step score")
    ax.tick_params(axis="x", labelsize="small")
    return _png(fig)


def training_chart(curves: dict[str, dict[str, Any]]) -> bytes | None:
    """Loss curves (left) and held-out success by level (right, grouped per run) of training runs
    (`training_curves`, the last MAX_CHARTED_RUNS of them); None when none logged a loss or was evaluated."""
    curves = dict(list(curves.items())[-MAX_CHARTED_RUNS:])
    if not any(c["loss"] or c["heldout"] for c in curves.values()):
        return None
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    fig, (loss_ax, heldout_ax) = _figure(2)
    color = {run_id: f"C{i}" for i, run_id in enumerate(curves)}  # one colour per run in both panels
    for run_id, c in curves.items():
        if c["loss"]:
            loss_ax.plot(*zip(*c["loss"]), label=run_id, color=color[run_id])
    loss_ax.set(title="Training loss", xlabel="step", ylabel="loss")
    evaluated = {run_id: c["heldout"] for run_id, c in curves.items() if c["heldout"]}
    width = 0.8 / max(len(evaluated), 1)
    for i, (run_id, by_level) in enumerate(evaluated.items()):
        heldout_ax.bar([level - 0.4 + width * (i + 0.5) for level in by_level], list(by_level.values()), width,
                       label=run_id, color=color[run_id])
    if not evaluated:
        heldout_ax.text(0.5, 0.5, "not evaluated", ha="center", va="center", transform=heldout_ax.transAxes)
    heldout_ax.set(title="Held-out success", xlabel="difficulty level", ylabel="success rate", ylim=(0, 1.05))
    heldout_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    heldout_ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    for ax in (loss_ax, heldout_ax):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="xx-small")
    return _png(fig)


def charts(data: dict[str, Any]) -> dict[str, bytes]:
    """The charts of `read_report`'s data that have something to draw: name -> PNG bytes."""
    drawn = {"success-by-level": success_chart(data["success_by_level"]),
             "reward-by-layer": reward_chart(data["reward_boxes"]),
             "training": training_chart(data["curves"])}
    return {name: png for name, png in drawn.items() if png is not None}


CHART_TITLES = {"success-by-level": "Success rate by difficulty level per family",
                "reward-by-layer": "Step reward distribution by PRM layer",
                "training": "Training loss and held-out success"}


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


# Prefect artifacts -------------------------------------------------------------------------------

def _in_run() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def _publish(tables: dict[str, list[dict[str, Any]]], images: dict[str, bytes], about: str) -> dict[str, str]:
    from prefect.artifacts import create_image_artifact, create_table_artifact

    ids = {}
    for name, rows in tables.items():
        key = name.replace("_", "-")
        ids[key] = str(create_table_artifact(table=rows, key=key, description=f"{about}: {TITLES[name]}"))
    for name, png in images.items():
        key = f"{name}-chart"
        ids[key] = str(create_image_artifact(image_url=data_uri(png), key=key,
                                             description=f"{about}: {CHART_TITLES[name]}"))
    return ids


def publish_run_artifacts(data_dir: str | os.PathLike, families: list[str], run_id: str | None = None,
                          dataset_ids: list[str] | None = None) -> dict[str, str]:
    """Inside a flow or task run: table artifacts `success-by-level`, `failure-classes`,
    `reward-by-layer`, `dataset-composition` (only `dataset_ids` when given), `training-runs`
    (when the families have any), and image artifacts `success-by-level-chart`,
    `reward-by-layer-chart`, `training-chart` (each when it has data), for `families`.
    Returns artifact key -> artifact id. Outside a run it creates nothing and returns {}: Prefect
    would attach the artifacts to no run (and start a temporary server to hold them)."""
    with publishing_run_artifacts(data_dir, families, run_id, dataset_ids) as published:
        pass
    return published.result()


@contextmanager
def publishing_run_artifacts(data_dir: str | os.PathLike, families: list[str], run_id: str | None = None,
                             dataset_ids: list[str] | None = None) -> Iterator[Future]:
    """`publish_run_artifacts` beside the body of the `with`: the warehouse is read on entering
    (the body may then write it: DuckDB lets one process either read a catalog or write it); while
    the body runs, one thread of this run's context creates the table artifacts and another draws
    the charts and creates theirs; leaving waits for both, so the artifacts exist before the run
    ends. Yields a future of artifact key -> artifact id, done on leaving. A failure to publish is
    raised on leaving (after a body that raised, it is logged and the body's error goes on)."""
    published: Future = Future()
    if not _in_run():
        log.warning("publish_run_artifacts: not inside a Prefect flow or task run; no artifacts created")
        published.set_result({})
        yield published
        return
    data = read_report(data_dir, families, dataset_ids)
    tables = {name: data[name] for name in TITLES if name != "training_runs" or data[name]}
    about = f"Factory run {run_id}" if run_id else "Factory run"
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="artifacts") as pool:
        # a context is entered by one thread at a time: a copy each
        parts = [pool.submit(contextvars.copy_context().run, _publish, tables, {}, about),
                 pool.submit(contextvars.copy_context().run, lambda: _publish({}, charts(data), about))]
        try:
            yield published
        except BaseException:
            wait(parts)
            for part in parts:
                if part.exception() is not None:
                    log.error("publishing the run's artifacts failed too", exc_info=part.exception())
            raise
    failed = [part.exception() for part in parts if part.exception() is not None]
    if failed:
        published.set_exception(failed[0])
        raise failed[0]
    published.set_result({key: id_ for part in parts for key, id_ in part.result().items()})


def publish_training_artifacts(data_dir: str | os.PathLike, run_id: str) -> dict[str, str]:
    """Inside a flow or task run: the `training-run` table artifact (the run's row of
    `training_runs`) and the `training-run-chart` image artifact (loss curve and held-out success by
    level, when the run logged either). Returns key -> id; outside a run, {} (as above)."""
    if not _in_run():
        log.warning("publish_training_artifacts: not inside a Prefect flow or task run; no artifacts created")
        return {}
    from prefect.artifacts import create_image_artifact, create_table_artifact

    with Warehouse(data_dir, read_only=True) as wh:
        rows = training_runs(wh, run_ids=[run_id])
        curves = training_curves(wh, [run_id])
    if not rows:
        raise ValueError(f"no training run {run_id!r} in {data_dir}")
    ids = {"training-run": str(create_table_artifact(table=rows, key="training-run",
                                                     description=f"Training run {run_id}"))}
    png = training_chart(curves)
    if png is not None:
        ids["training-run-chart"] = str(create_image_artifact(
            image_url=data_uri(png), key="training-run-chart",
            description=f"Training run {run_id}: loss curve and held-out success by level"))
    return ids


# HTML report -------------------------------------------------------------------------------------

_CSS = """body{font-family:sans-serif;margin:2em;color:#222;max-width:70em}
table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:0.85em}
th,td{border:1px solid #ccc;padding:0.2em 0.5em;text-align:left}th{background:#eee}
td.num{text-align:right}img{display:block;margin:0.5em 0 1.5em}.meta{color:#555}"""


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f'<td class="num">{value:.4g}</td>'
    if isinstance(value, int) and not isinstance(value, bool):
        return f'<td class="num">{value}</td>'
    text = "" if value is None else value if isinstance(value, str) else json.dumps(value)
    return f"<td>{html.escape(text)}</td>"


def html_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>No rows.</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(_cell(v) for v in r.values()) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(data: dict[str, Any], data_dir: str, generated: str) -> str:
    counts = ", ".join(f"{n} {t}" for t, n in data["counts"].items())
    parts = [f"<h1>gymfoundry report</h1><p class=\"meta\">Data dir: <code>{html.escape(data_dir)}</code><br>"
             f"Generated: {html.escape(generated)}<br>Rows: {html.escape(counts)}</p>"]
    for name, png in charts(data).items():
        parts.append(f"<h2>{html.escape(CHART_TITLES[name])}</h2>"
                     f"<img src=\"{data_uri(png)}\" alt=\"{html.escape(CHART_TITLES[name])}\" "
                     f"width=\"{int(FIGSIZE[0] * DPI)}\" height=\"{int(FIGSIZE[1] * DPI)}\">")
    for name, title in TITLES.items():
        parts.append(f"<h2>{html.escape(title)}</h2>{html_table(data[name])}")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>gymfoundry report</title>"
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")


def write_html_report(data_dir: str | os.PathLike, out_path: str | os.PathLike) -> Path:
    """Write one self-contained HTML file (charts as data URIs, inline CSS, no scripts and no URL)
    of every family's tables and charts; returns its path."""
    data = read_report(data_dir)
    generated = datetime.now(timezone.utc).isoformat(timespec="seconds")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(data, str(Path(data_dir).resolve()), generated), encoding="utf-8")
    return out
