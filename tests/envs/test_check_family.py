"""The family conformance checker: every registered family passes it, and a family broken in one
way (a verifier without a potential, a reference that fails, a generator that is not
deterministic, a tool that crashes on some input) fails the check named for that problem, with a
message that names it. The broken families are the inventory family with one part replaced,
declared as a test-only family (its own name and env id) for one test."""

import dataclasses
import functools
import itertools

import pytest

from gymfoundry import envs
from gymfoundry.envs.check import CHECKS, check_family
from gymfoundry.envs.family import add, family, remove
from gymfoundry.envs.inventory.world import InventoryEnv
from gymfoundry.envs.records import TaskSpec, ToolCall
from gymfoundry.envs.sandbox import bubblewrap
from gymfoundry.flows.cli import main
from tests.sandbox_guard import require_sandbox
from gymfoundry.envs.verifier import OutcomeVerifier
from gymfoundry.envs.inventory.policy import ScriptedInventoryPolicy
from gymfoundry.envs.inventory.verifier import InventoryVerifier

FAMILIES = [fam.name for fam in envs.families()]
POLICY = ScriptedInventoryPolicy


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.sandbox) if f == "coding" else f for f in FAMILIES])
def test_every_registered_family_passes(family, conformance):
    report = conformance(family)  # the one run per family: the family's own tests share it
    if not report.ok and not bubblewrap.probe()[0]:
        require_sandbox()  # a family that runs code needs the sandbox: skipped here, a failure under CI
    assert report.ok, report.render()
    assert [c.name for c in report.checks] == list(CHECKS)
    assert all(c.status in ("pass", "n/a", "missing") and c.message for c in report.checks)
    if family in ("coding", "inventory"):  # each crafts a rollout its verifier's checks disagree on
        assert report["crafted_disagreement"].status == "pass", report.render()


# -- test-only families: inventory with one part broken ----------------------------------------
def restamped(task: TaskSpec, env_id: str, **changes) -> TaskSpec:
    """The task for the probe env id (a new content hash), with `changes` to its fields."""
    data = {**task.model_dump(), "env_id": env_id, "task_id": "", **changes}
    return TaskSpec.model_validate(data)


class Probe(InventoryEnv):
    probe_id = ""

    @classmethod
    def generate_task(cls, seed: int, level: int = 2) -> TaskSpec:
        return restamped(super().generate_task(seed, level), cls.probe_id)


@pytest.fixture
def probe():
    """register(name, env=Probe subclass, verifier=...) -> the probe's env id: the inventory family
    under the name `name` (its env and verifier classes subclassed to belong to it); unregistered after."""
    made = []

    def register(name: str, env: type = Probe, verifier: type = InventoryVerifier, policy: type | None = POLICY):
        env_id = f"gymfoundry/{name}-v0"
        env = type(env.__name__, (env,), {"probe_id": env_id, "family": name})
        verifier = type(verifier.__name__, (verifier,), {"family": name})
        add(dataclasses.replace(family("inventory"), name=name, env=env, verifier=verifier, scripted_policy=policy))
        made.append(name)
        return env_id

    yield register
    for name in made:
        remove(name)


def failing(report) -> list[str]:
    return [c.name for c in report.failures]


class NoPotential(OutcomeVerifier):
    """The inventory verdict without any progress potential."""

    verifier_id, version = "no-potential", "1"

    def verify(self, task, steps, final_state=None):
        return InventoryVerifier().verify(task, steps, final_state)


def test_a_verifier_without_its_potential_fails_the_potential_check(probe):
    report = check_family(probe("probe_nopotential", verifier=NoPotential), seeds=2)
    assert "potential" in failing(report)
    assert "potential" in report["potential"].message, report.render()


class FallingPotential(InventoryVerifier):
    def potentials(self, task, steps):
        return [1.0 - 0.1 * i for i in range(len(steps) + 1)]


def test_a_potential_that_falls_along_the_reference_fails_it(probe):
    report = check_family(probe("probe_falling", verifier=FallingPotential), seeds=2)
    assert failing(report) == ["potential"], report.render()
    assert "phi falls at step 0" in report["potential"].message


class LevelFourReferenceFails(Probe):
    @classmethod
    def generate_task(cls, seed: int, level: int = 2) -> TaskSpec:
        task = super().generate_task(seed, level)
        if level != 4:
            return task
        hidden = {**task.hidden.model_dump(), "reference": task.hidden.model_dump()["reference"][:-1]}
        return restamped(task, task.env_id, hidden=hidden)  # the submit dropped


def test_a_reference_that_fails_at_one_level_fails_the_reference_check(probe):
    report = check_family(probe("probe_badref", env=LevelFourReferenceFails), seeds=2)
    assert "reference" in failing(report)
    message = report["reference"].message
    assert message.startswith("2 of 10 references fail") and "level 4 seed 0" in message
    assert "does not end the episode" in message and "level 3" not in message, message


COUNTER = itertools.count()


class Unseeded(Probe):
    @classmethod
    def generate_task(cls, seed: int, level: int = 2) -> TaskSpec:
        task = super().generate_task(seed, level)
        return restamped(task, task.env_id, goal=f"{task.goal}\n(request #{next(COUNTER)})")


def test_a_generator_that_is_not_deterministic_fails_the_generation_check(probe):
    report = check_family(probe("probe_unseeded", env=Unseeded), seeds=2)
    # gymnasium's check_env sees the same defect: reset(seed=...) twice gives two observations
    assert failing(report) == ["generation", "gymnasium"], report.render()
    assert "generate_task(0, 1) differs between two calls (fields goal, task_id)" in report["generation"].message


class CrashingTool(Probe):
    @functools.wraps(InventoryEnv.tool_get_stock)  # keeps its declaration
    def tool_get_stock(self, state, **args):
        number = int(str(args.get("sku")).removeprefix("SKU-"))  # ValueError on anything else: a bug
        return InventoryEnv.tool_get_stock(self, state, **{**args, "sku": f"SKU-{number}"})


def test_a_tool_that_crashes_on_some_input_fails_the_fuzz_check(probe):
    report = check_family(probe("probe_crash", env=CrashingTool), seeds=2)
    assert failing(report) == ["fuzz"], report.render()
    message = report["fuzz"].message
    assert "get_stock(" in message and "env_bug: " in message and "ValueError" in message


# -- declarations: a crafted rollout, a check not applicable ------------------------------------
class Crafted(InventoryVerifier):
    """Reserves one unit of an item the order did not ask for: every confirmation the agent saw
    is right (observation passes), the hidden state is not (invariants fail)."""

    def crafted_disagreement(self, task):
        facts = task.hidden.checks
        spare = [s for s, i in task.initial_state["catalog"].items()
                 if s not in facts["expected_reservations"] and i["stock"] > 0]
        if not facts["approved"] or not spare:
            return None
        reference = task.hidden.reference
        token = next(c.arguments["auth_token"] for c in reference if c.name == "reserve")
        extra = ToolCall(name="reserve", arguments={"sku": spare[0], "quantity": 1, "auth_token": token})
        return reference[:-1] + [extra, reference[-1]]


class CraftedAgrees(InventoryVerifier):
    def crafted_disagreement(self, task):
        return task.hidden.reference


class DeclaresNotApplicable(InventoryVerifier):
    not_applicable = {"verifier_checks": "the probe grades elsewhere"}
    crafted_disagreement = None  # inventory's own crafted rollout withdrawn: a family that has none


def test_a_crafted_rollout_shows_the_checks_disagree_and_one_that_agrees_fails(probe):
    report = check_family(probe("probe_crafted", verifier=Crafted), seeds=2,
                          checks=["crafted_disagreement"])
    check = report["crafted_disagreement"]
    assert check.status == "pass" and "'observation': True, 'invariants': False" in check.message
    report = check_family(probe("probe_agrees", verifier=CraftedAgrees), seeds=1, checks=["crafted_disagreement"])
    assert failing(report) == ["crafted_disagreement"]
    assert "the verifier's checks agree" in report["crafted_disagreement"].message


def test_a_family_declares_a_check_not_applicable_and_one_without_a_crafted_rollout_is_told(probe):
    report = check_family(probe("probe_na", verifier=DeclaresNotApplicable), seeds=2,
                          checks=["verifier_checks", "crafted_disagreement"])
    assert report.ok
    assert report["verifier_checks"].status == "n/a" and "the probe grades elsewhere" in report["verifier_checks"].message
    assert report["crafted_disagreement"].status == "missing"
    assert "provides no crafted rollout: define crafted_disagreement(task)" in report["crafted_disagreement"].message


def test_cli_exits_1_with_the_report_when_a_check_fails(probe, capsys):
    assert main(["check-family", probe("probe_cli", env=CrashingTool), "--seeds", "2"]) == 1
    err = capsys.readouterr().err
    assert "FAILS 1 check(s)" in err and "FAIL    fuzz" in err
    assert main(["check-family", "inventory", "--seeds", "2"]) == 0
    assert "family inventory (gymfoundry/inventory-v0) passes" in capsys.readouterr().out
