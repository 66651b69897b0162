"""PRM layer 1: rule rewards per step, generic over families, vectorised with polars.

    rule_frame(rollouts, tasks, profiles, potentials) -> polars.DataFrame
    score_rules(rollouts, tasks, profiles, potentials) -> list[StepScore]

- `tasks`: task_id -> TaskSpec (needed for progress).
- `profiles`: family -> DomainProfile (tool categories and `score_weights.rules`).
- `potentials`: family -> callable (task, steps) -> [Φ(s_0), Φ(s_1), ..., Φ(s_n)], the
  potential before the first step and after each step, obtained by replaying the steps
  from the task's initial state (e.g. `InventoryVerifier().potentials`). A family without
  one gets progress 0.

Components per step: `valid_call` (-1 when the action did not parse or failed the schema),
`permitted` (-1 for a refused tool or permission), `non_redundant` (-1 for a read identical in
name and arguments to an earlier read of the same rollout with no write between),
`progress` (Φ(s') - Φ(s)). score = clip(Σ w_c · c, -1, 1), w from the family's profile.
An env_fault step is never the model's mistake: all its components are 0."""

from __future__ import annotations

import json
from collections.abc import Callable

import polars as pl

from envs.profile import DomainProfile
from envs.records import Rollout, Step, StepScore, TaskSpec

RULES_VERSION = "1"
COMPONENTS = ("valid_call", "permitted", "non_redundant", "progress")
INVALID_KINDS = ["invalid_action", "invalid_json", "no_tool_call", "invalid_tool_call", "invalid_arguments",
                 "action_too_large", "multiple_tool_calls", "unknown_tool"]
REFUSED_KINDS = ["tool_not_allowed", "permission_denied"]
PotentialFn = Callable[[TaskSpec, list[Step]], list[float]]


def rule_frame(rollouts: list[Rollout], tasks: dict[str, TaskSpec], profiles: dict[str, DomainProfile],
               potentials: dict[str, PotentialFn]) -> pl.DataFrame:
    rows = []
    for rollout in rollouts:
        profile = profiles[rollout.family]
        phi = _potentials(rollout, tasks, potentials)
        for i, step in enumerate(rollout.steps):
            call = step.tool_call
            category = profile.category(call.name) if call else None
            rows.append({
                "rollout_id": rollout.rollout_id, "family": rollout.family, "step_index": step.index,
                "order": i, "error": step.error, "tool": call.name if call else None,
                "args": json.dumps(call.arguments, sort_keys=True, default=str) if call else None,
                "category": category.value if category else None,
                "phi_before": phi[i], "phi_after": phi[i + 1],
            })
    schema = {"rollout_id": pl.String, "family": pl.String, "step_index": pl.Int64, "order": pl.Int64,
              "error": pl.String, "tool": pl.String, "args": pl.String, "category": pl.String,
              "phi_before": pl.Float64, "phi_after": pl.Float64}
    frame = pl.DataFrame(rows, schema=schema).sort("rollout_id", "order")

    fault = pl.col("error").fill_null("") == "env_fault"
    reached_tool = pl.col("tool").is_not_null() & ~pl.col("error").fill_null("").is_in(
        INVALID_KINDS + REFUSED_KINDS + ["env_fault"])
    is_read = reached_tool & (pl.col("category") == "read")
    is_write = reached_tool & pl.col("category").is_not_null() & (pl.col("category") != "read")
    frame = frame.with_columns(
        # Reads between the same two writes share an epoch; a repeat within an epoch is redundant.
        epoch=is_write.cast(pl.Int64).cum_sum().over("rollout_id"), is_read=is_read)
    frame = frame.with_columns(
        seen_before=pl.int_range(pl.len()).over("rollout_id", "epoch", "is_read", "tool", "args"))
    frame = frame.with_columns(
        valid_call=pl.when(pl.col("error").is_in(INVALID_KINDS)).then(-1.0).otherwise(0.0),
        permitted=pl.when(pl.col("error").is_in(REFUSED_KINDS)).then(-1.0).otherwise(0.0),
        non_redundant=pl.when(pl.col("is_read") & (pl.col("seen_before") > 0)).then(-1.0).otherwise(0.0),
        progress=pl.when(fault).then(0.0).otherwise(pl.col("phi_after") - pl.col("phi_before")),
    )

    weights = pl.DataFrame(
        [{"family": fam, **{f"w_{c}": float(p.score_weights.rules.get(c, 0.0)) for c in COMPONENTS}}
         for fam, p in profiles.items()],
        schema={"family": pl.String, **{f"w_{c}": pl.Float64 for c in COMPONENTS}})
    frame = frame.join(weights, on="family", how="left")
    total = sum(pl.col(f"w_{c}") * pl.col(c) for c in COMPONENTS)
    return frame.with_columns(score=total.clip(-1.0, 1.0)).select(
        "rollout_id", "family", "step_index", "error", "tool", *COMPONENTS, "score")


def score_rules(rollouts: list[Rollout], tasks: dict[str, TaskSpec], profiles: dict[str, DomainProfile],
                potentials: dict[str, PotentialFn]) -> list[StepScore]:
    frame = rule_frame(rollouts, tasks, profiles, potentials)
    return [StepScore(rollout_id=row["rollout_id"], step_index=row["step_index"], layer="rules",
                      scorer_id="rules", scorer_version=RULES_VERSION, score=round(row["score"], 6),
                      components={c: round(row[c], 6) for c in COMPONENTS})
            for row in frame.iter_rows(named=True)]


def _potentials(rollout: Rollout, tasks: dict[str, TaskSpec], potentials: dict[str, PotentialFn]) -> list[float]:
    fn = potentials.get(rollout.family)
    if fn is None:
        return [0.0] * (len(rollout.steps) + 1)
    if rollout.task_id not in tasks:
        raise KeyError(f"rollout {rollout.rollout_id} needs task {rollout.task_id} for its progress")
    phi = fn(tasks[rollout.task_id], rollout.steps)
    if len(phi) != len(rollout.steps) + 1:
        raise ValueError(f"potential of {rollout.family} returned {len(phi)} values for {len(rollout.steps)} steps")
    return phi
