"""Kafka end to end: a real broker (KRaft, Apache Kafka's jars), Spark's own Kafka
source, real sidecars and real Delta tables."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from sidecar.contract import PRIORITY_NAMES
from spark_ext import PipelineConfig, StsPipeline
from tests.utils import RemoteSidecar, wait_until

pytestmark = pytest.mark.timeout(420)


def _topic(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _produce(bootstrap: str, topic: str, records: list[tuple[str | None, bytes | None]]
             ) -> list[int]:
    """Produce ``(key, value)`` records in order; return their offsets."""
    from confluent_kafka import Producer

    offsets: list[int] = []
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, key=key, value=value,
                         on_delivery=lambda err, msg: offsets.append(msg.offset()))
    assert producer.flush(30) == 0, "records not delivered"
    return offsets


def _event(i: int, prefix: str) -> tuple[str, bytes]:
    event = {"event_id": f"{prefix}-{i}", "text": f"My order {i} is late.",
             "priority": PRIORITY_NAMES[i % 3]}
    return event["event_id"], json.dumps(event).encode()


def _sidecar(tmp: Path, name: str, *extra: str) -> RemoteSidecar:
    return RemoteSidecar(tmp / "results", [
        "--engine", "simulated", "--sidecar-id", name,
        "--set", "engine.simulated.step_base_ms=5", "--set", "results.flush_interval_s=0.05",
        *extra], log_path=tmp / f"{name}.log")


def _config(tmp: Path, bootstrap: str, topic: str, endpoint: str, **sections) -> PipelineConfig:
    data = {
        "source": {"format": "kafka", "options": {"subscribe": topic,
                                                  "startingOffsets": "earliest"}},
        "kafka": {"bootstrap_servers": bootstrap},
        "tagging": {"event_time_ms": None, "max_tokens": 8,
                    "sla_ms": {"high": 30_000, "normal": 40_000, "low": 50_000}},
        "sidecar": {"endpoint": endpoint, "results_dir": str(tmp / "results"), "timeout_s": 3.0},
        "answers": {"grace_ms": 1000, "safety_net_interval_s": 0.2},
        "output": {"out_dir": str(tmp / "out"), "checkpoint_dir": str(tmp / "ckpt"),
                   "writer": "deltalake"},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return PipelineConfig.from_dict(data)


def _answers_by_event(pipeline: StsPipeline) -> dict[str, dict]:
    rows = pipeline.store.read("answers").to_pylist()
    by_event = {r["event_id"]: r for r in rows}
    assert len(by_event) == len(rows), "an event has two answer rows"
    return by_event


def _until_answered(pipeline: StsPipeline, n: int, timeout_s: float = 120.0) -> dict[str, dict]:
    def done():
        pipeline.check()
        answers = _answers_by_event(pipeline)
        return answers if len(answers) >= n else None

    return wait_until(done, timeout_s=timeout_s, interval_s=0.3, what=f"{n} answers")


def test_events_from_a_topic_are_answered_once_and_bad_records_are_dead_letters(
        spark, kafka_broker, tmp_path: Path) -> None:
    """Good records are answered exactly once; a record that is not JSON, one without its
    key field and an empty one go to ``dead_letters`` with their offsets and reasons,
    never stop the query and are never submitted; the lag per partition drains to 0."""
    topic = _topic("events")
    good = [_event(i, "k") for i in range(9)]
    bad = [("bad-json", b"{not json"), ("no-id", json.dumps({"text": "hi"}).encode()),
           ("empty", None)]
    offsets = _produce(kafka_broker.bootstrap_servers, topic, good[:5] + bad + good[5:])
    with _sidecar(tmp_path, "kafka-l0") as sidecar:
        pipeline = StsPipeline(spark, _config(tmp_path, kafka_broker.bootstrap_servers, topic,
                                              sidecar.target))
        pipeline.start()
        try:
            answers = _until_answered(pipeline, len(good))
            pipeline.process_all_available()
            lag = pipeline.kafka_lag()
        finally:
            pipeline.stop()
    assert set(answers) == {key for key, _ in good}
    assert {a["answer_source"] for a in answers.values()} == {"llm"}
    dead = {r["offset"]: r for r in pipeline.store.read("dead_letters").to_pylist()}
    assert sorted(dead) == offsets[5:8]
    assert [dead[o]["key"] for o in offsets[5:8]] == [b"bad-json", b"no-id", b"empty"]
    assert dead[offsets[5]]["value"] == b"{not json" and "not a JSON object" in dead[offsets[5]]["error"]
    assert "missing required field 'event_id'" in dead[offsets[6]]["error"]
    assert dead[offsets[7]]["value"] is None and "empty record" in dead[offsets[7]]["error"]
    assert all(r["topic"] == topic and r["partition"] == 0 for r in dead.values())
    assert pipeline.dead_letters == 3
    requests = pipeline.store.read("requests")
    assert requests.num_rows == len(good), "a dead letter was submitted"
    assert lag["sts-submit"] == {f"{topic}/0": 0}


def test_a_broker_killed_for_ten_seconds_loses_no_event(spark, kafka_broker,
                                                        tmp_path: Path) -> None:
    """kill -9 of the broker mid-run, records produced while it is down (the producer
    buffers them), the broker back after 10 s: every event answered, none twice."""
    from confluent_kafka import Producer

    topic = _topic("outage")
    bootstrap = kafka_broker.bootstrap_servers
    _produce(bootstrap, topic, [_event(i, "before") for i in range(6)])
    with _sidecar(tmp_path, "kafka-outage") as sidecar:
        pipeline = StsPipeline(spark, _config(
            tmp_path, bootstrap, topic, sidecar.target,
            source={"options": {"subscribe": topic, "startingOffsets": "earliest",
                                "kafka.request.timeout.ms": "5000"}}))
        pipeline.start()
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                             "message.timeout.ms": 120_000, "log_level": 0})
        try:
            _until_answered(pipeline, 6)
            kafka_broker.kill()
            down_since = time.monotonic()
            for key, value in (_event(i, "during") for i in range(6)):
                producer.produce(topic, key=key, value=value)
            producer.poll(0)
            # the outage itself: 10 s with the broker gone, the query polling meanwhile
            wait_until(lambda: time.monotonic() - down_since >= 10, timeout_s=20,
                       what="a 10 s outage")
            pipeline.check()  # the query survived it
            kafka_broker.start()
            assert producer.flush(60) == 0
            answers = _until_answered(pipeline, 12, timeout_s=180)
        finally:
            if kafka_broker.proc is None or kafka_broker.proc.poll() is not None:
                kafka_broker.start()  # the broker is shared by the session
            pipeline.stop()
    assert set(answers) == {f"before-{i}" for i in range(6)} | {f"during-{i}" for i in range(6)}
