"""The pass_at_k view: unbiased pass@k and pass^k per task and per cell, exact on hand-made outcomes,
counting model outcomes only (one count per rollout)."""

from __future__ import annotations

from fractions import Fraction
from math import comb

from gymfoundry.envs.records import Rollout, Termination

S, F = Termination.success, Termination.failure


def exact(n: int, c: int, k: int) -> tuple[float, float]:
    return float(1 - Fraction(comb(n - c, k), comb(n, k))), float(Fraction(comb(c, k), comb(n, k)))


def test_pass_at_k_exact(wh, build):
    half, none, every = (build.task("inventory", n) for n in range(3))
    ends = [(half, [S, F, S, F, Termination.env_fault, Termination.env_bug, Termination.timeout,
                   Termination.policy_error, Termination.verifier_error]),
            (none, [F, F, Termination.env_fault]),
            (every, [S, S, S])]
    rollouts = [build.rollout(task, seed=i, termination=t) for task, ts in ends for i, t in enumerate(ts)]
    wh.land(tasks=[half, none, every], rollouts=rollouts + rollouts[:2]).checked()  # landing twice counts once

    rows = wh.sql("select * from pass_at_k").to_pylist()
    per_task = {(r["task_id"], r["k"]): r for r in rows if r["task_id"] is not None}
    assert {key for key in per_task} == ({(half.task_id, k) for k in range(1, 5)}
                                        | {(none.task_id, k) for k in (1, 2)}
                                        | {(every.task_id, k) for k in (1, 2, 3)})
    h = {k: per_task[(half.task_id, k)] for k in range(1, 5)}
    assert h[1]["samples"] == 4 and h[1]["successes"] == 2  # faults, env bugs, timeouts and errors left out
    assert h[1]["pass_at_k"] == 0.5 and h[1]["pass_hat_k"] == 0.5
    assert h[2]["pass_at_k"] == 5 / 6 and h[2]["pass_hat_k"] == 1 / 6
    assert h[3]["pass_at_k"] == 1.0 and h[3]["pass_hat_k"] == 0.0
    assert h[4]["pass_at_k"] == 1.0 and h[4]["pass_hat_k"] == 0.0
    for k in (1, 2):
        assert per_task[(none.task_id, k)]["pass_at_k"] == 0.0 and per_task[(none.task_id, k)]["pass_hat_k"] == 0.0
    for k in (1, 2, 3):
        assert per_task[(every.task_id, k)]["pass_at_k"] == 1.0 and per_task[(every.task_id, k)]["pass_hat_k"] == 1.0
    for (_, k), r in per_task.items():
        assert (r["pass_at_k"], r["pass_hat_k"]) == exact(r["samples"], r["successes"], k)

    cells = {r["k"]: r for r in rows if r["task_id"] is None}
    assert set(cells) == {1, 2, 3, 4}
    assert all(r["task_family"] == "inventory" and r["difficulty_level"] == 2 and r["policy_id"] == "scripted"
               and r["policy_version"] == "1" for r in cells.values())
    # each k averages the tasks with at least k samples
    assert [cells[k]["tasks"] for k in (1, 2, 3, 4)] == [3, 3, 2, 1]
    assert cells[1]["pass_at_k"] == (0.5 + 0.0 + 1.0) / 3 and cells[1]["pass_hat_k"] == (0.5 + 0.0 + 1.0) / 3
    assert cells[2]["pass_at_k"] == (5 / 6 + 0.0 + 1.0) / 3
    assert cells[2]["pass_hat_k"] == (1 / 6 + 0.0 + 1.0) / 3
    assert cells[3]["pass_at_k"] == 1.0 and cells[3]["pass_hat_k"] == 0.5
    assert cells[4]["pass_at_k"] == 1.0 and cells[4]["pass_hat_k"] == 0.0
    assert cells[1]["samples"] == 9 and cells[1]["successes"] == 5


def test_pass_at_k_apart_by_policy_version(wh, build):
    task = build.task("inventory", 0)
    old = [build.rollout(task, seed=i, termination=t) for i, t in enumerate([S, F])]
    new = [Rollout(**{**r.model_dump(exclude={"rollout_id", "termination", "outcome"}), "policy_version": "2",
                      "termination": S, "outcome": r.outcome.model_copy(update={"success": True})}) for r in old]
    assert {r.rollout_id for r in new}.isdisjoint(r.rollout_id for r in old)
    wh.land(tasks=[task], rollouts=old + new).checked()
    rows = wh.sql("select policy_version, k, pass_at_k, pass_hat_k from pass_at_k where task_id is null "
                  "order by all").to_pylist()
    assert [(r["policy_version"], r["k"], r["pass_at_k"], r["pass_hat_k"]) for r in rows] == [
        ("1", 1, 0.5, 0.5), ("1", 2, 1.0, 0.0), ("2", 1, 1.0, 1.0), ("2", 2, 1.0, 1.0)]
