"""The gameability audit (tasks/stages/audit.py): every registered family passes it; a verifier with a hole
fails it, naming the adversary and the levels; it lands in `family_audits`; dataset assembly
refuses a family whose current versions have no passing audit, unless an override says why."""

import json

import pytest

from gymfoundry import envs
from gymfoundry.envs.family import family
from gymfoundry.envs.records import ToolCall, Verdict
from gymfoundry.envs.sandbox import bubblewrap
from gymfoundry.flows.cli import main
from gymfoundry.tasks.stages.assemble import assemble_datasets
from gymfoundry.tasks.stages.audit import (ADVERSARIES, AuditRefused, Calls, Pool, _perturb, audit_family, current_versions, land_audit,
                         latest_audit, negate, require_audited)
from gymfoundry.tasks.rollout.episodes import run_episode
from tests.sandbox_guard import require_sandbox
from gymfoundry.envs.advisory.verifier import AdvisoryVerifier
from gymfoundry.envs.browser.verifier import BrowserVerifier
from gymfoundry.envs.conversation.verifier import ConversationVerifier
from gymfoundry.envs.inventory.verifier import InventoryVerifier
from gymfoundry.warehouse import Warehouse

FAMILIES = [fam.name for fam in envs.families()]


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.sandbox) if f == "coding" else f for f in FAMILIES])
def test_every_registered_family_passes_its_audit(family):
    report = audit_family(family, episodes=2)
    if not report.ok and family == "coding" and not bubblewrap.probe()[0]:
        require_sandbox()  # coding runs code: skipped without a sandbox here, a failure under CI
    assert report.ok, report.render()
    seen = {r.adversary for r in report.rows}
    assert {"oracle", "blind_ending", "do_nothing", "stall", "spray"} <= seen, report.render()
    assert all(r.oracle_success_rate == 1.0 for r in report.rows), report.render()
    assert {r.level for r in report.rows} == {1, 2, 3, 4, 5}


class BlindDenial(InventoryVerifier):
    """Inventory without its evidence rule: a `submit denied` needs no authorisation request."""

    version = "1-no-evidence"
    endings = ()


def test_removing_inventorys_evidence_rule_fails_the_audit_naming_adversary_and_levels():
    report = audit_family("inventory", episodes=3, adversaries=["blind_ending"], verifier=BlindDenial)
    failing = {(r.adversary, r.level) for r in report.failures}
    assert not report.ok
    assert failing == {("blind_ending", level) for level in (2, 3, 4, 5)}, report.render()
    for row in report.failures:
        assert row.verifier_version == "1-no-evidence"
        assert row.successes >= 1 and any("succeeded on" in r for r in row.reasons)
    # the family's own verifier is back in the registry afterwards
    assert audit_family("inventory", episodes=3, adversaries=["blind_ending"]).ok


# The holes found at 6b697bb, re-created on today's verifiers: the audit must name them.
class BlindBrowser(BrowserVerifier):
    version = "hole-blind-report"
    endings = ()  # report_infeasible needs no evidence


class TopicOnlyAdvisory(AdvisoryVerifier):
    version = "hole-topic-only"


class BlindConversation(ConversationVerifier):
    version = "hole-blind-refusal"
    endings = ()  # ending the chat needs no identity check or order read


def flagged(report, adversary):
    return sorted(r.level for r in report.failures if r.adversary == adversary)


def test_the_audit_flags_browsers_blind_report_by_adversary_and_level():
    report = audit_family("browser", episodes=2, adversaries=["blind_ending"], verifier=BlindBrowser)
    assert flagged(report, "blind_ending") == [2, 3, 5], report.render()  # where an infeasible task was drawn
    assert all("succeeded on" in r.reasons[0] for r in report.failures)


def test_the_audit_flags_advisorys_topic_only_disclosures(monkeypatch):
    monkeypatch.setattr("gymfoundry.envs.advisory.verifier.disclosure_problem", lambda topic, text, product: None)
    report = audit_family("advisory", episodes=2, adversaries=["negated"], verifier=TopicOnlyAdvisory)
    assert flagged(report, "negated") == [1, 2, 3, 4, 5], report.render()


def test_the_audit_flags_conversations_blind_refusal_and_false_promises(monkeypatch):
    report = audit_family("conversation", episodes=2, adversaries=["blind_ending"], verifier=BlindConversation)
    assert flagged(report, "blind_ending") == [2, 3, 5], report.render()  # level 1 has no refusals
    monkeypatch.setattr("gymfoundry.envs.conversation.verifier.false_statements", lambda state, initial: [])
    report = audit_family("conversation", episodes=2, adversaries=["negated"], verifier=ConversationVerifier)
    assert flagged(report, "negated") == [1, 2, 3, 4, 5], report.render()


def test_unknown_adversary_and_bad_episodes_are_refused():
    with pytest.raises(ValueError, match="unknown adversaries \\['lazy'\\]"):
        audit_family("inventory", adversaries=["lazy"])
    with pytest.raises(ValueError, match="episodes must be at least 1"):
        audit_family("inventory", episodes=0)
    assert ADVERSARIES == ("blind_ending", "do_nothing", "stall", "spray", "reference_perturbed",
                           "reference_no_reads", "collateral", "negated")


def test_negate_says_the_opposite():
    assert negate("Returns are not guaranteed.") == "Returns are guaranteed."
    assert negate("The fee is 0.5% a year.") == "The fee is not 0.5% a year."
    assert negate("There are no fees.") == "There are some fees."
    assert negate("I refunded $20.") == "It is not true that I refunded $20."
    assert negate("Could you tell me your zip code? Your order is cancelled.") == \
        "Could you tell me your zip code? Your order is not cancelled."
    assert negate("Could you tell me your zip code, please?") is None  # a question claims nothing
    # the discussion reference's rationales, as envs/discussion/tests plays them negated
    assert negate("Every participant accepts X, and the vote on it was unanimous.") == \
        "Every participant accepts X, and the vote on it was not unanimous."
    assert negate("No option is acceptable to every participant, so there is no consensus.") == \
        "some option is acceptable to every participant, so there is no consensus."


def test_perturb_changes_ids_numbers_and_choices_but_not_free_text():
    assert _perturb("P-104", {"type": "string", "maxLength": 32}) == "P-105"
    assert _perturb("#W0099", {"type": "string", "maxLength": 32}) == "#W0100"
    assert _perturb(3, {"type": "integer", "maximum": 3}) == 2
    assert _perturb(3, {"type": "integer"}) == 4
    assert _perturb("denied", {"enum": ["reserved", "denied"]}) == "reserved"
    assert _perturb(True, {"type": "boolean"}) is False
    assert _perturb("done", {"type": "string", "maxLength": 500}) is None
    assert _perturb("the task is done", {"type": "string", "maxLength": 32}) is None


def test_pool_harvests_values_from_the_world_replies_and_the_goal():
    pool = Pool()
    pool.see('Reserve 3 units of "white valve" for order ORD-33530.')
    pool.see(json.dumps({"ok": True, "result": {"sku": "SKU-7", "stock": 12, "tags": ["a"]}}))
    assert {"white valve", "ORD-33530", "sku", "SKU-7", "a"} <= set(pool.strings)
    assert {3.0, 12.0} <= set(pool.numbers)


# -- recorded and enforced ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def inventory_audit():
    return audit_family("inventory", episodes=1)


def test_the_same_versions_audited_again_give_the_same_rows_and_id(inventory_audit):
    again = audit_family("inventory", episodes=1)
    assert [r.model_dump(exclude={"audited_at"}) for r in again.rows] == \
        [r.model_dump(exclude={"audited_at"}) for r in inventory_audit.rows]


def test_audit_lands_and_is_found_for_the_current_versions(tmp_path, inventory_audit):
    assert inventory_audit.ok, inventory_audit.render()
    with Warehouse(tmp_path) as wh:
        assert latest_audit(wh, "inventory") == []
        assert land_audit(wh, inventory_audit) == len(inventory_audit.rows)
        assert land_audit(wh, inventory_audit) == 0  # the same audit again lands nothing
        found = latest_audit(wh, "inventory")
        assert [r.model_dump(exclude={"audited_at"}) for r in found] == sorted(
            (r.model_dump(exclude={"audited_at"}) for r in inventory_audit.rows),
            key=lambda r: (r["adversary"], r["level"]))
        assert {k: getattr(found[0], k) for k in current_versions("inventory")} == current_versions("inventory")
        assert require_audited(wh, ["inventory"]) == {"inventory": inventory_audit.rows[0].audit_id}


def test_assembly_refuses_an_unaudited_family_and_records_an_override(tmp_path):
    with pytest.raises(AuditRefused, match="inventory: no gameability audit of its current versions"):
        assemble_datasets(tmp_path, ["inventory"])
    datasets = assemble_datasets(tmp_path, ["inventory"], audit_override="a test of the override")
    with Warehouse(tmp_path, read_only=True) as wh:
        params = [json.loads(p) for p in wh.sql("select params from datasets").column("params").to_pylist()]
    assert len(params) == len(datasets) == 3
    assert all(p["audits"] == {"inventory": "override: a test of the override"} for p in params)


def test_assembly_refuses_a_failed_audit_naming_adversaries_and_levels(tmp_path, inventory_audit):
    failed = inventory_audit.rows[0].model_copy(update={"adversary": "spray", "level": 4, "passed": False,
                                                         "reasons": ["succeeded on 1 of 3 episodes (floor 0)"]})
    rows = [r for r in inventory_audit.rows if (r.adversary, r.level) != ("spray", 4)] + [failed]
    report = type(inventory_audit)(family="inventory", rows=[r.model_copy(update={"audit_id": "audit-failed"})
                                                             for r in rows])
    with Warehouse(tmp_path) as wh:
        land_audit(wh, report)
        with pytest.raises(AuditRefused, match="inventory: audit audit-failed failed: spray at level\\(s\\) 4"):
            require_audited(wh, ["inventory"])
        assert require_audited(wh, ["inventory"], override="known") == {"inventory": "override: known"}


def test_datasets_use_the_audited_verifier_versions_verdicts_only(tmp_path, inventory_audit):
    """Hostile: rollouts judged by an older verifier version (a blind ending it let through) are
    no training data under the new version's audit: left out and counted, until `reverify`
    lands the current version's verdict, which is then the one used."""
    fam = family("inventory")
    tasks = [fam.generate(seed, 1) for seed in range(3)]
    played = [run_episode(t, Calls("oracle", list(t.hidden.reference)), seed=0) for t in tasks]
    assert [r.termination.value for r in played] == ["success"] * 3
    old = [r.model_copy(update={"outcome": r.outcome.model_copy(update={"verifier_version": "0-old"})})
           for r in played]
    with Warehouse(tmp_path) as wh:
        wh.land(tasks=tasks, rollouts=old).checked()
        land_audit(wh, inventory_audit)
    first = assemble_datasets(tmp_path, ["inventory"], kinds=("sft",))["sft"]
    assert first["rows"] == 0 and first["dropped"]["stale_verdict_rollouts"] == 3
    verdicts = [Verdict(rollout_id=r.rollout_id, task_id=r.task_id, family="inventory", verifier_id="inventory-outcome",
                        verifier_version=InventoryVerifier.version, source="reverify", outcome=r.outcome,
                        termination=r.termination) for r in played[:2]]
    with Warehouse(tmp_path) as wh:
        wh.land(outcomes=verdicts).checked()
    second = assemble_datasets(tmp_path, ["inventory"], kinds=("sft",))["sft"]
    assert second["rows"] == 2 and second["dropped"]["stale_verdict_rollouts"] == 1


def test_the_audit_landed_last_decides_even_one_landed_before(tmp_path, inventory_audit):
    """A failing audit, then a passing one, then the failing one again (the same id, run later):
    the newest landing decides, not the newest id."""
    failed = type(inventory_audit)(family="inventory", rows=[
        r.model_copy(update={"audit_id": "audit-failed", "passed": r.adversary != "spray",
                             "audited_at": "2026-12-01T10:00:00+00:00"}) for r in inventory_audit.rows])
    passing = type(inventory_audit)(family="inventory", rows=[
        r.model_copy(update={"audited_at": "2026-12-01T11:00:00+00:00"}) for r in inventory_audit.rows])
    again = type(inventory_audit)(family="inventory", rows=[
        r.model_copy(update={"audited_at": "2026-12-01T12:00:00+00:00"}) for r in failed.rows])
    with Warehouse(tmp_path) as wh:
        land_audit(wh, failed)
        land_audit(wh, passing)
        assert require_audited(wh, ["inventory"]) == {"inventory": inventory_audit.rows[0].audit_id}
        assert land_audit(wh, again) == len(again.rows)
        with pytest.raises(AuditRefused, match="audit audit-failed failed: spray"):
            require_audited(wh, ["inventory"])
        assert len(latest_audit(wh, "inventory")) == len(again.rows)  # that landing's rows, once each


def test_odd_values_in_replies_and_schemas_never_crash_the_adversaries():
    import random

    from gymfoundry.tasks.stages.audit import make_value

    pool = Pool()
    pool.see('{"stock": 1' + "0" * 400 + ', "x": NaN, "y": Infinity, "z": -1e999}')
    pool.see("order 9" + "9" * 400)
    assert all(abs(n) < 1e15 for n in pool.numbers)
    rng = random.Random(0)
    assert make_value({"enum": []}, rng, pool) in pool.strings  # an empty enum: a string like any other
    assert make_value({"type": "string", "maxLength": 9, "pattern": "(["}, rng, Pool(strings=["a"])) == "x"
    assert make_value({"type": "integer", "minimum": 3, "maximum": 3}, rng, pool) == 3


def test_cli_audit_family_prints_lands_and_exits_by_the_verdict(tmp_path, capsys):
    assert main(["audit-family", "inventory", "--episodes", "1", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gameability audit of inventory" in out and "passes" in out and "row(s) landed in family_audits" in out
    with Warehouse(tmp_path, read_only=True) as wh:
        assert wh.count("family_audits") == len(latest_audit(wh, "inventory")) > 0
