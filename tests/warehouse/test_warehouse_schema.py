from __future__ import annotations

from enum import Enum
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel

from gymfoundry.envs.records import Rollout, Step, TaskSpec, ToolCall
from gymfoundry.warehouse import TABLES, arrow_schema, from_row, model_columns, to_row


class Colour(str, Enum):
    red = "red"


class Example(BaseModel):
    s: str
    i: int
    f: float
    b: bool
    e: Colour
    lit: Literal["a", "b"]
    maybe_i: int | None = None
    ints: list[int]
    floats: list[float] | None
    strs: list[str]
    call: ToolCall
    calls: list[ToolCall]
    mapping: dict[str, Any]
    either: int | str


def test_annotations_map_to_arrow_types():
    schema = arrow_schema(model_columns(Example))
    assert [(f.name, str(f.type), f.nullable) for f in schema] == [
        ("s", "string", False), ("i", "int64", False), ("f", "double", False), ("b", "bool", False),
        ("e", "string", False), ("lit", "string", False), ("maybe_i", "int64", True),
        ("ints", "list<item: int64 not null>", False), ("floats", "list<item: double not null>", True),
        ("strs", "list<item: string not null>", False), ("call", "string", False), ("calls", "string", False),
        ("mapping", "string", False), ("either", "string", False),
    ]
    assert [c.name for c in model_columns(Example) if c.is_json] == ["call", "calls", "mapping", "either"]


def test_step_row_keeps_scalars_native_and_nested_as_json(build):
    step = build.rollout(build.task()).steps[0]
    row = to_row(step)
    assert row["index"] == 0 and row["reward"] == 0.25 and row["token_ids"] == [1, 2, 3]
    assert row["tool_call"] == '{"name": "lookup", "arguments": {"item": "a"}, "id": "c1"}'
    assert from_row(Step, row) == step


def test_task_and_rollout_round_trip_through_rows(build):
    task = build.task(n=3)
    assert from_row(TaskSpec, to_row(task)) == task
    rollout = build.rollout(task)
    row = to_row(rollout, frozenset({"steps"}))
    assert "steps" not in row and row["termination"] == "success"
    back = from_row(Rollout, row, frozenset({"steps"}), steps=[from_row(Step, to_row(s)) for s in rollout.steps])
    assert back == rollout


def test_file_schemas_leave_the_partition_column_out():
    assert TABLES["tasks"].file_schema.names[:3] == ["task_id", "env_id", "split"]
    assert TABLES["steps"].file_schema.names[:3] == ["rollout_id", "index", "observation"]
    assert "task_family" in [c.name for c in TABLES["steps"].columns]
    assert TABLES["rollouts"].file_schema.field("seed").type == pa.int64()
    assert "steps" not in TABLES["rollouts"].file_schema.names
