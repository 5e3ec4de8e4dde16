"""Kafka end to end: a real broker (KRaft, Apache Kafka's jars), Spark's own Kafka
source, real sidecars and real Delta tables."""

from __future__ import annotations

import collections
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
        "answers": {"grace_ms": 1000},
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


def _records(bootstrap: str, topic: str, n: int, timeout_s: float = 60.0) -> list:
    """Read committed records of ``topic`` from the start until ``n`` came (or the timeout);
    then a little longer, to see any extra one."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    records, deadline, settle = [], time.monotonic() + timeout_s, None
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                records.append(msg)
            if len(records) >= n and settle is None:
                settle = time.monotonic() + 3.0  # any duplicate would follow right after
            if settle is not None and time.monotonic() > settle:
                break
    finally:
        consumer.close()
    return records


def test_a_replayed_publish_batch_puts_nothing_on_the_topic(kafka_broker) -> None:
    """The publisher's transaction commits its records and a marker of the batch id
    together: the same micro-batch published again (a replay after a crash) adds no
    record; the next one does."""
    from spark_ext.l4.answers_topic import AnswerPublisher

    topic = _topic("answers-replay")
    publisher = AnswerPublisher(topic, {"bootstrap.servers": kafka_broker.bootstrap_servers},
                                run_id=uuid.uuid4().hex[:8], key_columns=("event_id",))
    rows = [{"event_id": f"e{i}", "answer": "hi", "answer_source": "llm"} for i in range(3)]
    assert publisher.publish(rows, batch_id=0) == 3
    assert publisher.publish(rows, batch_id=0) == 0  # the replay
    again = AnswerPublisher(topic, {"bootstrap.servers": kafka_broker.bootstrap_servers},
                            run_id=publisher.run_id, key_columns=("event_id",))
    assert again.publish(rows, batch_id=0) == 0  # a restarted process, same run
    assert again.publish([{"event_id": "e9", "answer": "ok"}], batch_id=1) == 1
    publisher.close()
    again.close()
    records = _records(kafka_broker.bootstrap_servers, topic, 4)
    assert sorted(m.key() for m in records) == [b"e0", b"e1", b"e2", b"e9"]


def test_the_answers_topic_has_one_record_per_event_after_a_restart(
        spark, kafka_broker, tmp_path: Path) -> None:
    """``answers.topic``: every answer row on the topic, keyed by the event id, once;
    the pipeline stopped and started again from its checkpoints publishes the new
    events' answers and none of the old ones a second time."""
    bootstrap = kafka_broker.bootstrap_servers
    topic, answers_topic = _topic("events-pub"), _topic("answers")
    with _sidecar(tmp_path, "kafka-publish") as sidecar:
        config = _config(tmp_path, bootstrap, topic, sidecar.target, answers={"topic": answers_topic})
        _produce(bootstrap, topic, [_event(i, "first") for i in range(4)])
        first = StsPipeline(spark, config)
        first.start()
        try:
            _until_answered(first, 4)
            assert len(_records(bootstrap, answers_topic, 4)) == 4
        finally:
            first.stop()
        _produce(bootstrap, topic, [_event(i, "second") for i in range(4)])
        second = StsPipeline(spark, config)
        second.start()
        try:
            _until_answered(second, 8)
            records = _records(bootstrap, answers_topic, 8)
        finally:
            second.stop()
    keys = sorted(m.key().decode() for m in records)
    assert keys == sorted([f"first-{i}" for i in range(4)] + [f"second-{i}" for i in range(4)])
    assert {json.loads(m.value())["answer_source"] for m in records} == {"llm"}


def test_missing_result_topics_are_created_once(kafka_broker) -> None:
    """Spark's Kafka source fails on a subscribed topic that does not exist; a result
    topic exists only after a sidecar's first result. The pipeline creates them."""
    from spark_ext.sources.kafka import ensure_topics

    producer = {"bootstrap.servers": kafka_broker.bootstrap_servers}
    topics = [_topic("made.result.high"), _topic("made.result.low")]
    assert sorted(ensure_topics(producer, topics)) == sorted(topics)
    assert ensure_topics(producer, topics) == []


def test_an_events_topic_that_does_not_exist_is_refused_by_name(
        spark, kafka_broker, tmp_path: Path) -> None:
    """Spark's own error for it names no topic; the pipeline's start does, and starts
    leaves no query running."""
    from spark_ext.exceptions import PipelineConfigError

    topic = _topic("never-made")
    pipeline = StsPipeline(spark, _config(tmp_path, kafka_broker.bootstrap_servers, topic,
                                          "127.0.0.1:1", sidecar={"check_at_start": False}))
    try:
        with pytest.raises(PipelineConfigError, match=f"{topic} do not exist"):
            pipeline.start()
    finally:
        pipeline.stop()
    assert not [q for q in spark.streams.active if q.name and q.name.startswith("sts-")]


def _job(config: Path, log: Path):
    """``spark-submit spark_ext/pipeline/job.py`` with the Kafka connector, as its own
    process group (so that a kill -9 takes the JVM and the driver's Python together)."""
    import os
    import subprocess
    import sys

    from spark_ext.jvm_packages import packages
    from tests.utils import REPO

    env = dict(os.environ, PYSPARK_DRIVER_PYTHON=sys.executable, PYSPARK_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
         "--packages", ",".join(packages(["kafka"])),
         "--driver-java-options", "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m",
         str(REPO / "spark_ext" / "pipeline" / "job.py"), "--config", str(config),
         "--progress", "1", "--until-idle", "6", "--timeout", "300"],
        cwd=REPO, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, text=True,
        process_group=0)


@pytest.mark.slow
@pytest.mark.parametrize("submit", [0, "realtime"])
def test_a_killed_job_and_a_restarted_sidecar_lose_no_event(kafka_broker, tmp_path: Path,
                                                            submit: float | str) -> None:
    """Events and results on topics, the pipeline as a ``spark-submit`` job: the job is
    killed (``kill -9`` of its process group) mid-run and started again from its
    checkpoints, and the sidecar is restarted between the two: every event has exactly one
    answer row, and every answer is the model's (no result lost to a fallback). With the
    submit query in Real-Time Mode too (the requests on a topic the sidecar reads: the
    records of the batch the kill cut short are written again, duplicates)."""
    import os
    import signal

    import yaml

    bootstrap = kafka_broker.bootstrap_servers
    topic, tag = _topic("events-job"), uuid.uuid4().hex[:6]
    template = f"job-{tag}.result.{{priority}}"
    requests_topic = f"job-{tag}.requests"
    args = ["--engine", "simulated", "--set", "engine.simulated.step_base_ms=5",
            "--set", 'results.kind="kafka"', "--set", f'results.kafka.bootstrap_servers="{bootstrap}"',
            "--set", f'results.kafka.topic_template="{template}"',
            "--set", f'intake.topic="{requests_topic}"', "--set", f'intake.group_id="g-{tag}"']
    port = None
    config = _config(tmp_path, bootstrap, topic, "127.0.0.1:1",
                     tagging={"callback_topic": template},
                     sidecar={"result_channel": "kafka"})
    data = {name: getattr(config, name).__dict__ for name in ("source", "kafka")}
    data["kafka"]["requests_topic"] = requests_topic
    with RemoteSidecar(tmp_path / "results", args, log_path=tmp_path / "s1.log") as sidecar:
        port = sidecar.port
        conf = tmp_path / "pipeline.yaml"
        conf.write_text(yaml.safe_dump({
            **data,
            "tagging": {"event_time_ms": None, "max_tokens": 8, "callback_topic": template,
                        "sla_ms": {"high": 60_000, "normal": 60_000, "low": 60_000}},
            "sidecar": {"endpoint": sidecar.target, "result_channel": "kafka",
                        "results_dir": str(tmp_path / "results")},
            "answers": {"grace_ms": 2000},
            "output": {"out_dir": str(tmp_path / "tables"),
                       "checkpoint_dir": str(tmp_path / "ckpt"), "writer": "deltalake",
                       "triggers": {"submit": submit}}}))
        _produce(bootstrap, topic, [_event(i, "a") for i in range(8)])
        job = _job(conf, tmp_path / "job1.log")
        answers = tmp_path / "tables" / "answers"

        def answered() -> int:
            from deltalake import DeltaTable

            try:
                return DeltaTable(str(answers)).to_pyarrow_dataset().count_rows()
            except Exception:  # noqa: BLE001 - not there yet
                return 0

        wait_until(lambda: answered() >= 4, timeout_s=240, interval_s=0.5,
                   what="the first answers")
        os.killpg(job.pid, signal.SIGKILL)  # the driver and its JVM, at once
        job.wait(30)
    # the sidecar restarted on the same address, with events produced meanwhile
    _produce(bootstrap, topic, [_event(i, "b") for i in range(8)])
    restarted = RemoteSidecar(tmp_path / "results", args, log_path=tmp_path / "s2.log")
    restarted.port, restarted.target = port, f"127.0.0.1:{port}"
    with restarted:
        job = _job(conf, tmp_path / "job2.log")
        job.wait(timeout=400)
    log = (tmp_path / "job2.log").read_text()
    assert job.returncode == 0, log[-3000:]
    # The stop interrupts a Real-Time Mode query's task: Spark's "Aborting task" with its
    # stack is expected there, and kept off the log.
    assert "Aborting task" not in log and "InterruptException" not in log, log[-3000:]
    from deltalake import DeltaTable

    rows = DeltaTable(str(answers)).to_pyarrow_table().to_pylist()
    by_event = collections.Counter(r["event_id"] for r in rows)
    assert set(by_event) == {f"a-{i}" for i in range(8)} | {f"b-{i}" for i in range(8)}
    assert max(by_event.values()) == 1, "an event has two answer rows"
    assert {r["answer_source"] for r in rows} == {"llm"}, [
        (r["event_id"], r["answer_source"], r["reason"]) for r in rows if r["answer_source"] != "llm"]
