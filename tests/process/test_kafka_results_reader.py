"""The ``kafka`` channel's driver-side reader (:mod:`spark_ext.sources.kafka_channel`)
against the session's real broker: each trigger reads what arrived, a batch read again
after a restart is exactly the records it had, a new checkpoint starts at its timestamp,
and records the broker no longer holds are skipped with a warning, not fatal."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from spark_ext.sources.kafka_channel import KafkaChannelReader
from tests.utils import wait_until

ck = pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.timeout(180)


def _topics(bootstrap: str, *names: str, partitions: int = 2) -> list[str]:
    from confluent_kafka.admin import AdminClient, NewTopic

    topics = [f"{n}-{uuid.uuid4().hex[:8]}" for n in names]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, partitions) for t in topics]).values():
        future.result(30)
    return topics


def _produce(bootstrap: str, topic: str, keys: list[str], partition: int | None = None
             ) -> None:
    producer = ck.Producer({"bootstrap.servers": bootstrap})
    for k in keys:
        extra = {"partition": partition} if partition is not None else {}
        producer.produce(topic, key=k.encode(), value=f'{{"id": "{k}"}}'.encode(), **extra)
    assert producer.flush(30) == 0


def _reader(bootstrap: str, topics: list[str], **kwargs) -> KafkaChannelReader:
    return KafkaChannelReader(topics, {"bootstrap.servers": bootstrap, "log_level": "0"},
                              **{"starting_ms": 0, **kwargs})


def _read_keys(reader: KafkaChannelReader, start: dict, n: int) -> tuple[list[str], dict]:
    """Trigger after trigger from ``start`` until ``n`` records came; their keys and the end."""
    keys: list[str] = []

    def enough():
        nonlocal start
        rows, start = reader.read(start)
        keys.extend(k for _, k, _ in rows)
        return len(keys) >= n

    wait_until(enough, timeout_s=30, interval_s=0.05, what=f"{n} records")
    return keys, start


def test_each_trigger_reads_what_arrived_and_a_replay_reads_the_same_records(
        kafka_broker) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    results, acks = _topics(bootstrap, "channel-results", "channel-acks")
    reader = _reader(bootstrap, [results, acks])
    start = reader.initialOffset()
    assert start == {results: {"0": 0, "1": 0}, acks: {"0": 0, "1": 0}}

    _produce(bootstrap, results, [f"r{i}" for i in range(20)])
    _produce(bootstrap, acks, [f"a{i}" for i in range(10)])
    first, end = _read_keys(reader, start, 30)
    assert sorted(first) == sorted([f"r{i}" for i in range(20)] + [f"a{i}" for i in range(10)])
    assert sum(end[results].values()) == 20 and sum(end[acks].values()) == 10

    _produce(bootstrap, results, ["late"])
    second, _ = _read_keys(reader, end, 1)
    assert second == ["late"], "a trigger reads only what came after its start"

    # A restarted query reads its last batch again: exactly its records, although more
    # arrived since, in a new reader (a new driver process).
    _produce(bootstrap, acks, ["later"])
    again = _reader(bootstrap, [results, acks])
    replayed = [k for _, k, _ in again.readBetweenOffsets(start, end)]
    assert sorted(replayed) == sorted(first)
    rest, _ = _read_keys(again, end, 2)
    assert sorted(rest) == ["late", "later"], "after the replay, the next trigger goes on"


def test_a_new_checkpoint_starts_at_its_timestamp(kafka_broker) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    (topic,) = _topics(bootstrap, "channel-since", partitions=1)
    _produce(bootstrap, topic, ["old"])
    time.sleep(0.05)  # the broker stamps records in ms: the two must differ
    since = int(time.time() * 1000)
    _produce(bootstrap, topic, ["new"])
    reader = _reader(bootstrap, [topic], starting_ms=since)
    keys, _ = _read_keys(reader, reader.initialOffset(), 1)
    assert keys == ["new"]
    empty = _reader(bootstrap, [topic], starting_ms=since + 3_600_000)
    assert empty.initialOffset() == {topic: {"0": 2}}, "nothing that new: start at the end"


def test_records_the_broker_no_longer_holds_are_skipped_with_a_warning(
        kafka_broker, caplog: pytest.LogCaptureFixture) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    bootstrap = kafka_broker.bootstrap_servers
    (topic,) = _topics(bootstrap, "channel-gone", partitions=1)
    _produce(bootstrap, topic, [f"k{i}" for i in range(6)], partition=0)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        future.result(30)  # offsets 0-3 are gone, as after retention
    reader = _reader(bootstrap, [topic])
    with caplog.at_level(logging.WARNING, logger="spark_ext.sources.kafka_channel"):
        keys, end = _read_keys(reader, {topic: {"0": 0}}, 2)
    assert keys == ["k4", "k5"] and end == {topic: {"0": 6}}
    assert "records 0-3 are gone" in caplog.text
