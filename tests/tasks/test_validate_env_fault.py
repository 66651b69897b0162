"""The validate stage tells "the environment failed while checking" from "the task is invalid":
with no working sandbox, a coding task is never recorded as rejected; the stage raises and names
the sandbox problem."""

import pytest

from gymfoundry import envs  # noqa: F401  registers the families
from gymfoundry.envs.base import EnvFault
from gymfoundry.envs.coding import generate_task
from gymfoundry.envs.inventory import generate_task as inventory_task
from gymfoundry.envs.records import TaskSpec
from gymfoundry.envs.sandbox import bubblewrap, docker_backend
from gymfoundry.tasks.stages.validate import ReplayEnvFault, check_reference, validate_tasks
from tests.sandbox_guard import needs_sandbox


def with_reference(task: TaskSpec, keep) -> TaskSpec:
    """The task with only the reference calls `keep` accepts (a new, honest task id)."""
    hidden = task.hidden.model_dump(mode="json")
    hidden["reference"] = [c for c in hidden["reference"] if keep(c)]
    return TaskSpec.model_validate({**task.model_dump(mode="json"), "hidden": hidden, "task_id": ""})


@pytest.fixture
def no_sandbox(monkeypatch):
    """The sandbox made unavailable the way a broken install is: no bwrap binary, no engine."""
    monkeypatch.setenv("GYMFOUNDRY_BWRAP", "/nonexistent/bwrap")
    monkeypatch.delenv("GYMFOUNDRY_SANDBOX", raising=False)
    monkeypatch.delenv("GYMFOUNDRY_ALLOW_UNSANDBOXED", raising=False)
    monkeypatch.setattr(docker_backend, "probe", lambda: (False, "no Docker engine answered"))
    bubblewrap.probe.cache_clear()
    yield
    bubblewrap.probe.cache_clear()


def test_a_coding_run_without_a_sandbox_fails_loudly_instead_of_rejecting_every_task(no_sandbox):
    tasks = [generate_task(seed, 1 + seed % 3) for seed in range(3)]
    with pytest.raises(ReplayEnvFault) as err:
        validate_tasks(tasks)
    assert isinstance(err.value, EnvFault)  # an environment fault, never a task verdict
    assert err.value.task_id == tasks[0].task_id and err.value.family == "coding"
    message = str(err.value)
    assert "no bwrap binary" in message and "the environment failed, not the task" in message
    with pytest.raises(ReplayEnvFault):
        check_reference(tasks[1])


def test_a_broken_sandbox_is_an_env_fault_even_when_the_backend_is_forced(no_sandbox, monkeypatch):
    monkeypatch.setenv("GYMFOUNDRY_SANDBOX", "bubblewrap")
    with pytest.raises(ReplayEnvFault, match="sandbox backend bubblewrap is not available"):
        validate_tasks([generate_task(4, 2)])


def test_tasks_of_families_without_a_sandbox_still_validate_and_reject_as_before(no_sandbox):
    good = inventory_task(0, 2)
    broken = with_reference(good, lambda call: call["name"] == "submit")
    valid, rejected = validate_tasks([good, broken])
    assert [t.task_id for t in valid] == [good.task_id]
    assert [r.task_id for r in rejected] == [broken.task_id] and rejected[0].stage == "validate"


@needs_sandbox
def test_an_invalid_coding_task_is_still_rejected_when_the_sandbox_works():
    task = generate_task(5, 2)
    unfixed = with_reference(task, lambda call: call["name"] != "edit_file")
    valid, rejected = validate_tasks([task, unfixed])
    assert [t.task_id for t in valid] == [task.task_id]
    assert len(rejected) == 1 and rejected[0].reason.startswith("reference fails its verifier")


def test_an_env_bug_or_a_crashing_grader_during_the_replay_is_no_verdict_on_the_task(monkeypatch):
    """An env crashing on the reference's call, or the outcome verifier crashing, says nothing
    about the task: the stage stops naming it instead of filing the task as invalid."""
    from gymfoundry.envs.inventory import InventoryEnv
    from gymfoundry.envs.inventory.verifier import InventoryVerifier

    task = inventory_task(3, 2)
    assert check_reference(task) is None

    def crash(self, state, **arguments):
        raise KeyError("sku")

    with monkeypatch.context() as patch:
        patch.setattr(InventoryEnv, "tool_request_authorization", crash)
        with pytest.raises(ReplayEnvFault, match=r"reference step 2 \(request_authorization\): env_bug: environment bug in tool request_authorization: KeyError"):
            check_reference(task)
    with monkeypatch.context() as patch:
        patch.setattr(InventoryVerifier, "verify", lambda *a, **k: 1 / 0)
        with pytest.raises(ReplayEnvFault, match="the outcome verifier raised ZeroDivisionError"):
            check_reference(task)
