"""Result rows on Kafka: one record per row, the row as one UTF-8 JSON object.

The ``kafka`` result channel produces each row to its request's ``callback_topic``,
or, when that is empty, to ``results.kafka.topic_template`` with ``{priority}``
filled in (:func:`result_topic`; a row without a known priority goes to the
``normal`` topic). The key is the ``request_id`` (UTF-8). The value is a JSON object
with exactly the columns of :data:`~sidecar.contract.RESULT_SCHEMA`, by name: strings
as strings, ``int32``/``int64`` columns as JSON numbers, ``ttft_ms``/``tpot_ms`` as
numbers, ``attributes`` as an object of strings, ``late`` as ``true``/``false``, and
``null`` where a nullable column has no value (``first_token_ts``, ``ttft_ms``,
``tpot_ms``, ``error`` mostly). Spark reads it with its Kafka source and
``from_json(CAST(value AS STRING), <RESULT_SCHEMA as a Spark schema>)``.

Example:
    >>> row = dict.fromkeys(RESULT_COLUMNS) | {"request_id": "r1", "status": "ok",
    ...        "priority": "high", "attributes": {"ticket_id": "T-1"}, "late": False}
    >>> value = encode_result(row)
    >>> decode_result(value) == row
    True
    >>> result_topic("llm.result.{priority}", "", "")
    'llm.result.normal'
"""

from __future__ import annotations

import json
import operator
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from sidecar.contract.schema import RESULT_SCHEMA

#: The JSON object's keys: the result columns, in schema order.
RESULT_COLUMNS: tuple[str, ...] = tuple(f.name for f in RESULT_SCHEMA)

#: The topic a row with no known priority goes to.
DEFAULT_PRIORITY = "normal"

_ROW = operator.attrgetter(*RESULT_COLUMNS)
_ATTRIBUTES = RESULT_COLUMNS.index("attributes")
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def result_topic(template: str, callback_topic: str | None, priority: str | None) -> str:
    """The topic of a row: its request's ``callback_topic`` when set, else ``template``
    with ``{priority}`` (``normal`` when the row has none).

    Example:
        >>> result_topic("llm.result.{priority}", "", "high")
        'llm.result.high'
        >>> result_topic("llm.result.{priority}", "svc.answers", "high")
        'svc.answers'
    """
    return callback_topic or template.format(priority=priority or DEFAULT_PRIORITY)


def encode_result(row: Any) -> bytes:
    """The Kafka value of one result row: a mapping with the result columns as keys, or
    an object with them as attributes (the sidecar's ``ResultRecord``).

    Raises:
        KeyError, AttributeError: a column is missing.
        ValueError: a value JSON cannot hold (NaN, infinity).
    """
    if isinstance(row, Mapping):
        values = [row[name] for name in RESULT_COLUMNS]
    else:
        values = list(_ROW(row))
    attributes = values[_ATTRIBUTES]
    if not isinstance(attributes, Mapping):  # None, or (key, value) pairs (Parquet rows)
        values[_ATTRIBUTES] = dict(attributes or ())
    return _ENCODER.encode(dict(zip(RESULT_COLUMNS, values))).encode("utf-8")


def decode_result(value: bytes | str) -> dict[str, Any]:
    """One Kafka value back into a row (``attributes`` a dict), checked against the
    schema: exactly the result columns, each of its column's type or ``null`` where the
    column is nullable.

    Raises:
        ValueError: not a JSON object of the result columns, naming what is wrong.
    """
    try:
        row = json.loads(value)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"a result value must be UTF-8 JSON: {e}") from None
    if not isinstance(row, dict):
        raise ValueError(f"a result value must be a JSON object, got {type(row).__name__}")
    if missing := [c for c in RESULT_COLUMNS if c not in row]:
        raise ValueError(f"result value lacks columns {missing}")
    if extra := sorted(set(row) - set(RESULT_COLUMNS)):
        raise ValueError(f"result value has unknown columns {extra}")
    for f in RESULT_SCHEMA:
        if not _fits(row[f.name], f):
            raise ValueError(f"result column {f.name}={row[f.name]!r} is not a {f.type}"
                             f"{'' if f.nullable else ' (not null)'}")
    return {name: row[name] for name in RESULT_COLUMNS}


def _fits(value: Any, f: pa.Field) -> bool:
    if value is None:
        return f.nullable
    t = f.type
    if pa.types.is_string(t):
        return isinstance(value, str)
    if pa.types.is_boolean(t):
        return isinstance(value, bool)
    if pa.types.is_integer(t):
        return isinstance(value, int) and not isinstance(value, bool)
    if pa.types.is_floating(t):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if pa.types.is_map(t):
        return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in value.items())
    raise TypeError(f"no JSON rule for {t}")  # a column type added to the schema
