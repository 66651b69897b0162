import pytest

from gymfoundry.envs.records import MODEL_OUTCOMES, CheckResult, OutcomeReport, Step, Termination
from gymfoundry.envs.timestep import EpisodeEnd
from gymfoundry.tasks.rollout.classify import classify


def report(success, violation=False):
    return OutcomeReport(verifier_id="v", verifier_version="1", success=success, completed=success,
                         regression=False, constraint_violation=violation, reasons=["r"])


def step(i, error=None):
    return Step(index=i, observation="o", result="r", error=error)


def test_success_is_the_verifiers_word_not_termination():
    assert classify([step(0)], EpisodeEnd(terminated=True), outcome=report(True))[0] \
        == Termination.success
    assert classify([step(0)], EpisodeEnd(terminated=True), outcome=report(False))[0] \
        == Termination.failure
    assert classify([step(0)], EpisodeEnd(terminated=True),
                    outcome=report(False, violation=True))[0] == Termination.constraint_violation


def test_env_faults_are_never_model_failures():
    steps = [step(0), step(1, "env_fault")]
    term, reason = classify(steps, EpisodeEnd(terminated=True), outcome=report(False))
    assert (term, reason) == (Termination.env_fault, "1 env fault(s), first at step 1")
    assert classify([], EpisodeEnd(), outcome=None,
                    env_error="environment raised KeyError")[0] == Termination.env_fault


@pytest.mark.parametrize("outcome", [report(True), report(False), report(False, violation=True), None])
@pytest.mark.parametrize("ending", [EpisodeEnd(terminated=True),
                                    EpisodeEnd(truncated=True, clock="timeout"),
                                    EpisodeEnd(truncated=True)])
def test_an_attempt_touched_by_a_fault_is_env_fault_whatever_its_outcome(outcome, ending):
    """Counting a faulted success but not a faulted failure made success rise with the fault rate."""
    steps = [step(0), step(1, "env_fault"), step(2), step(3, "env_fault")]
    assert classify(steps, ending, outcome=outcome) == (Termination.env_fault, "2 env fault(s), first at step 1")
    # ... even when the policy endpoint failed too: the retry is what the attempt needs
    assert classify(steps, ending, outcome=outcome, policy_error="endpoint down")[0] == Termination.env_fault


def test_an_env_bug_outranks_a_fault_and_any_outcome():
    steps = [step(0, "env_fault"), step(1, "env_bug")]
    assert classify(steps, EpisodeEnd(terminated=True), outcome=report(True)) \
        == (Termination.env_bug, "1 env bug(s), first at step 1")
    assert classify([step(0)], EpisodeEnd(), outcome=None,
                    env_bug="environment bug KeyError: 'x' (world.py:3)")[0] == Termination.env_bug
    assert Termination.env_bug not in MODEL_OUTCOMES and Termination.env_fault not in MODEL_OUTCOMES


def test_a_verifier_that_blames_the_environment_outranks_its_own_success():
    outcome = report(True)
    outcome.checks["env_fault"] = CheckResult(passed=False, reasons=["grading sandbox did not start"])
    assert classify([step(0)], EpisodeEnd(terminated=True), outcome=outcome) \
        == (Termination.env_fault, "grading sandbox did not start")


def test_agent_mistakes_stay_model_outcomes():
    """Only the environment's own error kinds taint an attempt; the agent's bad input does not."""
    steps = [step(0, "invalid_json"), step(1, "unknown_tool"), step(2, "out_of_stock")]
    assert classify(steps, EpisodeEnd(terminated=True), outcome=report(True))[0] \
        == Termination.success
    assert classify(steps, EpisodeEnd(terminated=True), outcome=report(False))[0] \
        == Termination.failure


def test_budget_time_policy_and_verifier_classes():
    assert classify([step(0)], EpisodeEnd(truncated=True, clock="timeout"),
                    outcome=report(False))[0] == Termination.timeout
    assert classify([step(0)], EpisodeEnd(truncated=True, clock="truncated"),
                    outcome=report(False))[0] == Termination.truncated
    assert classify([step(0)], EpisodeEnd(), outcome=None,
                    policy_error="endpoint unreachable")[0] == Termination.policy_error
    assert classify([step(0)], EpisodeEnd(terminated=True), outcome=None,
                    verifier_error="verifier raised KeyError")[0] == Termination.verifier_error
