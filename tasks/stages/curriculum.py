"""Curriculum weights per family x difficulty level, from measured success rates.

A cell's success rate p is measured for one policy (id and version) over its rollouts, one
count per rollout, model outcomes only (environment faults and the like say nothing about the
model), smoothed with a Beta prior: p = (successes + prior) / (outcomes + 2 * prior), so a cell
with few rollouts is neither 0 nor 1. Learnability turns p into a weight: `p(1-p)` (default:
most weight where the policy succeeds half the time), `1-p` (hardest first), `uniform`, or any
callable. The mixture is those weights normalised over the cells a dataset holds. A row's
sampling weight is its cell's share divided among the cell's rollouts, then among the rows of
each rollout, scaled so the weights average 1: a rollout split into many rows (DPO pairs)
never counts for more than one that is not.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gymfoundry.envs.records import MODEL_OUTCOMES, Termination

Learnability = Callable[[float], float]

LEARNABILITY: dict[str, Learnability] = {
    "p(1-p)": lambda p: p * (1.0 - p),
    "1-p": lambda p: 1.0 - p,
    "uniform": lambda p: 1.0,
}


def cell(family: str, level: int) -> str:
    return f"{family}/{level}"


def learnability_fn(learnability: str | Learnability) -> tuple[str, Learnability]:
    if callable(learnability):
        return getattr(learnability, "__name__", "custom"), learnability
    if learnability not in LEARNABILITY:
        raise ValueError(f"unknown learnability {learnability!r}; use one of {sorted(LEARNABILITY)} or a callable")
    return learnability, LEARNABILITY[learnability]


def success_rates(outcomes: Iterable[Mapping[str, Any]], prior: float = 1.0) -> dict[str, float]:
    """`outcomes`: one mapping per rollout with task_family, difficulty and termination."""
    successes: Counter = Counter()
    counted: Counter = Counter()
    for o in outcomes:
        if Termination(o["termination"]) not in MODEL_OUTCOMES:
            continue
        key = cell(o["task_family"], o["difficulty"])
        counted[key] += 1
        successes[key] += o["termination"] == Termination.success.value
    return {k: (successes[k] + prior) / (counted[k] + 2 * prior) for k in sorted(counted)}


def mixture(rates: Mapping[str, float], cells: Iterable[str], learnability: Learnability,
            prior_rate: float = 0.5) -> dict[str, float]:
    """Shares of the sampling weight per cell; a cell never measured counts at `prior_rate`."""
    weights = {c: max(0.0, float(learnability(rates.get(c, prior_rate)))) for c in sorted(set(cells))}
    total = sum(weights.values())
    if not weights:
        return {}
    if total == 0:
        return {c: 1.0 / len(weights) for c in weights}
    return {c: w / total for c, w in weights.items()}


def row_weights(cells: Sequence[str], owners: Sequence[str], shares: Mapping[str, float]) -> list[float]:
    """One weight per row, given each row's cell and owner: its cell's share, split evenly among
    the cell's owners (rollouts, or tasks), then among each owner's rows; scaled to average 1."""
    rows_of = Counter(zip(cells, owners))
    owners_in: dict[str, set] = defaultdict(set)
    for c, o in zip(cells, owners):
        owners_in[c].add(o)
    raw = [shares.get(c, 0.0) / len(owners_in[c]) / rows_of[(c, o)] for c, o in zip(cells, owners)]
    total = sum(raw)
    return [round(w * len(cells) / total, 9) if total else 1.0 for w in raw]
