"""Arrow columns derived from the pydantic records, and the record <-> row conversion.

Scalars (str, int, float, bool, str-valued Enum and Literal) and lists of scalars get native
columns; anything else (nested models, dicts, lists of models, unions) is stored as a JSON
string, so a change to a nested record never changes a table's physical schema.
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass
from enum import Enum
from functools import cache
from itertools import repeat
from operator import is_, itemgetter
from typing import Annotated, Any, Iterable, Literal, Sequence, Union, get_args, get_origin

import pyarrow as pa
from pydantic import BaseModel, TypeAdapter

SCALARS: dict[type, pa.DataType] = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}

SQL_TYPES: dict[pa.DataType, str] = {
    pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.float64(): "DOUBLE", pa.bool_(): "BOOLEAN",
    pa.timestamp("us"): "TIMESTAMP",
}


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    nullable: bool = False
    is_json: bool = False  # stored as a JSON string, decoded on the way back

    @property
    def field(self) -> pa.Field:
        return pa.field(self.name, self.type, nullable=self.nullable)

    @property
    def sql_type(self) -> str:
        if pa.types.is_list(self.type):
            return SQL_TYPES[self.type.value_type] + "[]"
        return SQL_TYPES[self.type]


def column_for(name: str, annotation: Any) -> Column:
    """The column for one field annotation."""
    nullable = False
    origin = get_origin(annotation)
    if origin is Annotated:
        return column_for(name, get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        nullable = len(args) < len(get_args(annotation))
        if len(args) != 1:
            return Column(name, pa.string(), nullable, is_json=True)
        annotation, origin = args[0], get_origin(args[0])
    arrow_type = _scalar_type(annotation)
    if arrow_type is None and origin is list:
        (item,) = get_args(annotation) or (Any,)
        item_type = _scalar_type(item)
        if item_type is not None:
            arrow_type = pa.list_(pa.field("item", item_type, nullable=False))
    if arrow_type is None:
        return Column(name, pa.string(), nullable, is_json=True)
    return Column(name, arrow_type, nullable)


def _scalar_type(annotation: Any) -> pa.DataType | None:
    if annotation in SCALARS:
        return SCALARS[annotation]
    if get_origin(annotation) is Literal and all(isinstance(v, str) for v in get_args(annotation)):
        return pa.string()
    if isinstance(annotation, type) and issubclass(annotation, Enum) \
            and all(isinstance(m.value, str) for m in annotation):
        return pa.string()
    return None


@cache
def model_columns(model: type[BaseModel], exclude: frozenset[str] = frozenset()) -> tuple[Column, ...]:
    """One column per model field, in declaration order."""
    return tuple(column_for(name, info.annotation) for name, info in model.model_fields.items()
                 if name not in exclude)


def arrow_schema(columns: Iterable[Column]) -> pa.Schema:
    return pa.schema([c.field for c in columns])


def to_row(record: BaseModel, exclude: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A record as a row: one value per column of its model, JSON columns encoded."""
    dumped = record.model_dump(mode="json", exclude=set(exclude))
    row = {}
    for column in model_columns(type(record), exclude):
        value = dumped[column.name]
        row[column.name] = json.dumps(value) if column.is_json and value is not None else value
    return row


def to_arrays(model: type[BaseModel], records: Sequence[BaseModel],
              exclude: frozenset[str] = frozenset()) -> dict[str, pa.Array]:
    """The records as columns, one Arrow array per column of `model`, built a column at a time (no
    row dicts): the values `to_row` would give, but JSON columns are pydantic's compact JSON text of
    the field as declared. Raises (ArrowInvalid, ArrowTypeError, TypeError, pydantic's serialization
    error) where a record holds a value of another type than its field's, as `model_copy` allows, and
    KeyError where it lacks a field (`model_construct`)."""
    out = {}
    columns = model_columns(model, exclude)
    # pydantic keeps the field values in the instance dict: one pass over the records takes them all
    fields = list(map(itemgetter(*(c.name for c in columns)), map(vars, records)))
    by_column = [fields] if len(columns) == 1 else list(zip(*fields)) or [()] * len(columns)
    enums = _enum_fields(model)
    for column, values in zip(columns, by_column):
        if column.is_json:
            dump = _field_adapter(model, column.name).serializer.to_json
            if any(map(is_, values, repeat(None))):
                values = [None if v is None else dump(v) for v in values]
            else:  # the common case: no null, each value serialized by a C-level loop
                values = list(map(dump, values))
            # pydantic's JSON is UTF-8 bytes: Arrow checks and takes them as text, no str per value
            out[column.name] = pa.array(values, pa.binary()).cast(pa.string())
            continue
        if column.name in enums and not all(map(_text_is_value, set(map(type, values)))):
            values = [v.value if isinstance(v, Enum) else v for v in values]
        check_lists(column, values)
        out[column.name] = pa.array(values, column.type)
    return out


def check_lists(column: Column, values: list[Any]) -> None:
    """Arrow would take a string for a list column as the list of its characters: refuse it."""
    if pa.types.is_list(column.type) and set(map(type, values)) - {list, tuple, type(None)}:
        raise TypeError(f"column {column.name} holds a value that is no list")


@cache
def _field_adapter(model: type[BaseModel], name: str) -> TypeAdapter:
    """Serializes a field by its declared type, as the record's own `model_dump` does."""
    return TypeAdapter(model.model_fields[name].annotation)


@cache
def _text_is_value(kind: type) -> bool:
    """Does Arrow take a value of this type as what `to_row` writes? A `str` Enum's member is taken as
    its text, which is its value unless the Enum made it otherwise (a `__new__` storing a label as
    the text); any other Enum's member is no text at all."""
    if issubclass(kind, Enum):
        return issubclass(kind, str) and all(str.__str__(m) == m.value for m in kind)
    return True


@cache
def _enum_fields(model: type[BaseModel]) -> frozenset[str]:
    """Fields declared to hold an Enum: their values' types are looked at (`_text_is_value`), since
    `model_copy` may have put another Enum's member there."""
    def has_enum(annotation: Any) -> bool:
        if isinstance(annotation, type) and issubclass(annotation, Enum):
            return True
        return any(has_enum(a) for a in get_args(annotation))

    return frozenset(name for name, info in model.model_fields.items() if has_enum(info.annotation))


def from_row(model: type[BaseModel], row: dict[str, Any], exclude: frozenset[str] = frozenset(), **fields: Any):
    """The record for a row (keys that are not fields of the model are ignored), with `fields`
    supplying what the row does not hold, such as a rollout's steps."""
    values = dict(fields)
    for column in model_columns(model, exclude):
        if column.name in row:
            value = row[column.name]
            values[column.name] = json.loads(value) if column.is_json and value is not None else value
    return model.model_validate(values)
