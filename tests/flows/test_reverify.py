"""`reverify`: stored rollouts judged again by the current outcome verifier (their calls replayed,
never the policy), landed in `outcomes` beside the factory's own verdict, one row per verifier
version, so a SQL query shows the versions side by side for the same rollouts."""

import pytest

from gymfoundry.envs.records import FaultConfig, Termination
from gymfoundry.flows.cli import main
from gymfoundry.flows.factory import factory
from gymfoundry.flows.reverify import reverify
from gymfoundry.tasks.ops.reverify import load_stored, plan
from gymfoundry.envs.inventory.verifier import InventoryVerifier
from gymfoundry.warehouse import Warehouse

pytestmark = pytest.mark.usefixtures("prefect_harness")

MAX_SUCCESS_STEPS = 4  # the new version's rule: a success that took more steps is a failure
SIDE_BY_SIDE = """
    pivot (select rollout_id, verifier_version, success from outcomes where verifier_id = 'inventory-outcome')
    on verifier_version in ('2', '3') using first(success) order by rollout_id"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, prefect_harness):
    data_dir = tmp_path_factory.mktemp("reverify")
    # some env faults too: an attempt they touched stays env_fault under any verifier version
    factory(families=["inventory"], tasks_per_family=14, seed=2, data_dir=str(data_dir),
            faults=FaultConfig(rate=0.05, seed=2))
    with Warehouse(data_dir, read_only=True) as wh:
        rollouts = {r.rollout_id: r for r in wh.load_rollouts()}
    return data_dir, rollouts


def strict_verify(original):
    def verify(self, task, steps, final_state=None):
        report = original(self, task, steps, final_state)
        if report.success and len(steps) > MAX_SUCCESS_STEPS:
            report = report.model_copy(update={"success": False,
                                               "reasons": [*report.reasons, f"took {len(steps)} steps"]})
        return report
    return verify


def outcome_rows(data_dir, where="true"):
    with Warehouse(data_dir, read_only=True) as wh:
        return wh.sql_df(f"select * from outcomes where {where} order by rollout_id, verifier_version")


def test_the_factory_lands_its_own_verdicts_and_reverify_under_the_same_version_lands_nothing(run_dir):
    data_dir, rollouts = run_dir
    first = outcome_rows(data_dir)
    with_outcome = {rid for rid, r in rollouts.items() if r.outcome is not None}
    assert sorted(first["rollout_id"]) == sorted(with_outcome) and set(first["source"]) == {"factory"}
    assert dict(zip(first["rollout_id"], first["termination"])) == \
        {rid: rollouts[rid].termination.value for rid in with_outcome}
    report = reverify(data_dir=str(data_dir))
    assert report["landed"] == {"outcomes": 0} and report["reverified"] == 0
    assert report["already_verified"] == len(with_outcome)


def test_a_new_verifier_version_lands_second_outcomes_side_by_side(run_dir, monkeypatch, capsys):
    data_dir, rollouts = run_dir
    assert InventoryVerifier.version == "2"  # the version the run landed under; "3" is the stricter one
    monkeypatch.setattr(InventoryVerifier, "version", "3")
    monkeypatch.setattr(InventoryVerifier, "verify", strict_verify(InventoryVerifier.verify))

    assert main(["reverify", "--data-dir", str(data_dir), "--batch-size", "7"]) == 0
    assert "new outcome rows" in capsys.readouterr().out
    clean = {rid for rid, r in rollouts.items() if r.termination not in (Termination.env_fault, Termination.env_bug)}
    demoted = {rid for rid in clean if rollouts[rid].success and len(rollouts[rid].steps) > MAX_SUCCESS_STEPS}
    assert demoted and len(demoted) < sum(r.success for r in rollouts.values())  # the versions really differ

    second = outcome_rows(data_dir, "verifier_version = '3'")
    assert sorted(second["rollout_id"]) == sorted(rollouts) and set(second["source"]) == {"reverify"}
    assert second["error"].null_count() == len(rollouts)
    with Warehouse(data_dir, read_only=True) as wh:
        pairs = wh.sql_df(SIDE_BY_SIDE)
        changed = wh.sql_df("select count(*) as n from outcomes o1 join outcomes o2 using (rollout_id) "
                            "where o1.verifier_version = '2' and o2.verifier_version = '3' "
                            "and o1.success and not o2.success")["n"][0]
    both = pairs.drop_nulls()
    assert both.height == sum(r.outcome is not None for r in rollouts.values())  # the same rollouts, both versions
    assert set(both.filter(both["2"] != both["3"])["rollout_id"]) == demoted and changed == len(demoted)
    assert int(both["2"].sum()) - int(both["3"].sum()) == len(demoted)
    by_class = dict(zip(second["rollout_id"], second["termination"]))
    for rid, rollout in rollouts.items():  # what the episode's end decided stands; only verdicts moved
        expected = "failure" if rid in demoted else rollout.termination.value
        assert by_class[rid] == expected, (rid, rollout.termination_reason)

    again = reverify(data_dir=str(data_dir))
    assert again["landed"] == {"outcomes": 0} and again["already_verified"] == len(rollouts)


def test_a_verifier_crash_is_a_verifier_error_and_the_others_still_land(run_dir, monkeypatch):
    data_dir, rollouts = run_dir
    model = [r for r in rollouts.values() if r.termination in (Termination.success, Termination.failure)]
    target = next(r for r in model if sum(o.steps == r.steps for o in rollouts.values()) == 1)
    original = InventoryVerifier.verify

    def crashing(self, task, steps, final_state=None):
        if steps == target.steps:
            raise KeyError("expected_reservations")
        return original(self, task, steps, final_state)

    monkeypatch.setattr(InventoryVerifier, "version", "3-crashing")
    monkeypatch.setattr(InventoryVerifier, "verify", crashing)
    report = reverify(data_dir=str(data_dir))
    assert report["landed"] == {"outcomes": len(rollouts)} and report["verifier_errors"] == 1
    rows = outcome_rows(data_dir, "verifier_version = '3-crashing'")
    errors = rows.filter(rows["error"].is_not_null())
    assert errors["rollout_id"].to_list() == [target.rollout_id]
    assert errors["termination"].to_list() == ["verifier_error"] and errors["outcome"].null_count() == 1
    assert "KeyError" in errors["error"][0] and "verifier_error" not in rows.filter(rows["error"].is_null())["termination"]


def test_reverify_backfills_the_original_verdicts_of_rollouts_landed_without_them(run_dir, tmp_path):
    data_dir, rollouts = run_dir
    with Warehouse(data_dir, read_only=True) as wh:
        stored = load_stored(wh)
    with Warehouse(tmp_path) as wh:  # as a warehouse landed before `outcomes` existed
        wh.land(tasks=list(stored.tasks.values()), rollouts=stored.rollouts).checked()
    with Warehouse(tmp_path, read_only=True) as wh:
        todo = plan(load_stored(wh))
    assert len(todo.backfill) == sum(r.outcome is not None for r in rollouts.values())
    assert {v.source for v in todo.backfill} == {"factory"} and len(todo.pending) == 0  # version 1: same verdicts
    report = reverify(data_dir=str(tmp_path))
    assert report["landed"] == {"outcomes": len(todo.backfill)} and report["backfilled"] == len(todo.backfill)
    with Warehouse(tmp_path, read_only=True) as wh:
        assert wh.check().success


def test_the_episodes_own_end_outranks_the_new_verdict_and_a_grader_fault_lands_nothing(run_dir, monkeypatch):
    from gymfoundry.envs.errors import EnvFault
    from gymfoundry.tasks.ops.reverify import reverify_rollout, reverify_rollouts

    data_dir, rollouts = run_dir
    with Warehouse(data_dir, read_only=True) as wh:
        tasks = load_stored(wh).tasks
    success = next(r for r in rollouts.values() if r.success)
    verifier = InventoryVerifier()
    for termination in (Termination.truncated, Termination.timeout, Termination.policy_error):
        ended = success.model_copy(update={"termination": termination, "termination_reason": "the episode's end"})
        verdict = reverify_rollout(ended, tasks[ended.task_id], verifier, "now")
        assert verdict.outcome.success and verdict.termination == termination  # the verdict is kept, the class too
    assert reverify_rollout(success, tasks[success.task_id], verifier, "now").termination == Termination.success

    def faulty(self, task, steps, final_state=None):
        raise EnvFault("the grader's sandbox could not start")

    monkeypatch.setattr(InventoryVerifier, "verify", faulty)
    out = reverify_rollouts([success], tasks)
    assert out.verdicts == [] and len(out.faults) == 1 and success.rollout_id in out.faults[0]
