from envs.records import OutcomeReport, Step, Termination
from tasks.classify import classify


def report(success, violation=False):
    return OutcomeReport(verifier_id="v", verifier_version="1", success=success, completed=success,
                         regression=False, constraint_violation=violation, reasons=["r"])


def step(i, error=None):
    return Step(index=i, observation="o", result="r", error=error)


def test_success_is_the_verifiers_word_not_termination():
    assert classify([step(0)], terminated=True, truncated=False, end_info={}, outcome=report(True))[0] \
        == Termination.success
    assert classify([step(0)], terminated=True, truncated=False, end_info={}, outcome=report(False))[0] \
        == Termination.failure
    assert classify([step(0)], terminated=True, truncated=False, end_info={},
                    outcome=report(False, violation=True))[0] == Termination.constraint_violation


def test_env_faults_are_never_model_failures():
    steps = [step(0), step(1, "env_fault")]
    term, reason = classify(steps, terminated=True, truncated=False, end_info={}, outcome=report(False))
    assert term == Termination.env_fault and "first at step 1" in reason
    # A success despite a transient fault is still a success.
    assert classify(steps, terminated=True, truncated=False, end_info={}, outcome=report(True))[0] \
        == Termination.success
    assert classify([], terminated=False, truncated=False, end_info={}, outcome=None,
                    env_error="environment raised KeyError")[0] == Termination.env_fault


def test_budget_time_policy_and_verifier_classes():
    assert classify([step(0)], terminated=False, truncated=True, end_info={"termination": "timeout"},
                    outcome=report(False))[0] == Termination.timeout
    assert classify([step(0)], terminated=False, truncated=True, end_info={"termination": "truncated"},
                    outcome=report(False))[0] == Termination.truncated
    assert classify([step(0)], terminated=False, truncated=False, end_info={}, outcome=None,
                    policy_error="endpoint unreachable")[0] == Termination.policy_error
    assert classify([step(0)], terminated=True, truncated=False, end_info={}, outcome=None,
                    verifier_error="verifier raised KeyError")[0] == Termination.verifier_error
