"""The ``kafka`` channel read on the driver: the result topics and the acks topic as a
Spark streaming source that polls one Kafka consumer in the driver's Python process
(``format("sts_kafka_channel")``), the way the ``files`` channel's ``sts_results`` source
lists its folder there.

Why not Spark's own Kafka source for this stream: it plans a Spark job per micro-batch
with one task per topic partition (four or more: three result topics and the acks), each
polling from an executor's consumer pool. Measured on 2 cores, that made *finished ->
answer landed* 1.3-2.4x the files channel's (benchmarks/RESULTS.md, 'The deployed path',
has today's figures). The answers
query's input is small (one result row and one ack per request), which is what Spark's
simple reader is for (:class:`pyspark.sql.datasource.SimpleDataSourceStreamReader`: read
and offset planning in one step on the driver, no task). Spark's Kafka source stays the
reader of the **events** (high rates, one task per partition) and, with
``kafka.results_reader: spark``, of this channel too.

- **Offsets** are Spark's Kafka source's: ``{"<topic>": {"<partition>": <next offset>}}``.
  A new checkpoint starts each partition at ``startingTimestamp`` (its end when nothing
  is that new); a partition that appears later starts at its beginning.
- **Replays are exact**: a batch re-read after a restart (``readBetweenOffsets``) seeks
  every partition to its start and reads up to the recorded end, so the ledger sees the
  same records.
- **Lost records are reported, not fatal**: a partition whose next offset the broker no
  longer holds (retention) resumes at its earliest record with a warning naming the gap;
  the requests whose results were in it get their fallback from the ledger.

Rows: ``_topic``, ``_key`` and ``_value`` (strings), as
:func:`spark_ext.sources.kafka.read_channel_topics` returns them.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from spark_ext.sources.runner_exit import quiet_runner_shutdown

logger = logging.getLogger(__name__)

#: Name to use in ``spark.readStream.format(...)``.
SOURCE_NAME = "sts_kafka_channel"
#: The rows' schema (DDL).
SCHEMA_DDL = "_topic STRING, _key STRING, _value STRING"

#: Offsets: topic -> partition (as a string, like Spark's Kafka source) -> next offset.
Offsets = dict[str, dict[str, int]]


def _decode(raw: bytes | None) -> str | None:
    return raw.decode("utf-8", errors="replace") if raw is not None else None


class KafkaChannelReader(SimpleDataSourceStreamReader):
    """One consumer on the driver, assigned to every partition of ``topics``; each
    trigger reads what arrived since the last one (at most ``maxRecordsPerTrigger``).

    Args:
        topics: The topics to read.
        client_config: librdkafka settings (``bootstrap.servers``, security).
        starting_ms: A new checkpoint's first records: those appended from this time on.
        max_records: Records per micro-batch at most.
        poll_s: How long one trigger waits for records once the consumer has none
            buffered (small: the next trigger comes soon).
    """

    def __init__(self, topics: list[str], client_config: dict[str, str], *,
                 starting_ms: int, max_records: int = 100_000, poll_s: float = 0.005) -> None:
        self.topics = topics
        self.client_config = client_config
        self.starting_ms = starting_ms
        self.max_records = max_records
        self.poll_s = poll_s
        self._consumer: Any = None
        self._position: Offsets | None = None
        """Where the consumer is assigned to read next (``None``: not assigned)."""
        self._partitions: dict[str, list[int]] = {}
        self._listed_at = float("-inf")

    # ------------------------------------------------------------------ the consumer

    def _client(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer({
                "fetch.wait.max.ms": "50",
                "log.connection.close": "false",  # an idle connection closed is no news
                **self.client_config,
                # Offsets live in Spark's checkpoint: the group commits nothing.
                "group.id": f"sts-kafka-channel-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": "false",
                "enable.auto.offset.store": "false",
                "auto.offset.reset": "earliest",
                "enable.partition.eof": "false",
            })
        return self._consumer

    def _current_partitions(self, *, max_age_s: float = 5.0) -> dict[str, list[int]]:
        """Every partition of the topics (listed again at most every ``max_age_s``). While
        no broker answers, the partitions known before (the records come once it is
        back, as Spark's Kafka source waits for them); with none known, the error."""
        if time.monotonic() - self._listed_at < max_age_s and self._partitions:
            return self._partitions
        try:
            metadata = self._client().list_topics(timeout=10 if self._partitions else 30)
        except Exception as e:  # noqa: BLE001 - KafkaException: no broker answered
            if not self._partitions:
                raise
            logger.warning("Kafka: cannot list the partitions of %s (%s); reading the "
                           "known ones.", ", ".join(self.topics), e)
            self._listed_at = time.monotonic()
            return self._partitions
        parts: dict[str, list[int]] = {}
        for topic in self.topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None:
                raise RuntimeError(f"Kafka topic {topic!r} cannot be read: "
                                   f"{meta.error if meta is not None else 'it does not exist'}")
            parts[topic] = sorted(meta.partitions)
        self._partitions, self._listed_at = parts, time.monotonic()
        return parts

    def _assign(self, offsets: Offsets) -> None:
        from confluent_kafka import TopicPartition

        consumer = self._client()
        consumer.assign([TopicPartition(t, int(p), o) for t, ps in offsets.items()
                         for p, o in ps.items()])
        self._position = {t: dict(ps) for t, ps in offsets.items()}

    def _with_new_partitions(self, start: Offsets) -> Offsets:
        """``start`` plus partitions that appeared since (from their beginning)."""
        offsets = {t: dict(ps) for t, ps in start.items()}
        for topic, partitions in self._current_partitions().items():
            known = offsets.setdefault(topic, {})
            for p in partitions:
                known.setdefault(str(p), 0)
        return offsets

    def _check(self, msg: Any) -> bool:
        """Whether ``msg`` is a record (an error is raised when fatal, else logged)."""
        if (err := msg.error()) is None:
            return True
        if err.fatal():
            raise RuntimeError(f"Kafka consumer: {err}")
        logger.warning("Kafka consumer: %s", err)
        return False

    def _read_available(self, limit: int) -> list[Any]:
        """Records from the assigned position on, up to ``limit``: what the consumer has
        or receives within ``poll_s``."""
        consumer = self._client()
        records: list[Any] = []
        while len(records) < limit:
            batch = consumer.consume(num_messages=min(10_000, limit - len(records)),
                                     timeout=self.poll_s)
            if not batch:
                break
            for msg in batch:
                if self._check(msg):
                    self._advance(msg.topic(), msg.partition(), msg.offset())
                    records.append(msg)
        return records

    def _read_until(self, end: Offsets, *, timeout_s: float = 60.0) -> list[Any]:
        """Records from the assigned position up to ``end`` (exclusive) in every
        partition, waiting for them: a batch read again."""
        from confluent_kafka import TopicPartition

        consumer = self._client()
        records: list[Any] = []
        pending = {(t, int(p)): o for t, ps in end.items() for p, o in ps.items()
                   if o > self._position.get(t, {}).get(p, 0)}  # type: ignore[union-attr]
        give_up = time.monotonic() + timeout_s
        while pending:
            for msg in consumer.consume(num_messages=10_000, timeout=0.2):
                if not self._check(msg):
                    continue
                key = (msg.topic(), msg.partition())
                if key in pending and msg.offset() < pending[key]:
                    self._advance(*key, msg.offset())
                    records.append(msg)
            # The consumer's position passes markers and compacted-away offsets too.
            for tp in consumer.position([TopicPartition(t, p) for t, p in pending]):
                if tp.offset >= pending[(tp.topic, tp.partition)]:
                    del pending[(tp.topic, tp.partition)]
            if pending and time.monotonic() > give_up:
                raise RuntimeError(f"Kafka records up to {end} could not be read again within "
                                   f"{timeout_s:.0f} s (short: {sorted(pending)})")
        return records

    def _advance(self, topic: str, partition: int, offset: int) -> None:
        position = self._position.setdefault(topic, {})  # type: ignore[union-attr]
        expected = position.get(str(partition), 0)
        if offset > expected:
            logger.warning("Kafka topic %s partition %d: records %d-%d are gone (retention "
                           "or compaction) and were not read; their requests get the "
                           "fallback.", topic, partition, expected, offset - 1)
        position[str(partition)] = offset + 1

    @staticmethod
    def _rows(messages: list[Any]) -> Iterator[tuple]:
        return iter([(m.topic(), _decode(m.key()), _decode(m.value())) for m in messages])

    # ------------------------------------------------------------------ Spark's API

    def initialOffset(self) -> dict:
        from confluent_kafka import TopicPartition

        consumer = self._client()
        wanted = [TopicPartition(t, p, self.starting_ms)
                  for t, ps in self._current_partitions(max_age_s=0).items() for p in ps]
        found = consumer.offsets_for_times(wanted, timeout=30) if wanted else []
        offsets: Offsets = {t: {} for t in self.topics}
        for tp in found:
            offset = tp.offset
            if offset < 0:  # nothing that new: start at the end
                offset = consumer.get_watermark_offsets(tp, timeout=30)[1]
            offsets[tp.topic][str(tp.partition)] = offset
        return offsets

    def read(self, start: dict) -> tuple[Iterator[tuple], dict]:
        offsets = self._with_new_partitions(start)
        if offsets != self._position:
            self._assign(offsets)
        messages = self._read_available(self.max_records)
        return self._rows(messages), {t: dict(ps) for t, ps in self._position.items()}  # type: ignore[union-attr]

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple]:
        offsets = {t: dict(ps) for t, ps in start.items()}
        for topic, partitions in end.items():  # partitions that appeared within the batch
            for p in partitions:
                offsets.setdefault(topic, {}).setdefault(p, 0)
        self._assign(offsets)
        rows = self._rows(self._read_until(end))
        self._position = None  # the next read() assigns its own start
        return rows

    def commit(self, end: dict) -> None:
        """Nothing to do: the offsets are in Spark's checkpoint."""


class KafkaChannelDataSource(DataSource):
    """``spark.readStream.format("sts_kafka_channel")``.

    Options: ``topics`` (comma-separated, required), ``clientConfigSecret`` (librdkafka
    settings as a JSON object, with ``bootstrap.servers``; "secret" in the name makes
    Spark redact its value, which may hold a SASL password, wherever it shows options),
    ``startingTimestamp`` (epoch
    ms; a new checkpoint's first records, default now), ``maxRecordsPerTrigger``
    (default 100,000).
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def simpleStreamReader(self, schema: object) -> SimpleDataSourceStreamReader:
        quiet_runner_shutdown()
        options = {k.lower(): v for k, v in self.options.items()}
        topics = [t.strip() for t in options.get("topics", "").split(",") if t.strip()]
        if not topics:
            raise ValueError("the sts_kafka_channel source needs option('topics', 'a,b')")
        config = json.loads(options.get("clientconfigsecret") or "{}")
        if not config.get("bootstrap.servers"):
            raise ValueError("the sts_kafka_channel source needs bootstrap.servers in "
                             "option('clientConfigSecret', <JSON>)")
        from sidecar.contract import now_ms

        return KafkaChannelReader(
            topics, {str(k): str(v) for k, v in config.items()},
            starting_ms=int(options.get("startingtimestamp") or now_ms()),
            max_records=int(options.get("maxrecordspertrigger") or 100_000))


def register_kafka_channel_source(spark: object) -> None:
    """Make ``format("sts_kafka_channel")`` available on ``spark`` (idempotent)."""
    spark.dataSource.register(KafkaChannelDataSource)  # type: ignore[attr-defined]
