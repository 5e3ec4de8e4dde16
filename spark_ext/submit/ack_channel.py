"""The submit tasks' acks, handed to the answers query the way the sidecar hands it
results: the submit query writes no table (its micro-batch is the time from an event
to the sidecar, and a Delta commit there would be paid by every event's deadline).

Each submit task, once its rows are submitted, leaves every ack row (accepted,
refused, and the rows it passed through unsent: L1/L2 answers, dead letters) on the
channel of ``sidecar.result_channel``:

- ``files``: one Parquet file per task and micro-batch in ``sidecar.acks_dir``, named
  like the sidecar's result files (:func:`sidecar.contract.result_file_name`: the
  submit query's run start as the incarnation, the batch id as the sequence, one
  writer stream per partition) and renamed into place, so the ``sts_results`` source
  reads each once and removes it after the retention;
- ``kafka``: one JSON record per row (keyed by ``request_id``) on ``sidecar.acks_topic``,
  from an idempotent producer that every task of a Python worker shares; the task
  ends only once its records are acknowledged.

A retried task or a replayed batch writes its acks again (same file name; the same
records once more): the ledger keeps one answer per request
(:mod:`spark_ext.l4.ledger`).
"""

from __future__ import annotations

import base64
import json
import os
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

#: Spark's local property holding the micro-batch id of a streaming job's tasks.
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass(frozen=True)
class AckChannel:
    """Where the submit tasks leave their acks (plain data: it travels to the tasks).

    Args:
        kind: ``files`` or ``kafka`` (the pipeline's result channel).
        pipeline_id: The pipeline the acks are for (``kafka``: each record says it, as
            ``_sts_pipeline``, since pipelines may share the topic).
        run_id: The submit query's run id (names each task's writer stream).
        run_started_ms: When that run started (the files' incarnation).
        acks_dir: ``files``: the local folder.
        topic: ``kafka``: the topic.
        producer_config: ``kafka``: confluent-kafka settings (``bootstrap.servers``, ...).
    """

    kind: str
    pipeline_id: str
    run_id: str
    run_started_ms: int
    acks_dir: str | None = None
    topic: str | None = None
    producer_config: dict[str, str] = field(default_factory=dict)

    def write(self, batches: list[pa.RecordBatch]) -> None:
        """Leave one task's ack rows on the channel (nothing for no rows)."""
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return
        table = pa.Table.from_batches(batches)
        if self.kind == "kafka":
            _produce(self, table)
        else:
            _write_file(self, table)


def _task_position() -> tuple[int, int]:
    """(batch id, partition) of the running task; (0, 0) outside a streaming task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, 0
    batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
    return (int(batch) if batch is not None else 0), ctx.partitionId()


def _write_file(channel: AckChannel, table: pa.Table) -> None:
    import pyarrow.parquet as pq

    from sidecar.contract import result_file_name

    batch, partition = _task_position()
    folder = Path(channel.acks_dir or ".")
    folder.mkdir(parents=True, exist_ok=True)
    name = result_file_name(channel.run_started_ms, batch,
                            f"acks-{channel.run_id}-p{partition}")
    temp = folder / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    pq.write_table(table, temp)
    os.replace(temp, folder / name)  # visible at once and whole


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


#: The field of a Kafka ack record naming its pipeline.
PIPELINE_FIELD = "_sts_pipeline"


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


_producers: dict[str, Any] = {}
_producers_lock = threading.Lock()


def _producer(config: dict[str, str]) -> Any:
    """The Python worker's producer for ``config`` (made once, reused by its tasks)."""
    from confluent_kafka import Producer

    key = json.dumps(config, sort_keys=True)
    with _producers_lock:
        if key not in _producers:
            # A broker closing an idle connection is not worth a log line here (the
            # worker's stderr is the job's console); failed deliveries fail the task.
            _producers[key] = Producer({"enable.idempotence": "true", "acks": "all",
                                        "linger.ms": "2", "log.connection.close": "false",
                                        **config})
        return _producers[key]


def _produce(channel: AckChannel, table: pa.Table, *, timeout_s: float = 60.0) -> None:
    """Produce the rows and wait for every delivery.

    Raises:
        RuntimeError: a record was not delivered within ``timeout_s`` (the task fails and
            Spark retries it; its requests are submitted again and deduplicated).
    """
    producer = _producer(channel.producer_config)
    failed: list[str] = []

    def delivered(err, _msg) -> None:
        if err is not None:
            failed.append(str(err))

    for key, value in json_records(table, channel.pipeline_id):
        while True:
            try:
                producer.produce(channel.topic, value=value.encode("utf-8"),
                                 key=key.encode("utf-8") if key else None,
                                 on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
    left = producer.flush(timeout_s)
    if left or failed:
        raise RuntimeError(f"acks to Kafka topic {channel.topic!r}: "
                           f"{left} not delivered in {timeout_s:g} s"
                           + (f", {len(failed)} failed ({failed[0]})" if failed else ""))
