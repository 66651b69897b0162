"""Stage: classify how an episode ended. Success is decided by the outcome verifier, never by
the episode merely terminating, and an attempt touched by the environment is never a model
outcome: one step that met an environment fault or bug makes the whole attempt `env_fault` /
`env_bug`, whatever the verifier said. Counting a faulted success but not a faulted failure
made measured success rise with the fault rate; such attempts are retried from a clean state
instead (tasks/rollout/retry.py) and stay out of every success rate and dataset."""

from __future__ import annotations

from gymfoundry.envs.errors import ErrorKind
from gymfoundry.envs.records import OutcomeReport, Step, Termination
from gymfoundry.envs.timestep import EpisodeEnd

# Step error kinds that take an attempt out of the model's record, by precedence: a bug is
# reported as such even where a fault also hit.
TAINTS = ((ErrorKind.env_bug.value, Termination.env_bug), (ErrorKind.env_fault.value, Termination.env_fault))
# An episode's end by a clock that was not the agent's: the environment's or the grader's time ran out.
_FAULT_CLOCKS = {Termination.env_fault.value: Termination.env_fault,
                 Termination.grader_fault.value: Termination.grader_fault}


def touched_by_env(steps: list[Step]) -> tuple[Termination, str] | None:
    """The class and reason of an attempt an environment fault or bug touched, else None."""
    for kind, termination in TAINTS:
        hit = [s for s in steps if s.error == kind]
        if hit:
            return termination, f"{len(hit)} {kind.replace('_', ' ')}(s), first at step {hit[0].index}"
    return None


def classify(steps: list[Step], end: EpisodeEnd, *,
             outcome: OutcomeReport | None, policy_error: str | None = None,
             env_error: str | None = None, verifier_error: str | None = None,
             env_bug: str | None = None, inference_fault: str | None = None,
             context_exceeded: str | None = None, model_refused: str | None = None) -> tuple[Termination, str]:
    """`end`: how the episode ended, as its last time step says (`TimeStep.end`; `EpisodeEnd()` where
    it never started). `env_error` / `env_bug`: the env itself raised (a fault raised on purpose / anything else).
    `inference_fault`: the policy's endpoint failed (after its own retries): a fault, never the
    model's. `context_exceeded`: the endpoint refused a conversation longer than the model's
    context: the episode is truncated there (a model outcome, as a step limit is). `model_refused`:
    the endpoint refused what the model itself wrote (ModelOutputRefused): a failure, the model's
    outcome.

    The runtime's clocks say whose time ran out in `end.clock`
    (envs.wrappers.TimeLimit): the environment's is `env_fault`, the grader's `grader_fault`, the
    agent's own `truncated`; `timeout` is what rollouts recorded before time was attributed say."""
    if env_bug:
        return Termination.env_bug, env_bug
    if env_error:
        return Termination.env_fault, env_error
    touched = touched_by_env(steps)
    if touched:
        return touched
    clock = end.clock
    if clock in _FAULT_CLOCKS:
        return _FAULT_CLOCKS[clock], _reason(end, f"{clock} (time limit)")
    if inference_fault:
        return Termination.inference_fault, inference_fault
    if policy_error:
        return Termination.policy_error, policy_error
    if context_exceeded:
        return Termination.truncated, context_exceeded
    if model_refused:
        return Termination.failure, model_refused
    if clock == Termination.timeout.value:
        return Termination.timeout, _reason(end, "time limit")
    if end.truncated:
        return Termination.truncated, _reason(end, "truncated")
    if not end.terminated:
        return Termination.truncated, "the policy stopped before the episode ended"
    if verifier_error:
        return Termination.verifier_error, verifier_error
    if outcome is None:
        return Termination.verifier_error, "no outcome verifier for this env"
    return _verdict(outcome)


def _reason(end: EpisodeEnd, default: str) -> str:
    return end.reason if end.reason is not None else default


def _verdict(outcome: OutcomeReport) -> tuple[Termination, str]:
    # A verifier attributes the attempt to the environment or to time with a failed check of that
    # name (e.g. the coding grader's sandbox could not run the original files either); an
    # environment fault outranks even a success.
    if _failed(outcome, "env_fault"):
        return Termination.env_fault, "; ".join(outcome.checks["env_fault"].reasons)
    if outcome.success:
        return Termination.success, "; ".join(outcome.reasons) or "verified"
    if outcome.constraint_violation:
        return Termination.constraint_violation, "; ".join(outcome.reasons)
    if _failed(outcome, "timeout"):
        return Termination.timeout, "; ".join(outcome.checks["timeout"].reasons)
    return Termination.failure, "; ".join(outcome.reasons) or "outcome not achieved"


def _failed(outcome: OutcomeReport, check: str) -> bool:
    return check in outcome.checks and not outcome.checks[check].passed
