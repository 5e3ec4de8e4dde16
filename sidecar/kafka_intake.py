"""Requests from a Kafka topic, admitted like ``SubmitBatch`` (``intake.topic``).

A pipeline whose submit query runs in Spark's Real-Time Mode writes each request as one
JSON record on a topic (Spark's Kafka sink delivers within milliseconds; a Python
writer in that mode holds rows for seconds); the sidecar reads them here. One thread
polls the consumer and hands what is already fetched (at most ``max_records``; it never
waits to fill a step) to the event loop, where :meth:`Scheduler.submit_batch` admits it
exactly as the RPC does. A refusal is its request's result row on the result channel
(what the RPC's caller would read from the ack); an accepted request's row comes when
it ends. The records' offsets are stored once admitted and committed in the background,
so a sidecar that dies reads at most the last second again: those are duplicates (the
de-duplication window) and write no second row.

A record that is not a JSON object with a ``request_id`` cannot be answered (nothing
names its request): it is counted (``invalid``) and logged, first one by one, then every
:data:`_LOG_EVERY`-th. A record whose fields do not fit a request (a wrong type) is
admitted with its id, attributes and topic only, so admission refuses it with one row.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.client import request_to_proto
from sidecar.config import IntakeConfig
from sidecar.exceptions import ConfigError
from sidecar.request_state import SidecarRequest
from sidecar.servicer import request_from_proto

logger = logging.getLogger(__name__)

#: How long one poll waits for a first record (seconds); also how soon ``stop`` is seen.
_POLL_S = 0.1
#: Requests admitted per turn of the event loop (as ``SubmitBatch`` slices big batches).
_SLICE = 64
#: Invalid records logged one by one before only every :data:`_LOG_EVERY`-th is.
_LOG_FIRST = 10
_LOG_EVERY = 1000


@dataclass
class IntakeCounts:
    """What the intake has read (written by its thread only)."""

    records: int = 0
    admitted: int = 0
    invalid: int = 0


def parse_record(value: bytes | None, record_ts: int) -> dict[str, Any] | None:
    """The request of one record's value, or ``None`` when it names no request.
    ``submit_ts`` defaults to the record's timestamp (when the writer produced it).

    Example:
        >>> parse_record(b'{"request_id": "r1", "priority": "high"}', 1_000)
        {'request_id': 'r1', 'priority': 'high', 'submit_ts': 1000}
        >>> parse_record(b'not json', 1_000) is None, parse_record(b'{"text": 1}', 1) is None
        (True, True)
    """
    try:
        row = json.loads(value) if value else None
    except ValueError:
        return None
    if not isinstance(row, dict) or not isinstance(row.get("request_id"), str) \
            or not row["request_id"]:
        return None
    if not row.get("submit_ts") and record_ts > 0:
        row["submit_ts"] = record_ts
    return row


def request_of(row: dict[str, Any]) -> SidecarRequest:
    """The domain request of a parsed record. Fields of the wrong type leave a request
    with only its id, attributes and callback topic, which admission refuses with a row.

    Example:
        >>> request_of({"request_id": "r1", "max_tokens": "many"}).max_tokens
        0
    """
    try:
        return request_from_proto(request_to_proto(row))
    except (TypeError, ValueError):
        kept = {k: row[k] for k in ("request_id", "callback_topic") if isinstance(row.get(k), str)}
        attrs = row.get("attributes")
        if isinstance(attrs, dict):
            kept["attributes"] = {str(k): str(v) for k, v in attrs.items() if v is not None}
        return request_from_proto(request_to_proto(kept))


class KafkaIntake:
    """Reads :attr:`IntakeConfig.topic` and admits its requests through ``submit``.

    Args:
        config: The topic, group and consumer settings.
        bootstrap: The brokers.
        submit: The scheduler's ``submit_batch`` (called on ``loop``).
        loop: The event loop the scheduler runs on.

    Raises:
        ConfigError: confluent-kafka is missing or refuses the settings (one line).
    """

    def __init__(self, config: IntakeConfig, bootstrap: str,
                 submit: Callable[[list[SidecarRequest]], Sequence[Any]],
                 loop: asyncio.AbstractEventLoop) -> None:
        try:
            from confluent_kafka import Consumer, KafkaError, KafkaException
        except ImportError:
            raise ConfigError("intake.topic needs confluent-kafka: "
                              "pip install 'sts-spark[kafka]'") from None
        self.config, self.submit, self.loop = config, submit, loop
        try:
            self.consumer = Consumer(config.consumer_settings(bootstrap))
        except KafkaException as e:
            raise ConfigError(f"intake.consumer: {e.args[0].str()}") from None
        self._partition_eof = KafkaError._PARTITION_EOF
        self.counts = IntakeCounts()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sts-kafka-intake", daemon=True)

    def start(self) -> None:
        """Subscribe and start reading."""
        self.consumer.subscribe([self.config.topic])
        self._thread.start()
        logger.info("Reading requests from Kafka topic %s (group %s).", self.config.topic,
                    self.config.group_id)

    async def stop(self) -> None:
        """Stop reading (what is admitted stays admitted), commit the stored offsets and
        leave the group, so the group's other sidecars take the partitions."""
        self._stop.set()
        await asyncio.to_thread(self._thread.join)
        await asyncio.to_thread(self.consumer.close)
        c = self.counts
        logger.info("Kafka intake stopped: %d records, %d admitted, %d invalid.", c.records,
                    c.admitted, c.invalid)

    # ----------------------------------------------------------------- the thread

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                first = self.consumer.poll(_POLL_S)
                if first is None:
                    continue
                records = [first]
                if self.config.max_records > 1:  # what is already fetched, never waited for
                    records += self.consumer.consume(self.config.max_records - 1, 0)
                self._admit(records)
            except Exception:  # noqa: BLE001 - one bad step must not end the intake
                if self._stop.is_set():
                    return
                logger.exception("Kafka intake step failed; reading on.")

    def _admit(self, records: list[Any]) -> None:
        requests: list[SidecarRequest] = []
        for record in records:
            if (error := record.error()) is not None:
                if error.code() != self._partition_eof:
                    logger.warning("Kafka intake: %s", error.str())
                continue
            self.counts.records += 1
            row = parse_record(record.value(), record.timestamp()[1])
            if row is None:
                self._invalid(record)
                continue
            requests.append(request_of(row))
        if requests:
            asyncio.run_coroutine_threadsafe(self._submit(requests), self.loop).result()
            self.counts.admitted += len(requests)
        if kept := [r for r in records if r.error() is None]:
            self.consumer.store_offsets(offsets=_next_offsets(kept))

    async def _submit(self, requests: list[SidecarRequest]) -> None:
        for start in range(0, len(requests), _SLICE):
            if start:
                await asyncio.sleep(0)  # a big step never holds the loop for long
            self.submit(requests[start:start + _SLICE])

    def _invalid(self, record: Any) -> None:
        self.counts.invalid += 1
        n = self.counts.invalid
        if n <= _LOG_FIRST or n % _LOG_EVERY == 0:
            logger.warning("Kafka intake: record %s[%d]@%d is not a request (a JSON object "
                           "with a request_id); skipped (%d so far).", record.topic(),
                           record.partition(), record.offset(), n)


def _next_offsets(records: list[Any]) -> list[Any]:
    """The offset to commit per partition: one past the last record read there."""
    from confluent_kafka import TopicPartition

    last: dict[tuple[str, int], int] = {}
    for r in records:
        last[(r.topic(), r.partition())] = r.offset()
    return [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]
