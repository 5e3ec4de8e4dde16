"""Kafka topics of the benchmarks: create them, and read back when each record landed.

The ``sts-kafka`` scheme of ``sts bench`` and ``python -m benchmarks.realtime_mode`` put
their events on a topic of their own and read results from ``llm.result.{priority}``.
Topics created here use ``message.timestamp.type=LogAppendTime``, so a record's
timestamp is when the broker appended it: the time an event reached its topic, or a
result row reached the result topic, which splits the Kafka hops out of the answers'
timestamps (:func:`topic_hops`). On an external cluster where the topics already exist
with ``CreateTime``, the timestamp is when the producer handed the record to its
client; :func:`landing_times` reports which kind it read.

Example:
    >>> topic_hops([{"event_id": "e1", "request_id": "r1", "answer_source": "llm",
    ...              "enqueue_ts": 0, "submit_ts": 300, "finish_ts": 900,
    ...              "answered_ts": 1200}], {"e1": 40}, {"r1": 950})["on events topic -> submitted"]
    {'p50': 260.0, 'p99': 260.0, 'n': 1}
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping

from sidecar import percentiles

logger = logging.getLogger(__name__)

#: The topic config of every topic created here (see the module docstring).
TOPIC_CONFIG = {"message.timestamp.type": "LogAppendTime"}


def create_topics(bootstrap_servers: str, topics: Iterable[str], *, partitions: int = 1,
                  timeout_s: float = 30.0) -> dict[str, str]:
    """Create ``topics`` (``partitions`` each, replication 1 on a one-broker cluster,
    else the cluster's default) with :data:`TOPIC_CONFIG`; a topic that exists is kept
    as it is. Returns topic -> ``"created"`` or ``"exists"``.

    Raises:
        RuntimeError: the cluster refused to create a topic for another reason.
    """
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 0})
    brokers = len(admin.list_topics(timeout=timeout_s).brokers)
    replication = 1 if brokers == 1 else -1  # -1: the cluster's default
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=partitions, replication_factor=replication,
                  config=dict(TOPIC_CONFIG)) for t in topics], operation_timeout=timeout_s)
    out = {}
    for topic, future in futures.items():
        try:
            future.result(timeout_s)
            out[topic] = "created"
        except Exception as e:  # noqa: BLE001 - KafkaException wraps the KafkaError
            err = e.args[0] if e.args else None
            if getattr(err, "code", lambda: None)() == KafkaError.TOPIC_ALREADY_EXISTS:
                out[topic] = "exists"
            else:
                raise RuntimeError(f"cannot create topic {topic!r}: {e}") from None
    return out


def landing_times(bootstrap_servers: str, topics: Iterable[str], *, since_ms: int,
                  key_field: str | None = None, timeout_s: float = 60.0
                  ) -> tuple[dict[str, int], str]:
    """When each record of ``topics`` from ``since_ms`` on landed: key -> record
    timestamp (epoch ms; the first record of a key wins), and the timestamp kind seen
    (``log_append_time``, ``create_time`` or ``none``). The key is the record's key, or
    the JSON value's ``key_field``. Reads until the end of every partition as it was
    when the call began.
    """
    from confluent_kafka import (TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Consumer,
                                 TopicPartition)

    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "sts-bench-hops",
                         "enable.auto.commit": False, "log_level": 0})
    kinds = {TIMESTAMP_CREATE_TIME: "create_time", TIMESTAMP_LOG_APPEND_TIME: "log_append_time"}
    times: dict[str, int] = {}
    seen_kind = "none"
    try:
        metadata = consumer.list_topics(timeout=timeout_s).topics
        parts = [TopicPartition(t, p, since_ms) for t in topics if t in metadata
                 for p in metadata[t].partitions]
        if not parts:
            return times, seen_kind
        starts = consumer.offsets_for_times(parts, timeout=timeout_s)
        ends = {}
        for tp in starts:
            _low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
            if tp.offset >= 0 and tp.offset < high:
                ends[(tp.topic, tp.partition)] = high
        starts = [tp for tp in starts if (tp.topic, tp.partition) in ends]
        if not starts:
            return times, seen_kind
        consumer.assign(starts)
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=1.0):
                if msg.error():
                    continue
                kind, ts = msg.timestamp()
                seen_kind = kinds.get(kind, seen_kind)
                key = msg.key().decode() if key_field is None and msg.key() else None
                if key_field is not None:
                    try:
                        key = str(json.loads(msg.value())[key_field])
                    except (ValueError, KeyError, TypeError):
                        key = None
                if key is not None and ts > 0:
                    times.setdefault(key, ts)
                tp = (msg.topic(), msg.partition())
                if tp in ends and msg.offset() + 1 >= ends[tp]:
                    del ends[tp]
        if ends:
            logger.warning("landing times: %d partitions not read to their end", len(ends))
    finally:
        consumer.close()
    return times, seen_kind


def topic_hops(rows: Iterable[Mapping], event_landed: Mapping[str, int],
               result_landed: Mapping[str, int], *,
               sources: tuple[str, ...] = ("llm", "fallback")) -> dict[str, dict]:
    """The Kafka hops of answer rows (``event_id``, ``request_id`` and the answers
    table's timestamps): event -> on events topic -> submitted, and finished -> on
    result topic -> answer landed; P50/P99 and count, like
    :func:`sts_harness.hops.hop_latencies`."""
    hops: dict[str, list[float]] = {
        "event -> on events topic": [], "on events topic -> submitted": [],
        "finished -> on result topic": [], "on result topic -> answer landed": []}
    for r in rows:
        if r.get("answer_source") not in sources:
            continue
        landed = event_landed.get(str(r.get("event_id")))
        if landed is not None and r.get("enqueue_ts") is not None:
            hops["event -> on events topic"].append(landed - r["enqueue_ts"])
            if r.get("submit_ts") is not None:
                hops["on events topic -> submitted"].append(r["submit_ts"] - landed)
        landed = result_landed.get(str(r.get("request_id")))
        if landed is not None and r.get("finish_ts") is not None \
                and r.get("answered_ts") is not None:
            hops["finished -> on result topic"].append(landed - r["finish_ts"])
            hops["on result topic -> answer landed"].append(r["answered_ts"] - landed)
    return {hop: percentiles(v, (50, 99), digits=1) | {"n": len(v)}
            for hop, v in hops.items()}


#: The order ``sts bench`` prints a Kafka run's hops in (the files path's and the topics').
HOP_ORDER = (
    "event -> on events topic", "on events topic -> submitted", "event -> submitted",
    "submitted -> sidecar received", "received -> finished", "finished -> on result topic",
    "on result topic -> answer landed", "finished -> answer landed", "event -> answer landed",
)


def merge_hops(path_hops: Mapping[str, dict], kafka_hops: Mapping[str, dict]) -> dict:
    """The answers' hops and the topics' hops in :data:`HOP_ORDER`."""
    both = {**path_hops, **kafka_hops}
    return {h: both[h] for h in HOP_ORDER if h in both} | \
        {h: v for h, v in both.items() if h not in HOP_ORDER}
