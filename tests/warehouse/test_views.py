"""The analysis views answer what docs/warehouse.md says they answer, reduced per rollout."""

from __future__ import annotations

import pytest

from gymfoundry.envs.records import TaskRejection, Termination


def test_analysis_views(wh, build):
    tasks = [build.task("inventory", n) for n in range(3)]
    ends = [Termination.success, Termination.success, Termination.failure, Termination.env_fault,
            Termination.env_fault, Termination.timeout, Termination.env_bug, Termination.inference_fault]
    rollouts = [build.rollout(tasks[i % 3], seed=i, termination=t) for i, t in enumerate(ends)]
    scores = [build.score(rollouts[0], i, score=s) for i, s in enumerate([0.0, 0.0, 0.6])]
    scores += [build.score(rollouts[1], 0, score=0.8)]
    rejections = [TaskRejection(task_id=f"t-{n}", family="inventory", stage="validate",
                                reason=f"reference needs {n + 20} steps, budget allows {n + 10}") for n in range(2)]
    wh.land(tasks=tasks, rollouts=rollouts, scores=scores, rejections=rejections).checked()

    (cell,) = wh.sql("select * from success_by_cell").to_pylist()
    assert cell["difficulty_level"] == 2 and cell["rollouts"] == 8 and cell["tasks"] == 3
    assert cell["model_outcomes"] == 3 and cell["successes"] == 2 and cell["env_faults"] == 2
    assert cell["env_bugs"] == 1 and cell["inference_faults"] == 1
    assert cell["success_rate"] == pytest.approx(2 / 3)  # faults, env bugs and timeouts say nothing about the model

    classes = {r["termination"]: r for r in wh.sql("select * from failure_classes").to_pylist()}
    assert {k: v["rollouts"] for k, v in classes.items()} == {"success": 2, "failure": 1, "env_fault": 2,
                                                               "timeout": 1, "env_bug": 1, "inference_fault": 1}
    assert sum(v["share"] for v in classes.values()) == pytest.approx(1.0)

    (rules,) = wh.sql("select * from reward_by_layer").to_pylist()
    assert rules["layer"] == "rules" and rules["steps"] == 4 and rules["rollouts"] == 2
    assert rules["mean"] == pytest.approx(0.35) and rules["rollout_mean"] == pytest.approx(0.5)  # (0.2 + 0.8) / 2
    assert rules["min"] == 0.0 and rules["max"] == 0.8

    (reason,) = wh.sql("select * from rejections_by_reason").to_pylist()
    assert reason["reason_kind"] == "reference needs N steps, budget allows N" and reason["tasks"] == 2


def test_reward_by_layer_reads_the_same_whatever_order_the_scores_landed_in(tmp_path, build):
    """A statistic is a function of the rows, not of the order DuckDB happened to add them in: the same
    scores landed in opposite orders (and read with several threads) give bit-identical means."""
    from gymfoundry.warehouse.store import Warehouse

    tasks = [build.task("inventory", n) for n in range(3)]
    rollouts = [build.rollout(tasks[i % 3], seed=i) for i in range(60)]
    values = [((7 * i + 3 * j) % 11) / 7 - 0.61 for i in range(60) for j in range(3)]
    scores = [build.score(r, j, score=values[i * 3 + j]) for i, r in enumerate(rollouts) for j in range(3)]
    reads = []
    for n, order in enumerate((scores, scores[::-1])):
        with Warehouse(tmp_path / str(n)) as wh:
            wh.land(tasks=tasks, rollouts=rollouts[::1 - 2 * n], scores=order).checked()
            wh.sql("SET threads = 4")
            reads += [wh.sql("select * from reward_by_layer").to_pylist() for _ in range(3)]
    assert all(read == reads[0] for read in reads)
    assert reads[0][0]["steps"] == 180 and reads[0][0]["rollouts"] == 60
