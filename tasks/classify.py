"""Stage: classify how an episode ended. Environment faults are never model failures, and
success is decided by the outcome verifier, never by the episode merely terminating."""

from __future__ import annotations

from envs.records import OutcomeReport, Step, Termination


def classify(steps: list[Step], *, terminated: bool, truncated: bool, end_info: dict,
             outcome: OutcomeReport | None, policy_error: str | None = None,
             env_error: str | None = None, verifier_error: str | None = None) -> tuple[Termination, str]:
    if policy_error:
        return Termination.policy_error, policy_error
    if env_error:
        return Termination.env_fault, env_error
    faults = [s for s in steps if s.error == "env_fault"]
    succeeded = outcome is not None and outcome.success and terminated
    if faults and not succeeded:
        return Termination.env_fault, f"{len(faults)} environment fault(s), first at step {faults[0].index}"
    if end_info.get("termination") == "timeout":
        return Termination.timeout, end_info.get("termination_reason", "time limit")
    if truncated:
        return Termination.truncated, end_info.get("termination_reason", "truncated")
    if not terminated:
        return Termination.truncated, "the policy stopped before the episode ended"
    if verifier_error:
        return Termination.verifier_error, verifier_error
    if outcome is None:
        return Termination.verifier_error, "no outcome verifier for this env"
    if outcome.success:
        return Termination.success, "; ".join(outcome.reasons) or "verified"
    # A verifier attributes a failure to the environment or to time with a failed check of that name
    # (e.g. the coding grader's sandbox crashed, or the submitted code hung the hidden tests).
    if _failed(outcome, "env_fault"):
        return Termination.env_fault, "; ".join(outcome.checks["env_fault"].reasons)
    if outcome.constraint_violation:
        return Termination.constraint_violation, "; ".join(outcome.reasons)
    if _failed(outcome, "timeout"):
        return Termination.timeout, "; ".join(outcome.checks["timeout"].reasons)
    return Termination.failure, "; ".join(outcome.reasons) or "outcome not achieved"


def _failed(outcome: OutcomeReport, check: str) -> bool:
    return check in outcome.checks and not outcome.checks[check].passed
