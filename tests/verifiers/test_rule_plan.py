"""The information-use rule parses each family's grounded calls in one plan node: a call keeps its
own tool's grounded arguments only (a refused call's arguments are not schema-checked, so it may
carry another tool's argument names), and a value that is no string, anywhere, reads every
argument by its JSON path instead, with the same components as the per-tool plan gives."""

from __future__ import annotations

import json

import polars as pl
import pytest

from envs.inventory import InventoryEnv
from verifiers import rules
from verifiers.rules import STEP_SCHEMA, score_table

PROFILES = {"inventory": InventoryEnv.profile}
GOAL = "Order ORD-1: reserve SKU-A (widget)."


def table(calls: list[tuple[str, dict, str | None]]) -> pl.DataFrame:
    rows = [("r", "inventory", i, i, error, tool, json.dumps(args, sort_keys=True),
             InventoryEnv.profile.category(tool).value, GOAL if i == 0 else "{}", "{}", 0.0, 0.0, "")
            for i, (tool, args, error) in enumerate(calls)]
    return pl.DataFrame(rows, schema=STEP_SCHEMA, orient="row")


CALLS = [
    ("find_items", {"query": "widget"}, None),                                        # seen
    # refused before its schema check: `query` (find_items' argument) is not reserve's to ground
    ("reserve", {"sku": "SKU-A", "auth_token": "tok-unseen", "query": "never seen"}, "tool_not_allowed"),
    ("get_stock", {"sku": "sku-a"}, None),                                            # seen, any case
    ("release", {"reservation_id": "R-404"}, "unknown_reservation"),                  # reached the tool, unseen
    ("request_authorization", {"order_id": "ORD-1", "sku": "SKU-ZZZ"}, "tool_not_allowed"),  # sku is not its argument
]
EXPECTED = [0.0, -0.5, 0.0, -1.0, 0.0]


def test_each_call_is_grounded_on_its_own_tools_arguments_only():
    assert score_table(table(CALLS), PROFILES)["information_use"].to_list() == EXPECTED


@pytest.mark.parametrize("odd", [{"x": 1}, [1, 2]])
def test_a_value_that_is_no_string_reads_every_argument_by_its_path_with_the_same_components(odd):
    # an object under another tool's grounded argument name: the one-parse plan fails, the
    # JSON-path plan runs; the components are those of the same calls without it
    calls = CALLS + [("get_stock", {"sku": "SKU-A", "order_id": odd}, "tool_not_allowed")]
    assert score_table(table(calls), PROFILES)["information_use"].to_list() == EXPECTED + [0.0]


def test_the_one_parse_plan_and_the_json_path_plan_agree_on_scalars():
    calls = CALLS + [("get_stock", {"sku": 5}, "tool_not_allowed"), ("reserve", {"sku": True, "auth_token": 1.5},
                                                                     "tool_not_allowed")]
    frame = rules.score_table(table(calls), PROFILES)
    parsed = frame["information_use"].to_list()
    original = rules._family_grounded_values
    try:
        rules._family_grounded_values = None  # forces the per-tool JSON-path plan
        with pytest.raises(TypeError):
            rules.score_table(table(calls), PROFILES)
    finally:
        rules._family_grounded_values = original
    by_path = rules._information_use(_prepared(table(calls)), PROFILES, parsed=False).collect().sort("row")
    assert parsed[-2:] == [-1.0, -1.0] and by_path["information_use"].to_list()[-2:] == [-1.0, -1.0]


def _prepared(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_row_index("row").with_columns(
        rollout_key=pl.lit(1, pl.Int64), seen_end=(pl.col("observation").str.len_bytes().cast(pl.Int64) + 1).cum_sum())
