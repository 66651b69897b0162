"""Analysis views over the table views, for SQL users (each is documented in docs/warehouse.md).

Rates are reduced per rollout, never per step or dataset row; success rates count model
outcomes only (environment and grader faults, timeouts, policy and verifier errors say nothing
about the model), and are NULL where there is none.
"""

from __future__ import annotations

import duckdb

from gymfoundry.envs.records import MODEL_OUTCOMES

_MODEL = ", ".join(f"'{t.value}'" for t in sorted(MODEL_OUTCOMES, key=lambda t: t.value))


def _binomial(n: str, k: str) -> str:
    """C(n, k) in exact integer arithmetic (each partial product is itself a binomial, so the
    integer division is exact); 0 when n < k."""
    return f"list_reduce([1::HUGEINT] || range(1, {k} + 1), lambda acc, x: acc * ({n} - {k} + x) // x)"

ANALYSIS_VIEWS: dict[str, str] = {
    # Success by family x difficulty x policy version. success_rate is NULL in a cell with no model
    # outcome (never 0 or 1); `excluded` rollouts are the others, counted by class beside it.
    "success_by_cell": f"""
        SELECT r.task_family, t.difficulty_level, r.policy_id, r.policy_version,
               count(*) AS rollouts,
               count(*) FILTER (WHERE r.termination IN ({_MODEL})) AS model_outcomes,
               count(*) FILTER (WHERE r.success) AS successes,
               count(*) FILTER (WHERE r.success)
                   / nullif(count(*) FILTER (WHERE r.termination IN ({_MODEL})), 0) AS success_rate,
               count(*) FILTER (WHERE r.termination = 'env_fault') AS env_faults,
               count(*) FILTER (WHERE r.termination = 'env_bug') AS env_bugs,
               count(*) FILTER (WHERE r.termination = 'inference_fault') AS inference_faults,
               count(DISTINCT r.task_id) AS tasks,
               count(*) FILTER (WHERE r.termination NOT IN ({_MODEL})) AS excluded,
               count(*) FILTER (WHERE r.termination = 'grader_fault') AS grader_faults,
               count(*) FILTER (WHERE r.termination = 'verifier_error') AS verifier_errors,
               count(*) FILTER (WHERE r.termination = 'policy_error') AS policy_errors,
               count(*) FILTER (WHERE r.termination = 'timeout') AS timeouts
        FROM rollouts r JOIN tasks t USING (task_id)
        GROUP BY 1, 2, 3, 4""",
    # Unbiased pass@k = 1 - C(n-c, k)/C(n, k) and tau-bench's pass^k = C(c, k)/C(n, k) for k = 1..n,
    # n = a task's model outcomes (one count per rollout), c = its successes. Rows with a task_id are
    # per task; rows without average, for each k, the tasks of the cell that have at least k samples.
    # Both ratios are of exact integers, so each value is the double nearest the true fraction.
    "pass_at_k": f"""
        WITH per_task AS (
            SELECT r.task_family, t.difficulty_level, r.policy_id, r.policy_version, r.task_id,
                   count(DISTINCT r.rollout_id) AS n,
                   count(DISTINCT r.rollout_id) FILTER (WHERE r.success) AS c
            FROM rollouts r JOIN tasks t USING (task_id)
            WHERE r.termination IN ({_MODEL})
            GROUP BY 1, 2, 3, 4, 5),
        per_k AS (SELECT *, unnest(range(1, n + 1)) AS k FROM per_task),
        per_task_k AS (
            SELECT task_family, difficulty_level, policy_id, policy_version, task_id, k, n, c,
                   ({_binomial('n', 'k')} - {_binomial('n - c', 'k')}) / {_binomial('n', 'k')} AS pass_at_k,
                   {_binomial('c', 'k')} / {_binomial('n', 'k')} AS pass_hat_k
            FROM per_k)
        SELECT task_family, difficulty_level, policy_id, policy_version, task_id, k,
               1::BIGINT AS tasks, n AS samples, c AS successes, pass_at_k, pass_hat_k
        FROM per_task_k
        UNION ALL
        SELECT task_family, difficulty_level, policy_id, policy_version, NULL AS task_id, k,
               count(*) AS tasks, sum(n)::BIGINT AS samples, sum(c)::BIGINT AS successes,
               avg(pass_at_k ORDER BY task_id) AS pass_at_k, avg(pass_hat_k ORDER BY task_id) AS pass_hat_k
        FROM per_task_k
        GROUP BY 1, 2, 3, 4, 6""",
    # How rollouts end, per family and policy version.
    "failure_classes": """
        SELECT task_family, policy_id, policy_version, termination, count(*) AS rollouts,
               count(*) / sum(count(*)) OVER (PARTITION BY task_family, policy_id, policy_version) AS share
        FROM rollouts
        GROUP BY 1, 2, 3, 4""",
    # Step rewards per layer and scorer version; rollout_mean averages each rollout's mean step reward.
    # Floating sums name their order (here and below): DuckDB adds in thread order otherwise, and the
    # same report read twice would differ in the last digit.
    # A layer with no score of status ok (the judge when none is configured) has no row.
    "reward_by_layer": """
        SELECT * FROM (
            SELECT task_family, layer, scorer_id, scorer_version, count(*) AS steps, count(score) AS scored,
                   avg(score ORDER BY rollout_id, step_index) AS mean,
                   stddev_samp(score ORDER BY rollout_id, step_index) AS stddev, min(score) AS min,
                   quantile_cont(score, 0.1) AS p10, quantile_cont(score, 0.5) AS p50,
                   quantile_cont(score, 0.9) AS p90, max(score) AS max
            FROM step_scores GROUP BY 1, 2, 3, 4
            HAVING count(*) FILTER (WHERE status = 'ok') > 0)
        JOIN (
            SELECT task_family, layer, scorer_id, scorer_version, count(*) AS rollouts,
                   avg(rollout_mean ORDER BY rollout_id) AS rollout_mean
            FROM (SELECT task_family, layer, scorer_id, scorer_version, rollout_id,
                         avg(score ORDER BY step_index) AS rollout_mean
                  FROM step_scores GROUP BY 1, 2, 3, 4, 5)
            GROUP BY 1, 2, 3, 4)
        USING (task_family, layer, scorer_id, scorer_version)""",
    # Delegating rollouts: critical steps (per stage the main agent's steps plus its longest sub-agent's)
    # beside the serial total, with the sub-agents' episodes landed for each (`sub_rollouts`).
    "critical_steps": """
        SELECT r.task_family, r.rollout_id, r.task_id, r.policy_id, r.policy_version, r.termination, r.success,
               CAST(json_extract(r.delegation, '$.critical_steps') AS BIGINT) AS critical_steps,
               CAST(json_extract(r.delegation, '$.serial_steps') AS BIGINT) AS serial_steps,
               CAST(json_array_length(json_extract(r.delegation, '$.stages')) AS BIGINT) AS stages,
               (SELECT count(*) FROM sub_rollouts s WHERE s.parent_rollout_id = r.rollout_id) AS sub_rollouts,
               (SELECT count(*) FILTER (WHERE s.success) FROM sub_rollouts s
                WHERE s.parent_rollout_id = r.rollout_id) AS sub_successes
        FROM rollouts r
        WHERE r.delegation IS NOT NULL""",
    # Rejected tasks by stage and reason; reason_kind drops the numbers and details.
    "rejections_by_reason": """
        SELECT task_family, stage,
               regexp_replace(split_part(reason, ':', 1), '[0-9]+', 'N', 'g') AS reason_kind,
               count(*) AS tasks, min(reason) AS example
        FROM task_rejections
        GROUP BY 1, 2, 3""",
    # What each dataset is made of, per family and difficulty, with its share of the sampling weight.
    "dataset_composition": """
        SELECT d.dataset_id, d.kind, r.task_family, r.difficulty, count(*) AS rows,
               count(DISTINCT r.task_id) AS tasks,
               len(list_distinct(flatten(list(r.rollout_ids)))) AS rollouts,
               sum(r.weight ORDER BY r.row_id) AS weight,
               sum(r.weight ORDER BY r.row_id)
                   / sum(sum(r.weight ORDER BY r.row_id)) OVER (PARTITION BY d.dataset_id ORDER BY r.task_family, r.difficulty
                                                               ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS weight_share
        FROM dataset_rows r JOIN datasets d USING (dataset_id)
        GROUP BY 1, 2, 3, 4""",
}


def create_analysis_views(con: duckdb.DuckDBPyConnection, temporary: bool = False) -> None:
    kind = "TEMP VIEW" if temporary else "VIEW"
    for name, sql in ANALYSIS_VIEWS.items():
        con.execute(f"CREATE OR REPLACE {kind} {name} AS {sql}")
