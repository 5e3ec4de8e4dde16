"""The ``kafka`` result channel against a real broker (the session's ``kafka_broker``) and
a real sidecar process (simulated engine): one record per result on its priority's topic
(or its ``callback_topic``), keyed by request id, the value the row as JSON; a broker
killed mid-burst and restarted loses and duplicates nothing; an unreachable broker does
not stop the sidecar from starting, and shows."""

from __future__ import annotations

import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from sidecar.contract import PRIORITY_NAMES, decode_result
from sidecar.pb.sts.v1 import inference_pb2 as pb
from tests.utils import RemoteSidecar, free_port, make_request, wait_until

ck = pytest.importorskip("confluent_kafka")


def _sidecar_args(bootstrap: str, template: str, *extra: str) -> list[str]:
    return ["--engine", "simulated", "--set", "engine.simulated.step_base_ms=2",
            "--set", "scheduler.deadline_admission=false", "--set", "warmup.enabled=false",
            # A busy test machine must not get requests shed: the channel is the point.
            *[arg for p in PRIORITY_NAMES
              for arg in ("--set", f"scheduler.pools.{p}.max_queue_delay_ms=60000")],
            "--set", 'results.kind="kafka"',
            "--set", f'results.kafka.bootstrap_servers="{bootstrap}"',
            "--set", f'results.kafka.topic_template="{template}"',
            # Reconnect quickly once a killed broker is back (librdkafka's default backs
            # off up to 10 s).
            "--set", "results.kafka.producer.reconnect.backoff.max.ms=500",
            "--set", "results.kafka.producer.retry.backoff.max.ms=500", *extra]


class _Reader:
    """Every record of some topics, from the start (read_committed), counted by key."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.records: list[tuple[str, str, dict]] = []
        self.consumer = ck.Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest", "isolation.level": "read_committed",
            "enable.auto.commit": False, "topic.metadata.refresh.interval.ms": 500,
            "log_level": 0})
        self.consumer.subscribe(topics)

    def read(self) -> int:
        """Read what is there now; the number of records read so far."""
        while (msg := self.consumer.poll(0.2)) is not None:
            if msg.error() is None:
                self.records.append((msg.topic(), msg.key().decode(), decode_result(msg.value())))
        return len(self.records)

    def until(self, ids: set[str], timeout_s: float = 60.0) -> dict[str, list]:
        """Read until every id of ``ids`` has a record; records by key."""
        wait_until(lambda: self.read() and ids <= {k for _, k, _ in self.records},
                   timeout_s, interval_s=0.0, what=f"records of {len(ids)} ids")
        by_key: dict[str, list] = {}
        for topic, key, row in self.records:
            by_key.setdefault(key, []).append((topic, row))
        return by_key

    def stored(self) -> int:
        """Records the topics hold (end minus start offsets): counts duplicates a consumer
        that stops early would miss."""
        total = 0
        for topic in self.topics:
            meta = self.consumer.list_topics(topic, timeout=10).topics[topic]
            for p in meta.partitions:
                low, high = self.consumer.get_watermark_offsets(
                    ck.TopicPartition(topic, p), timeout=10)
                total += high - low
        return total

    def close(self) -> None:
        self.consumer.close()


@pytest.mark.timeout(180)
def test_every_result_has_one_record_on_its_topic(kafka_broker, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    template = f"res-{run}.{{priority}}"
    callback = f"cb-{run}"
    topics = [template.format(priority=p) for p in PRIORITY_NAMES] + [callback]
    rows = [make_request(f"{run}-{i}", priority=PRIORITY_NAMES[i % 3], max_tokens=4,
                         attributes={"ticket_id": f"T-{i}"}) for i in range(45)]
    rows.append(make_request(f"{run}-cb", callback_topic=callback))
    rows.append(make_request(f"{run}-bad", priority="urgent"))  # no known priority
    reader = _Reader(kafka_broker.bootstrap_servers, topics)
    try:
        with RemoteSidecar(tmp_path / "results", _sidecar_args(
                kafka_broker.bootstrap_servers, template)) as sidecar:
            assert sidecar.client is not None
            acks = sidecar.client.submit(rows).acks
            assert sum(a.accepted for a in acks) == 46  # all but the unknown priority
            reader.until({r["request_id"] for r in rows})
            # finish_and_backfill (low in conf/sidecar.yaml): still generating at its
            # deadline, it gets its timeout row then, and its late ok row on the same topic.
            late = make_request(f"{run}-late", priority="low", max_tokens=400,
                                deadline_in_ms=300)
            assert sidecar.client.submit([late]).acks[0].accepted
            wait_until(lambda: reader.read() and len(
                [k for _, k, _ in reader.records if k == late["request_id"]]) == 2, 60,
                interval_s=0.0, what="the late row")
        by_key = reader.until({r["request_id"] for r in rows})
        assert reader.stored() == len(rows) + 2  # one record each, two for the late one
    finally:
        reader.close()
    (topic_1, timeout_row), (topic_2, late_row) = by_key.pop(f"{run}-late")
    assert topic_1 == topic_2 == template.format(priority="low")
    assert (timeout_row["status"], timeout_row["late"]) == ("timeout", False)
    assert (late_row["status"], late_row["late"], late_row["reason"]) == ("ok", True, "")
    for row in rows:
        (topic, value), = by_key[row["request_id"]]
        assert value["request_id"] == row["request_id"] and value["late"] is False
        assert value["attributes"] == row.get("attributes", {})
    assert by_key[f"{run}-cb"][0][0] == callback
    assert by_key[f"{run}-bad"][0][0] == template.format(priority="normal")
    assert by_key[f"{run}-bad"][0][1]["status"] == "rejected"
    for i in range(45):
        topic, value = by_key[f"{run}-{i}"][0]
        assert topic == template.format(priority=PRIORITY_NAMES[i % 3])
        assert value["status"] == "ok" and value["output_tokens"] >= 1
        assert isinstance(value["finish_ts"], int) and isinstance(value["ttft_ms"], float)


@pytest.mark.timeout(240)
def test_a_broker_killed_mid_burst_loses_and_duplicates_nothing(
        kafka_broker, tmp_path: Path) -> None:
    """The broker is killed (SIGKILL) while results are produced and started again about
    10 s later; requests submitted meanwhile are still accepted (the rows wait in the
    producer); once it is back every result is there exactly once."""
    run = uuid.uuid4().hex[:8]
    template = f"outage-{run}.{{priority}}"
    topics = [template.format(priority=p) for p in PRIORITY_NAMES]
    ids: list[str] = []
    accepted: list[str] = []
    reader = _Reader(kafka_broker.bootstrap_servers, topics)
    try:
        with RemoteSidecar(tmp_path / "results", _sidecar_args(
                kafka_broker.bootstrap_servers, template)) as sidecar:
            client = sidecar.client
            assert client is not None

            def burst(tag: str, n: int = 30) -> None:
                rows = [make_request(f"{run}-{tag}-{i}", priority=PRIORITY_NAMES[i % 3],
                                     max_tokens=8) for i in range(n)]
                acks = client.submit(rows).acks
                # Every request gets its row, accepted or shed; an outage refuses none.
                assert not [a for a in acks if a.reason == pb.REFUSAL_REASON_RESULTS_BACKLOG]
                accepted.extend(a.request_id for a in acks if a.accepted)
                ids.extend(r["request_id"] for r in rows)

            def answered() -> bool:
                return sum(client.stats().results_by_status.values()) == len(ids)

            burst("before")
            kafka_broker.kill()
            killed_at = time.monotonic()
            try:
                wait_until(lambda: client.stats().result_channel.up == 0, 30,
                           what="the channel sees the brokers down")
                # Bursts go on for about 8 s of the outage (the restart adds a few more).
                while time.monotonic() - killed_at < 8.0:
                    burst(f"during-{len(ids)}", 10)
                    wait_until(answered, 30, interval_s=0.05, what="the burst answered")
                assert client.stats().result_channel.buffered > 0  # waiting for the broker
            finally:
                kafka_broker.start()
            outage_s = time.monotonic() - killed_at
            burst("after")
            by_key = reader.until(set(ids), timeout_s=90)
            stats = client.stats().result_channel
        assert reader.stored() == len(ids)
    finally:
        reader.close()
    assert outage_s >= 8.0
    assert all(len(by_key[i]) == 1 for i in ids)
    assert len(accepted) > len(ids) // 2  # mostly accepted: load, not the outage, sheds
    assert {by_key[i][0][1]["status"] for i in accepted} <= {"ok", "timeout"}
    assert stats.delivery_errors == 0 and stats.up == 1


@pytest.mark.timeout(120)
def test_an_unreachable_broker_does_not_stop_the_start_and_shows(tmp_path: Path) -> None:
    """No broker at the address: the sidecar starts and answers, the row waits in the
    producer, the log and ``/metrics`` say the brokers are unreachable, and the drain
    logs the rows it could not deliver (their count)."""
    metrics_port = free_port()
    args = _sidecar_args(f"127.0.0.1:{free_port()}", "nowhere.{priority}",
                         "--metrics-port", str(metrics_port), "--drain-timeout", "1")
    with RemoteSidecar(tmp_path / "results", args) as sidecar:
        client = sidecar.client
        assert client is not None
        assert client.submit([make_request("u-1")]).acks[0].accepted
        wait_until(lambda: client.stats().result_channel.buffered == 1, 30,
                   what="the row waits in the producer")

        def scrape() -> str:
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            return urllib.request.urlopen(url, timeout=5).read().decode()

        wait_until(lambda: 'sts_sidecar_result_channel_up{kind="kafka"} 0.0' in scrape(), 30,
                   what="result_channel_up 0")
        text = scrape()
        assert 'sts_sidecar_result_channel_buffered{kind="kafka"} 1.0' in text
        assert 'sts_sidecar_result_channel_produced_total{kind="kafka"} 1.0' in text
    log = sidecar.tail_log(20_000)
    assert "cannot reach the brokers" in log
    assert "closed with 1 result rows not acknowledged" in log, log[-2000:]


@pytest.mark.timeout(180)
def test_requests_read_from_a_topic_get_one_row_each(kafka_broker, tmp_path: Path) -> None:
    """``intake.topic``: requests written as JSON records (what a Real-Time Mode submit
    query writes) are admitted like ``SubmitBatch``: one row each (``ok``, or the
    refusal's row: there is no ack), a record read twice (a replay) gets no second row,
    a record with a field of the wrong type is refused with a row, and a record that
    names no request is counted and skipped. A second sidecar of the group started after
    the first stopped reads only what the first had not admitted."""
    import json

    run = uuid.uuid4().hex[:8]
    template = f"intake-{run}.{{priority}}"
    requests_topic = f"intake-{run}.requests"
    topics = [template.format(priority=p) for p in PRIORITY_NAMES]
    bootstrap = kafka_broker.bootstrap_servers
    producer = ck.Producer({"bootstrap.servers": bootstrap, "log_level": 0})

    def write(rows: list[dict | bytes]) -> None:
        for row in rows:
            value = row if isinstance(row, bytes) else json.dumps(row).encode()
            producer.produce(requests_topic, value=value)
        assert producer.flush(30) == 0

    good = [make_request(f"{run}-{i}", priority=PRIORITY_NAMES[i % 3], max_tokens=4,
                         attributes={"event_id": f"e-{i}"}) for i in range(6)]
    late = make_request(f"{run}-late", deadline_in_ms=-1_000)  # already past its deadline
    wrong = {**make_request(f"{run}-wrong"), "max_tokens": "many"}
    write([*good, late, wrong, b"not json", json.dumps({"text": "no id"}).encode()])
    reader = _Reader(bootstrap, topics)
    args = _sidecar_args(bootstrap, template, "--set", f'intake.topic="{requests_topic}"',
                         "--set", f'intake.group_id="g-{run}"')
    metrics_port = free_port()
    try:
        with RemoteSidecar(tmp_path / "results", [*args, "--metrics-port", str(metrics_port)],
                           log_path=tmp_path / "s1.log"):
            first = reader.until({r["request_id"] for r in [*good, late, wrong]})
            write([good[0], good[1]])  # read again: duplicates, no second row
            again = make_request(f"{run}-after", max_tokens=4)
            write([again])
            reader.until({again["request_id"]})
            scraped = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                             timeout=5).read().decode()
            for outcome, n in (("read", 13), ("admitted", 11), ("invalid", 2)):
                assert f'sts_sidecar_intake_records_total{{outcome="{outcome}"}} {n}.0' \
                    in scraped, scraped
        log = (tmp_path / "s1.log").read_text(encoding="utf-8")
        assert "Kafka intake stopped: 13 records, 11 admitted, 2 invalid." in log, log[-2000:]
        # the next sidecar of the group starts where the first stopped
        second = make_request(f"{run}-second", max_tokens=4)
        write([second])
        with RemoteSidecar(tmp_path / "results-2", args, log_path=tmp_path / "s2.log"):
            reader.until({second["request_id"]})
        log = (tmp_path / "s2.log").read_text(encoding="utf-8")
        assert "Kafka intake stopped: 1 records, 1 admitted, 0 invalid." in log, log[-2000:]
        by_key = reader.until({r["request_id"] for r in [*good, late, wrong, again, second]})
        assert reader.stored() == len(good) + 4  # one row per request, none for the replays
    finally:
        reader.close()
    for row in good:
        (_, value), = by_key[row["request_id"]]
        assert value["status"] == "ok" and value["attributes"] == row["attributes"]
        assert value["submit_ts"] > 0  # the record's timestamp
    (_, late_row), = by_key[late["request_id"]]
    assert (late_row["status"], late_row["reason"]) == ("rejected", "deadline_passed")
    (_, wrong_row), = by_key[wrong["request_id"]]
    assert wrong_row["status"] == "rejected"
    assert len(first) >= 8
