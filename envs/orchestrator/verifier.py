"""Outcome verifier and progress potential of the orchestrator family.

A success is a `finish` after every sub-task's latest delegation succeeded, each verdict given by
the sub-task family's own outcome verifier (with its own three checks) on its sub-agent's episode.
Delegating a sub-task again after it succeeded is a constraint violation: work spent for nothing,
and the shape of reward hacking that counting sub-agents would invite.

Three checks: `observation` from the stage results the main agent was shown, `invariants` from
the final hidden state, `hidden_variation` from a fresh replay of the main agent's calls (every
sub-agent episode played again from its seed must reach the same verdicts; each of those verdicts
already carries its family's hidden variation). Replays use the default frozen sub-agents."""

from __future__ import annotations

from typing import Any

from gymfoundry.envs.delegation import is_default
from gymfoundry.envs.records import CheckResult, OutcomeReport, Step, TaskSpec
from gymfoundry.envs.scripted import tool_result
from gymfoundry.envs.verifier import ReplayVerifier, calls_of

from .facts import OrchestratorFacts
from .world import OrchestratorEnv


def judge(facts: OrchestratorFacts, state: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(why the work is incomplete, the constraint violations), from a hidden state."""
    incomplete, violations, done = [], [], set()
    for n, stage in enumerate(state["delegations"]["stages"], start=1):
        for result in stage:
            if result["subtask"] in done:
                violations.append(f"{result['subtask']} was delegated again in stage {n} after it had succeeded")
            if result["verdict"] == "succeeded":
                done.add(result["subtask"])
    latest = latest_verdicts(state["delegations"]["stages"])
    for sub in facts.subtasks:
        if sub not in latest:
            incomplete.append(f"{sub} was never delegated")
        elif latest[sub] != "succeeded" and sub not in done:
            incomplete.append(f"{sub} did not succeed (its last attempt failed)")
    if state["finished"] is None:
        incomplete.append("the episode did not finish")
    return incomplete, violations


def latest_verdicts(stages: list[list[dict[str, Any]]]) -> dict[str, str]:
    return {r["subtask"]: r["verdict"] for stage in stages for r in stage}


class OrchestratorVerifier(ReplayVerifier):
    verifier_id = "orchestrator-outcome"
    # bump when a verdict or Φ changes; `gymfoundry reverify` re-judges stored rollouts. 2: Φ after the
    # finish follows the verdict, and is 0 once a success was delegated again
    version = "2"
    family = "orchestrator"
    not_applicable = {"crafted_disagreement": (
        "the orchestrator's verdict is its sub-tasks' verdicts, each from its own family's verifier with its "
        "own three checks (and that family's crafted disagreement); the main agent's calls add no observation "
        "that could differ from the state")}

    def new_env(self) -> OrchestratorEnv:
        return OrchestratorEnv(outcome_fn=None)

    def verify(self, task: TaskSpec, steps: list[Step], final_state: dict[str, Any] | None = None) -> OutcomeReport:
        facts, calls = self.facts(task), calls_of(steps)
        final = self.final_state(task, calls) if final_state is None else final_state
        incomplete, violations = judge(facts, final)
        checks = {"observation": _observation(facts, steps), "invariants": _invariants(facts, final),
                  "hidden_variation": self._replayed(task, calls, final)}
        success = not incomplete and not violations
        reasons = incomplete + violations
        for name in ("invariants", "hidden_variation"):
            if success and not checks[name].passed:
                success = False
                reasons += [f"{name}: {r}" for r in checks[name].reasons]
        return OutcomeReport(verifier_id=self.verifier_id, verifier_version=self.version, success=success,
                             completed=not incomplete, regression=False, constraint_violation=bool(violations),
                             reasons=reasons, checks=checks)

    def _replayed(self, task: TaskSpec, calls, final: dict[str, Any]) -> CheckResult:
        subtasks = final["subtasks"]
        if not all(is_default(r, TaskSpec.model_validate(subtasks[r["subtask"]]))
                   for stage in final["delegations"]["stages"] for r in stage):
            return CheckResult(passed=True, reasons=[
                "not replayed: sub-agents other than the default frozen policy played this episode"])
        replayed = self.final_state(task, calls)["delegations"]["stages"]
        seen = [[(r["subtask"], r["verdict"]) for r in stage] for stage in final["delegations"]["stages"]]
        again = [[(r["subtask"], r["verdict"]) for r in stage] for stage in replayed]
        reasons = [] if seen == again else [f"a fresh replay of the delegations gives {again}, the episode {seen}"]
        return CheckResult(passed=not reasons, reasons=reasons)

    def potential(self, task: TaskSpec, state: dict[str, Any]) -> float:
        """Φ in [0, 1]: 0.9 times the share of sub-tasks that have succeeded; after the finish it
        follows the verdict of the state (`judge`): 1.0 for a success, 0.0 otherwise. A sub-task
        delegated again after it succeeded is a violation no success can follow: 0.0 from then on,
        so that delegation loses the progress made. (The verdict's replay check is left out: it
        re-plays the same calls, and only a sub-agent that is not deterministic can fail it.)"""
        facts = self.facts(task)
        incomplete, violations = judge(facts, state)
        if violations:
            return 0.0
        if state["finished"] is not None:
            return 0.0 if incomplete else 1.0
        done = {r["subtask"] for stage in state["delegations"]["stages"] for r in stage if r["verdict"] == "succeeded"}
        return 0.9 * len(done & set(facts.subtasks)) / len(facts.subtasks)


def _observation(facts: OrchestratorFacts, steps: list[Step]) -> CheckResult:
    """From what the main agent was shown: the stage results, and an accepted finish."""
    stages, finished = [], False
    for step in steps:
        result = tool_result(step.result or "") if step.tool_call is not None else None
        if result is None:
            continue
        if step.tool_call.name == "delegate":
            stages.append(result["results"])
        elif step.tool_call.name == "finish":
            finished = True
    shown = latest_verdicts(stages)
    reasons = [f"{s} was not shown succeeding" for s in facts.subtasks if shown.get(s) != "succeeded"]
    if not finished:
        reasons.append("no accepted finish")
    return CheckResult(passed=not reasons, reasons=reasons)


def _invariants(facts: OrchestratorFacts, state: dict[str, Any]) -> CheckResult:
    incomplete, violations = judge(facts, state)
    return CheckResult(passed=not incomplete and not violations, reasons=incomplete + violations)
