"""Hand-built records (no env family involved) and a fresh warehouse per test."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gymfoundry.envs.records import (CheckResult, Cost, Difficulty, Hidden, OutcomeReport, Rollout, Source, Step, StepScore,
                          TaskRejection, TaskSpec, Termination, ToolCall)
from gymfoundry.warehouse import Warehouse


def make_task(family: str = "inventory", n: int = 0) -> TaskSpec:
    return TaskSpec(
        family=family, env_id=f"gymfoundry/{family}-v0", source=Source(generator="hand", version="1", seed=n),
        template_id=f"tpl-{n % 2}", goal=f"reserve item {n}", initial_state={"stock": {"a": n, "b": 2.5}},
        allowed_tools=["lookup", "reserve"], difficulty=Difficulty(level=2, features={"items": 3.0}),
        hidden=Hidden(reference=[ToolCall(name="reserve", arguments={"item": "a", "qty": 1}, id="c0")],
                      checks={"stock_after": {"a": n - 1}}, secrets=["s3cret"]),
    )


def make_rollout(task: TaskSpec, seed: int = 0, termination: Termination = Termination.success) -> Rollout:
    steps = [
        Step(index=0, observation="You see stock.", action_text='{"name": "lookup"}', thought="look first",
             tool_call=ToolCall(name="lookup", arguments={"item": "a"}, id="c1"), result="a: 3", reward=0.25,
             latency_s=0.01, token_ids=[1, 2, 3], logprobs=[-0.1, -0.2, -0.3], policy_version="p1"),
        Step(index=1, observation="a: 3", action_text="oops", tool_call=None, result="",
             error="invalid JSON", reward=-0.1),
        Step(index=2, observation="a: 3", tool_call=ToolCall(name="reserve", arguments={"item": "a", "qty": 1}),
             result="ok", reward=1.0),
    ]
    outcome = OutcomeReport(verifier_id="inventory", verifier_version="2", success=termination == "success",
                            completed=True, regression=False, constraint_violation=False,
                            side_effects=["email sent"], reasons=["reserved"],
                            checks={"stock": CheckResult(passed=True), "audit": CheckResult(passed=False,
                                                                                           reasons=["no log"])})
    return Rollout(task_id=task.task_id, family=task.family, env_id=task.env_id, env_version="0",
                   policy_id="scripted", policy_version="1", seed=seed, steps=steps, termination=termination,
                   termination_reason="done", outcome=outcome,
                   cost=Cost(steps=3, tool_calls=2, tokens=42, wall_time_s=1.5))


def make_score(rollout: Rollout, step_index: int, version: str = "1", score: float | None = 0.5) -> StepScore:
    return StepScore(rollout_id=rollout.rollout_id, step_index=step_index, layer="rules", scorer_id="rules",
                     scorer_version=version, score=score, components={"valid": 1.0, "progress": score or 0.0},
                     rationale=None)


def make_rejection(task: TaskSpec, stage: str = "validity") -> TaskRejection:
    return TaskRejection(task_id=task.task_id, family=task.family, stage=stage, reason="reference fails")


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


@pytest.fixture
def wh(data_dir):
    with Warehouse(data_dir) as warehouse:
        yield warehouse


@pytest.fixture
def build():
    """The record builders above, for tests (test modules do not import conftest)."""
    return SimpleNamespace(task=make_task, rollout=make_rollout, score=make_score, rejection=make_rejection)
