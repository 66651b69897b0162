"""The gates check every column rule of a table as one great-expectations expectation
(`expect_rows_to_hold_their_record_rules`). Hostile: every way a row can break a rule must fail
that one expectation exactly when the per-column suite (one expectation per column and rule) fails,
and a failing batch's report still names the column and the per-column expectation."""

from __future__ import annotations

import pytest

from gymfoundry.warehouse import TABLES, quality
from gymfoundry.warehouse.staged import frame, rows_part
from gymfoundry.warehouse.store import _row

BAD_JSON = ["{", "NaN", "{'a': 1}", '{"a": NaN}', '{"a": 1} trailing', "", 7]


def valid_rows(build) -> dict[str, list[dict]]:
    task = build.task("inventory", 3)
    rollout = build.rollout(task)
    return {"tasks": [_row(TABLES["tasks"], task), _row(TABLES["tasks"], build.task("inventory", 4))],
            "rollouts": [_row(TABLES["rollouts"], rollout)],
            "steps": [_row(TABLES["steps"], s, rollout_id=rollout.rollout_id, task_family="inventory")
                      for s in rollout.steps],
            "step_scores": [_row(TABLES["step_scores"], build.score(rollout, i), task_family="inventory")
                            for i in range(3)]}


def corruptions(name: str):
    """(column, bad value) for every rule of the table, and values on the edge of each bound."""
    rules = quality.record_rules(name)
    for c in rules["not_null"]:
        yield c, None
    for c in rules["json"]:
        for bad in BAD_JSON:
            yield c, bad
    for c in rules["regex"]:
        yield from ((c, bad) for bad in ["Bad Family", "-x", "inventory/../x", ""])
    for c, values in rules["sets"].items():
        yield from ((c, bad) for bad in ["bogus", values[0].upper() + "x", ""])
    for c, (low, high, strict_low, strict_high) in rules["bounds"].items():
        for edge in (low, high):
            if edge is not None:
                yield from ((c, edge + d) for d in (-1e-9, 0.0, 1e-9))
        yield c, "x"  # no number at all
        yield c, float("inf")


def verdict(name: str, rows: list[dict], one_pass: bool, monkeypatch, found=None, identity=None) -> bool:
    """The gate's verdict on the rows, with the one-pass suite or the per-column one; `found` (the
    referenced keys that exist) defaults to every key the rows name, `identity` to all FOUND."""
    detailed = quality.table_expectations
    with monkeypatch.context() as m:
        if not one_pass:
            m.setattr(quality, "table_expectations",
                      lambda table, one_pass=False, helpers=(): detailed(table, False, helpers))
        table = TABLES[name]
        if found is None:
            found = {ref: {tuple(r.get(c) for c in ref.columns) for r in rows} for ref in table.references}
        if identity is None and table.content_id:
            identity = [quality.FOUND] * len(rows)
        return quality.validate_table(table, frame(table, rows_part(table, rows)), found, identity).success


@pytest.mark.integration  # every rule against great-expectations' per-column suite
@pytest.mark.parametrize("name", ["tasks", "rollouts", "steps", "step_scores"])
def test_the_one_pass_gate_fails_exactly_where_the_per_column_suite_fails(name, build, monkeypatch):
    rows = valid_rows(build)[name]
    assert verdict(name, rows, True, monkeypatch) and verdict(name, rows, False, monkeypatch)
    tried = 0
    for column, bad in corruptions(name):
        broken = [dict(rows[0], **{column: bad}), *rows[1:]]
        one, per_column = verdict(name, broken, True, monkeypatch), verdict(name, broken, False, monkeypatch)
        assert one == per_column, (name, column, bad, one, per_column)
        tried += 1
    assert tried >= 10


def test_a_failing_batch_is_reported_rule_by_rule(wh, build):
    rows = valid_rows(build)
    rows["steps"][1]["reward"] = 5.0
    rows["steps"][2]["tool_call"] = '{"name": NaN}'
    landing = wh.land_rows(rows)
    assert not landing.ok
    failed = {(f["table"], f["column"], f["expectation"]) for f in landing.report.failures}
    assert failed == {("steps", "reward", "expect_column_values_to_be_between"),
                      ("steps", "tool_call", "expect_column_values_to_be_valid_json")}


def test_the_gates_run_the_column_rules_as_one_expectation_per_table():
    for name in ("tasks", "rollouts", "steps"):
        expectations = quality.table_expectations(name, one_pass=True)
        assert [e.expectation_type for e in expectations][0] == "expect_rows_to_hold_their_record_rules"
        assert len(expectations) == 1  # the rules, the key's uniqueness and the batch's helper columns
        assert len(quality.table_expectations(name)) > 10


@pytest.mark.parametrize("name", ["tasks", "rollouts", "steps", "step_scores"])
def test_the_one_pass_gate_checks_keys_ids_and_references_as_the_per_column_suite(name, build, monkeypatch):
    """The key's uniqueness, the content-id verdicts and the references are part of the one expectation:
    each way to break them fails it exactly when the per-column suite fails."""
    rows = valid_rows(build)[name]
    table = TABLES[name]
    cases = [("a repeated key", [*rows, dict(rows[0])], None, None)]
    if len(rows) > 1:
        cases.append(("a key repeated with other values",
                      [*rows, dict(rows[1], **{c: rows[0][c] for c in table.key})], None, None))
    if len(table.key) > 1:  # one key column the same, another not: no repeat
        other = [c for c in table.key if isinstance(rows[0][c], str)][0]
        cases.append(("a key sharing a column", [*rows, dict(rows[0], **{other: rows[0][other] + "x"})], None, None))
    if table.content_id:
        cases.append(("a tampered id", rows, None, ["t-1: its content hashes to t-2"] + [quality.FOUND] * (len(rows) - 1)))
    for ref in table.references:
        cases.append((f"a dangling {ref.table}", rows, {ref: set()}, None))
    for what, case_rows, found, identity in cases:
        one = verdict(name, case_rows, True, monkeypatch, found, identity)
        per_column = verdict(name, case_rows, False, monkeypatch, found, identity)
        assert one == per_column, (name, what, one, per_column)
        if what == "a key sharing a column":
            assert one, what  # (the per-column suite agrees: not a repeat)
        else:
            assert not one, what


@pytest.mark.parametrize("a, b", [(0.0, -0.0), (10**20, 1e20)])
def test_the_regex_rule_matches_texts_not_values(a, b, build, monkeypatch):
    """Equal values that print apart (0.0 and -0.0) are one value to pandas but two texts to the
    regex: the one-pass gate matches each text, as the per-column suite does."""
    rows = valid_rows(build)["steps"]
    rows = [dict(rows[0], task_family=a), dict(rows[1], task_family=b), *rows[2:]]
    assert verdict("steps", rows, True, monkeypatch) == verdict("steps", rows, False, monkeypatch) is False


def test_a_batch_with_a_family_of_no_text_is_quarantined_with_its_report(wh, build):
    rows = valid_rows(build)
    rows["steps"] = [dict(s, task_family=f) for s, f in zip(rows["steps"], [0.0, -0.0, 0.0])]
    landing = wh.land_rows(rows)
    assert not landing.ok
    assert [f["expectation"] for f in landing.report.tables["steps"].failures] == \
        ["expect_column_values_to_match_regex"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_float_that_is_no_finite_number_is_refused_where_pandas_would_take_it_for_null(wh, build, value):
    """pandas holds NaN and null alike, so a nullable float's NaN passed every rule; no record holds
    NaN or an infinity (`allow_inf_nan` is off). Records made without validation (Arrow path) and
    row dicts (the row-by-row path) are both refused, the report naming the column and the value."""
    from gymfoundry.envs.records import StepScore

    task = build.task("inventory", 5)
    rollout = build.rollout(task)
    scores = [build.score(rollout, i) for i in range(3)]
    bad = StepScore.model_construct(**{**scores[1].model_dump(), "score": value})
    landing = wh.land(tasks=[task], rollouts=[rollout], scores=[scores[0], bad, scores[2]])
    assert not landing.ok and wh.count("step_scores") == 0
    failed = [(f["column"], f["examples"]) for f in landing.report.failures]
    # NaN broke no other rule (the score is nullable): this is what let it land; an infinity is out of bounds too
    assert ("finite:score", [str(value)]) in failed
    if value != value:
        assert failed == [("finite:score", ["nan"])]
    rows = valid_rows(build)
    rows["step_scores"][1]["score"] = value
    rows["steps"][1]["latency_s"] = value  # not nullable: NaN fails not-null as well
    landing = wh.land_rows(rows)
    assert not landing.ok and wh.count("steps") == 0
    failed = [(f["column"], f["examples"]) for f in landing.report.failures]
    assert ("finite:score", [str(value)]) in failed and ("finite:latency_s", [str(value)]) in failed
    assert wh.land(tasks=[task], rollouts=[rollout], scores=scores).counts["step_scores"] == 3  # the good ones land


def test_check_finds_a_nan_that_reached_a_table_around_the_gates(wh, data_dir, build):
    from gymfoundry.warehouse import catalog
    from gymfoundry.warehouse.lake import write_batch

    task = build.task("inventory", 6)
    rollout = build.rollout(task)
    wh.land(tasks=[task], rollouts=[rollout])
    row = _row(TABLES["step_scores"], build.score(rollout, 0), task_family="inventory")
    row["score"] = float("nan")
    batch = write_batch(data_dir, TABLES["step_scores"], "inventory", [row])
    catalog.register(wh.con, wh.data_dir, [batch], "2026-01-01 00:00:00")
    report = wh.check()
    assert [(f["table"], f["column"], f["examples"]) for f in report.failures] == [("step_scores", "finite:score", ["nan"])]
