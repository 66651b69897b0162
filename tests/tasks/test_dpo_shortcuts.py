"""DPO pairs never teach a shortcut: two successes are compared by their verdicts, never by their
mean step reward, which favours the shortest. The episodes are played through the real browser
env and runtime: the reference of an infeasible task (it opens the page that shows the task
cannot be done, then reports it) and the 1-step `report_infeasible` sent before looking at
anything. The blind ending gets the verdict and step reward a gameable verifier gave it (a
verified success; Φ from 0 to 1 in its one step), as the browser verifier did before it asked
for the ending's evidence."""

from __future__ import annotations

import json

import pytest

from gymfoundry.envs.records import CheckResult, OutcomeReport, Termination
from gymfoundry.tasks.stages.assemble import dpo_rows
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.rollout.episodes import run_episode


class Calls:
    """A policy that sends the given calls, one per turn."""

    policy_id, version = "calls", "1"

    def __init__(self, calls):
        self.calls = calls

    def reset(self, seed=None):
        self.turn = 0

    def act(self, observation):
        call = self.calls[self.turn]
        self.turn += 1
        return "<tool_call>" + json.dumps({"name": call.name, "arguments": call.arguments}) + "</tool_call>"


@pytest.fixture(scope="module")
def played():
    task = next(t for t in generate_tasks("browser", 30, seed=1)
                if t.hidden.reference[-1].name == "report_infeasible" and len(t.hidden.reference) >= 3)
    reference = task.hidden.reference
    honest = run_episode(task, Calls(reference), seed=1)
    blind = run_episode(task, Calls(reference[-1:]), seed=2)
    done = reference[-1].model_copy(update={"name": "answer", "arguments": {"text": "Done."}})
    failure = run_episode(task, Calls([*reference[:-1], done]), seed=3)
    assert honest.termination == Termination.success and len(blind.steps) == 1
    assert failure.termination == Termination.failure
    return task, honest, blind, failure


def graded_success(rollout, like: OutcomeReport, failed: tuple[str, ...] = (), side_effects: tuple[str, ...] = ()):
    """`rollout` as a verified success whose verdict has `like`'s verifier and checks, those in
    `failed` not passed (a check that notices but does not gate)."""
    checks = {name: CheckResult(passed=name not in failed, reasons=[f"{name} saw nothing"] if name in failed else [])
              for name in like.checks}
    outcome = OutcomeReport(verifier_id=like.verifier_id, verifier_version=like.verifier_version, success=True,
                            completed=True, regression=False, constraint_violation=False,
                            side_effects=list(side_effects), checks=checks)
    return rollout.model_copy(update={"termination": Termination.success, "termination_reason": "verified",
                                      "outcome": outcome})


def rewards(honest, blind, failure):
    """The process reward as it was: Φ 0 -> 1 over the honest episode's steps and in the blind
    one's single step; the failure's wrong ending scores below the honest one's ending."""
    n = len(honest.steps)
    return {honest.rollout_id: [1 / n] * n, blind.rollout_id: [1.0],
            failure.rollout_id: [1 / n] * (n - 1) + [-0.5]}


def pairs(rows):
    return [(r.pair_type, r.chosen_rollout_id, r.rejected_rollout_id) for r in rows]


def test_two_successes_with_the_same_verdict_are_never_paired(played):
    task, honest, blind, _ = played
    blind = graded_success(blind, honest.outcome)  # the blind ending as it was graded: every check passed
    rows = dpo_rows({task.task_id: task}, [honest, blind], rewards(honest, blind, played[3]))
    # Before: values 2.0 against 1 + 1/n, so the blind 1-step ending was chosen over the honest
    # success by more than the margin.
    assert rows == []


def test_a_success_that_saw_no_evidence_is_never_chosen(played):
    task, honest, blind, failure = played
    blind = graded_success(blind, honest.outcome, failed=("observation",))
    rows = dpo_rows({task.task_id: task}, [honest, blind, failure], rewards(honest, blind, failure))
    k = len(honest.steps) - 1
    assert pairs(rows) == [("trajectory", honest.rollout_id, failure.rollout_id),
                           ("verdict", honest.rollout_id, blind.rollout_id),
                           ("step", honest.rollout_id, failure.rollout_id)]
    verdict = rows[1]
    assert verdict.margin == 1.0 and verdict.step_index is None  # one component better: the observation
    assert [m["role"] for m in verdict.rejected] == ["assistant"]
    assert verdict.rejected[0]["tool_calls"][0]["function"]["name"] == "report_infeasible"
    assert rows[2].step_index == k and rows[2].margin == pytest.approx(1 / (k + 1) + 0.5)
    n = k + 1  # success + mean step reward, against the failure's mean
    assert rows[0].margin == pytest.approx(1 + 1 / n - ((n - 1) / n - 0.5) / n)


def test_successes_each_worse_somewhere_are_not_ranked(played):
    task, honest, blind, _ = played
    honest = graded_success(honest, honest.outcome, side_effects=("opened a page twice",))
    blind = graded_success(blind, honest.outcome, failed=("observation",))
    assert dpo_rows({task.task_id: task}, [honest, blind], rewards(honest, blind, played[3])) == []


def test_other_verifier_versions_are_not_compared(played):
    task, honest, blind, _ = played
    older = honest.outcome.model_copy(update={"verifier_version": honest.outcome.verifier_version + "-old"})
    blind = graded_success(blind, older, failed=("observation",))
    assert dpo_rows({task.task_id: task}, [honest, blind], rewards(honest, blind, played[3])) == []
