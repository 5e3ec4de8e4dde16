"""The ``kafka`` result channel, Spark side: the result topics (one per priority,
``tagging.callback_topic``) and the acks topic (``sidecar.acks_topic``), created at
start when they do not exist; the answers query reads both in one source
(:func:`spark_ext.sources.kafka.read_channel_topics`), each record parsed by its topic.

The submit tasks produce one JSON record per ack row (keyed by ``request_id``, naming
its pipeline in ``_sts_pipeline``, since pipelines may share the topic) from an
idempotent producer that every task of a Python worker shares; a task ends only once
its records are acknowledged. With a real-time submit query the requests topic
(``kafka.requests_topic``) is read as acks too: its records are the requests, each
``accepted`` (:mod:`spark_ext.submit.realtime`).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_ext.l4.channels.base import ChannelSide, ChannelStreams
from spark_ext.submit.ack_channel import PIPELINE_FIELD, AckChannel, json_records

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

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


@dataclass(frozen=True)
class KafkaAcks(AckChannel):
    """A task's acks as JSON records on ``topic``.

    Args:
        topic: The acks topic.
        producer_config: confluent-kafka settings (``bootstrap.servers``, ...).
        timeout_s: How long the task waits for every delivery.
    """

    topic: str = ""
    producer_config: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 60.0

    def write_table(self, table: pa.Table) -> None:
        """Produce the rows and wait for every delivery.

        Raises:
            RuntimeError: a record was not delivered within ``timeout_s`` (the task fails
                and Spark retries it; its requests are submitted again and deduplicated).
        """
        producer = _producer(self.producer_config)
        failed: list[str] = []

        def delivered(err, _msg) -> None:
            if err is not None:
                failed.append(str(err))

        for key, value in json_records(table, self.pipeline_id):
            while True:
                try:
                    producer.produce(self.topic, value=value.encode("utf-8"),
                                     key=key.encode("utf-8") if key else None,
                                     on_delivery=delivered)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
        left = producer.flush(self.timeout_s)
        if left or failed:
            raise RuntimeError(f"acks to Kafka topic {self.topic!r}: "
                               f"{left} not delivered in {self.timeout_s:g} s"
                               + (f", {len(failed)} failed ({failed[0]})" if failed else ""))


class KafkaChannel(ChannelSide):
    """Results and acks on Kafka topics."""

    name = "kafka"
    needs_kafka = True

    def _topics(self) -> list[str]:
        return [*self.config.result_topics(), *self.config.channel_ack_topics()]

    def prepare(self) -> None:
        from spark_ext.sources.kafka import ensure_topics

        ensure_topics(self.config.kafka.producer_config(), self._topics())

    def source(self) -> str:
        return ", ".join(self.config.result_topics())

    def results(self, spark: SparkSession) -> DataFrame:
        from spark_ext.sources.kafka import read_result_topics

        return read_result_topics(spark, self.config)

    def streams(self, spark: SparkSession, ack_schema: StructType) -> ChannelStreams:
        from pyspark.sql import functions as F

        from sidecar.contract import RESULT_SCHEMA
        from spark_ext.schemas import spark_schema
        from spark_ext.sources.kafka import read_channel_topics

        result_schema = spark_schema(RESULT_SCHEMA)
        records = read_channel_topics(spark, self.config)
        is_ack = F.col("_topic").isin(*self.config.channel_ack_topics())
        results = records.where(~is_ack).select(
            F.from_json(F.col("_value"), result_schema).alias("r"), "_key", "_value")
        results = results.select(
            *[F.coalesce(F.col("r.request_id"), F.col("_key")).alias(f.name)
              if f.name == "request_id" else F.col(f"r.{f.name}") for f in result_schema],
            F.col("_value"))
        mine = F.get_json_object(F.col("_value"), f"$.{PIPELINE_FIELD}") == \
            F.lit(self.pipeline_id)
        acks = records.where(is_ack & mine).select(
            F.from_json(F.col("_value"), ack_schema).alias("a")).select("a.*")
        return ChannelStreams(results, F.col("_value"), acks, exclude=("_value",))

    def ack_channel(self, run_id: str, run_started_ms: int) -> KafkaAcks:
        return KafkaAcks(self.pipeline_id, run_id, run_started_ms,
                         topic=self.config.sidecar.acks_topic,
                         producer_config=self.config.kafka.producer_config())
