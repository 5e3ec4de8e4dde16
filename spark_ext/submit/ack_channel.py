"""The submit tasks' acks, handed to the answers query the way the sidecar hands it
results: the submit query writes no table (its micro-batch is the time from an event
to the sidecar, and a Delta commit there would be paid by every event's deadline).

Each submit task, once its rows are submitted, leaves every ack row (accepted,
refused, and the rows it passed through unsent: L1/L2 answers, dead letters) on the
result channel's twin, through an :class:`AckChannel` its channel's Spark side made
(:meth:`spark_ext.l4.channels.ChannelSide.ack_channel`): ``files`` writes one Parquet
file per task and micro-batch, ``kafka`` one JSON record per row (see their modules
in :mod:`spark_ext.l4.channels`). Here: the base class and what every channel's acks
share (the task's position, the rows as JSON records).

A retried task or a replayed batch writes its acks again (same file name; the same
records once more): the ledger keeps one answer per request
(:mod:`spark_ext.l4.ledger`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

#: Spark's local property holding the micro-batch id of a streaming job's tasks.
BATCH_ID_PROPERTY = "streaming.sql.batchId"
#: The field of a JSON ack record naming its pipeline.
PIPELINE_FIELD = "_sts_pipeline"


@dataclass(frozen=True)
class AckChannel:
    """Where the submit tasks leave their acks (plain data: it travels to the tasks); a
    channel's subclass writes them (:meth:`write_table`).

    Args:
        pipeline_id: The pipeline the acks are for.
        run_id: The submit query's run id (names each task's writer stream).
        run_started_ms: When that run started.
    """

    pipeline_id: str
    run_id: str
    run_started_ms: int

    def write(self, batches: list[pa.RecordBatch]) -> None:
        """Leave one task's ack rows on the channel (nothing for no rows)."""
        batches = [b for b in batches if b.num_rows]
        if batches:
            self.write_table(pa.Table.from_batches(batches))

    def write_table(self, table: pa.Table) -> None:
        """Leave ``table`` (a task's ack rows, at least one) on the channel."""
        raise NotImplementedError


def task_position() -> tuple[int, int]:
    """(batch id, partition) of the running task; (0, 0) outside a streaming task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, 0
    batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
    return (int(batch) if batch is not None else 0), ctx.partitionId()


def _json_value(value: Any) -> Any:
    """A column value as Spark's ``from_json`` reads it back (binary as base64)."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        return {k: _json_value(v) for k, v in value}  # an Arrow map: (key, value) pairs
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    return value


def json_records(table: pa.Table, pipeline_id: str) -> Iterable[tuple[str | None, str]]:
    """(key, value) per row: the ``request_id`` and the row as JSON, with its pipeline.

    Example:
        >>> t = pa.table({"request_id": ["r1"], "key": [b"k"], "ids": [["a"]]})
        >>> list(json_records(t, "p1"))
        [('r1', '{"request_id": "r1", "key": "aw==", "ids": ["a"], "_sts_pipeline": "p1"}')]
    """
    for row in table.to_pylist():
        value = {k: _json_value(v) for k, v in row.items()}
        value[PIPELINE_FIELD] = pipeline_id
        yield row.get("request_id"), json.dumps(value)
