"""L4 downstream: every answer row published to a Kafka topic for the services that act on
answers (``answers.topic``), exactly once per answer row across restarts.

A third query, ``sts-publish``, reads the ``answers`` table's change data feed (Delta on
Spark; the table is created with ``delta.enableChangeDataFeed``): each new answer
(``insert``) and each backfill (``update_postimage``) is one record, keyed by the event's
key (its one key column's value, or a JSON array of several), the value the answer row as
JSON. A backfilled event therefore has two records with the same key, the fallback and
then the model's answer: a compacted topic keeps the latest.

**Exactly once, with a transactional producer.** Each micro-batch is published in one
Kafka transaction (``transactional.id`` = the query's run id, so a zombie of an earlier
attempt is fenced) that also commits, for the consumer group named after the same run,
the offset ``batch_id + 1`` on the topic's partition 0: a marker of what has been
published, written atomically with the records. A micro-batch that Spark runs again
(the job died after the transaction, before Spark committed the batch) finds the marker
and publishes nothing; one whose transaction never committed is aborted by the next
``init_transactions`` and published again. Idempotent keys alone would not do: a
replay would put a second record on the topic, and every consumer would have to
deduplicate. Consumers read with ``isolation.level=read_committed``.

With ``output.triggers.publish: realtime`` the model's on-time answers are published
from the result topics in Real-Time Mode instead (:mod:`spark_ext.l4.answers_realtime`,
at least once); this query publishes the rest.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

#: The change-feed columns Delta adds; not part of the published answer.
_CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
#: Errors of a group coordinator that is not ready yet (the offsets topic is being
#: created or loaded): asked again.
_COORDINATOR_NOT_READY = frozenset({
    16,    # NOT_COORDINATOR
    14,    # COORDINATOR_LOAD_IN_PROGRESS
    15,    # COORDINATOR_NOT_AVAILABLE
    -185,  # _TIMED_OUT
    -195,  # _TRANSPORT
})
#: The changes that are answers: a new row, and a row's state after a backfill.
PUBLISHED_CHANGES = ("insert", "update_postimage")


def event_key(row: dict, key_columns: tuple[str, ...]) -> bytes:
    """A record key for the event of answer ``row``: its key column's value, or a JSON
    array of the values of several.

    Example:
        >>> event_key({"event_id": "e1"}, ("event_id",)), event_key({"a": 1, "b": "x"}, ("a", "b"))
        (b'e1', b'[1, "x"]')
    """
    values = [row.get(k) for k in key_columns]
    if len(values) == 1:
        return ("" if values[0] is None else str(values[0])).encode()
    return json.dumps(values).encode()


@dataclass
class AnswerPublisher:
    """The ``sts-publish`` query's ``foreachBatch`` function (configuration only: it may
    run in Spark Connect's server; the producer is opened in the process that runs it).

    Args:
        topic: The answers topic.
        producer_config: librdkafka settings (``bootstrap.servers``, security, ...).
        run_id: The query's run id (transactional id and marker group are named after it).
        key_columns: The event's key columns (the record key).
    """

    topic: str
    producer_config: dict[str, str]
    run_id: str
    key_columns: tuple[str, ...]
    skip_through: int | None = None
    """Changes of table versions up to this one are not published (a new checkpoint's
    start: they were written before the topic was)."""
    realtime_since: int | None = None
    """With ``output.triggers.publish: realtime``: the start (epoch ms) of the
    ``sts-publish-realtime`` run, which publishes the model answers whose result finished
    from then on; they are not published here (:mod:`spark_ext.l4.answers_realtime`)."""
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        self._producer: Any = None
        self._consumer: Any = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_producer"] = state["_consumer"] = None  # opened again where it runs
        return state

    @property
    def group(self) -> str:
        """The consumer group whose committed offset marks what is published."""
        return f"sts-publish-{self.run_id}"

    def _open(self) -> None:
        from confluent_kafka import Consumer, Producer

        if self._producer is None:
            self._producer = Producer({**self.producer_config, "enable.idempotence": True,
                                       "transactional.id": self.group, "acks": "all"})
            self._producer.init_transactions(self.timeout_s)  # aborts a pending one
            self._consumer = Consumer({**self.producer_config, "group.id": self.group,
                                       "enable.auto.commit": False,
                                       "isolation.level": "read_committed"})

    def published_up_to(self) -> int:
        """The first batch id not yet published (0 when none was)."""
        import time

        from confluent_kafka import KafkaException, TopicPartition

        self._open()
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                committed = self._consumer.committed([TopicPartition(self.topic, 0)],
                                                     timeout=self.timeout_s)
                break
            except KafkaException as e:  # the group's coordinator is still loading
                error = e.args[0] if e.args else None
                if time.monotonic() > deadline or getattr(error, "code", lambda: None)() \
                        not in _COORDINATOR_NOT_READY:
                    raise
                time.sleep(0.2)
        offset = committed[0].offset if committed else -1
        return max(offset, 0)

    def publish(self, rows: list[dict], batch_id: int) -> int:
        """Publish ``rows`` as micro-batch ``batch_id``, once; return how many records
        went out (0 for a batch published before)."""
        from confluent_kafka import TopicPartition

        if batch_id < self.published_up_to():
            logger.info("Answers of micro-batch %d are on %s already.", batch_id, self.topic)
            return 0
        producer = self._producer
        producer.begin_transaction()
        try:
            for row in rows:
                producer.produce(self.topic, key=event_key(row, self.key_columns),
                                 value=json.dumps(row, default=str).encode())
                producer.poll(0)
            producer.send_offsets_to_transaction(
                [TopicPartition(self.topic, 0, batch_id + 1)],
                self._consumer.consumer_group_metadata(), self.timeout_s)
            producer.commit_transaction(self.timeout_s)
        except BaseException:
            producer.abort_transaction(self.timeout_s)
            raise
        return len(rows)

    def close(self) -> None:
        """Flush and close the clients (opened again on the next use)."""
        if self._producer is not None:
            self._producer.flush(self.timeout_s)
            self._consumer.close()
            self._producer = self._consumer = None

    def __call__(self, batch: Any, batch_id: int) -> None:
        from spark_ext.java_errors import short_java_errors

        with short_java_errors():  # a stop mid-batch: no Java stack for Spark to parse
            self._publish_batch(batch, batch_id)

    def _publish_batch(self, batch: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        changes = batch.where(F.col("_change_type").isin(*PUBLISHED_CHANGES))
        if self.skip_through is not None:
            changes = changes.where(F.col("_commit_version") > F.lit(self.skip_through))
        if self.realtime_since is not None:
            from spark_ext.l4.answers_realtime import published_in_realtime

            changes = changes.where(~published_in_realtime(self.realtime_since))
        changes = changes.drop(*[c for c in _CDF_COLUMNS if c in batch.columns])
        rows = changes.toArrow().to_pylist()
        if rows:
            self.publish(rows, batch_id)
