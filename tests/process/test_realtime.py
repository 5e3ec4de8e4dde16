"""``output.triggers.submit: realtime``: the submit query in Spark's Real-Time Mode writes
the requests to a topic a real sidecar reads (``intake.topic``), on a real broker; the
answers query (micro-batches) answers every event once: across a real-time batch
boundary, a restart of the pipeline, a request the sidecar refuses and a record that is
not an event. (The config's refusals: ``tests/unit/test_config_and_writer.py``.)"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from sidecar.contract import PRIORITY_NAMES
from spark_ext import PipelineConfig, StsPipeline
from tests.process.test_kafka import _answers_by_event, _produce, _records, _until_answered
from tests.utils import RemoteSidecar, wait_until

pytestmark = pytest.mark.timeout(420)


def _event(i: int, prefix: str, priority: str | None = None) -> tuple[str, bytes]:
    event = {"event_id": f"{prefix}-{i}", "text": f"My order {i} is late.",
             "priority": priority or PRIORITY_NAMES[i % 3]}
    return event["event_id"], json.dumps(event).encode()


def _config(tmp: Path, bootstrap: str, run: str, endpoint: str, writer: str,
            answers_topic: str | None) -> PipelineConfig:
    return PipelineConfig.from_dict({
        "source": {"format": "kafka", "options": {"subscribe": f"rt-{run}.events",
                                                  "startingOffsets": "earliest"}},
        "kafka": {"bootstrap_servers": bootstrap, "requests_topic": f"rt-{run}.requests"},
        "tagging": {"event_time_ms": None, "max_tokens": 8,
                    "callback_topic": f"rt-{run}.result.{{priority}}",
                    "sla_ms": {"high": 30_000, "normal": 40_000, "low": 50_000}},
        "sidecar": {"endpoint": endpoint, "result_channel": "kafka", "timeout_s": 3.0,
                    "acks_topic": f"rt-{run}.acks"},
        "answers": {"grace_ms": 1000, "topic": answers_topic},
        "output": {"out_dir": str(tmp / "out"), "checkpoint_dir": str(tmp / "ckpt"),
                   "writer": writer, "triggers": {"submit": "realtime"}},
    })


def _restarted(spark, config: PipelineConfig, bootstrap: str, topic: str,
               while_stopped: list[tuple[str, bytes]], expected: int
               ) -> tuple[StsPipeline, dict[str, dict]]:
    """``while_stopped`` produced while no pipeline runs, then a pipeline started again
    from the checkpoints until ``expected`` events are answered and have their
    ``requests`` record; it is stopped and returned with the answers (one row per event).

    A request's record comes from its ack (the acks topic), its answer from the result
    topic: a result may land before its ack, so the answers can be complete a micro-batch
    before the records are."""
    _produce(bootstrap, topic, while_stopped)
    restarted = StsPipeline(spark, config)
    restarted.start()
    try:
        _until_answered(restarted, expected)
        restarted.process_all_available()
        wait_until(lambda: restarted.store.read("requests", ["request_id"]).num_rows >= expected,
                   timeout_s=60, what=f"{expected} requests records")
        return restarted, _answers_by_event(restarted)
    finally:
        restarted.stop()


def _submit_batches(pipeline: StsPipeline) -> int:
    """Real-time batches the submit query finished (its progress reports)."""
    query = next(q for q in pipeline.queries if q.name == "sts-submit")
    return len(query.recentProgress)


@pytest.mark.parametrize("writer, publish", [("deltalake", False), ("spark", True)])
def test_a_realtime_submit_query_answers_every_event_once(spark, kafka_broker, tmp_path: Path,
                                                          writer: str, publish: bool) -> None:
    """Each writer (Delta on Spark, the default, with the answers topic too)."""
    run = uuid.uuid4().hex[:8]
    answers_topic = f"rt-{run}.answers" if publish else None
    bootstrap = kafka_broker.bootstrap_servers
    events = f"rt-{run}.events"
    first = [_event(i, "first") for i in range(6)]
    refused = _event(0, "urgent", priority="urgent")  # a priority the sidecar refuses
    bad = ("bad-json", b"{not json")
    _produce(bootstrap, events, [*first, refused, bad])
    sidecar_args = [
        "--engine", "simulated", "--sidecar-id", "rt", "--set", "engine.simulated.step_base_ms=5",
        "--set", "results.flush_interval_s=0.05", "--set", 'results.kind="kafka"',
        "--set", f'results.kafka.bootstrap_servers="{bootstrap}"',
        "--set", f'results.kafka.topic_template="rt-{run}.result.{{priority}}"',
        "--set", f'intake.topic="rt-{run}.requests"', "--set", f'intake.group_id="rt-{run}"']
    with RemoteSidecar(tmp_path / "results", sidecar_args,
                       log_path=tmp_path / "sidecar.log") as sidecar:
        config = _config(tmp_path, bootstrap, run, sidecar.target, writer, answers_topic)
        pipeline = StsPipeline(spark, config)
        pipeline.start()
        try:
            _until_answered(pipeline, len(first) + 1)
            # a real-time batch ends (its offsets checkpointed) before the next events
            wait_until(lambda: _submit_batches(pipeline) >= 1, timeout_s=60,
                       what="a real-time batch boundary")
            second = [_event(i, "second") for i in range(6)]
            _produce(bootstrap, events, second)
            _until_answered(pipeline, len(first) + 1 + len(second))
        finally:
            pipeline.stop()
        third = [_event(i, "third") for i in range(4)]
        restarted, answers = _restarted(spark, config, bootstrap, events, third,
                                        len(first) + 1 + len(second) + len(third))
    llm = {k for k, _ in [*first, *second, *third]}
    assert set(answers) == llm | {refused[0]}
    assert {answers[k]["answer_source"] for k in llm} == {"llm"}
    assert answers[refused[0]]["answer_source"] != "llm"
    assert answers[refused[0]]["status"] == "rejected"
    dead = restarted.store.read("dead_letters").to_pylist()
    assert [r["key"] for r in dead] == [b"bad-json"]
    requests = {r["request_id"]: r for r in restarted.store.read("requests").to_pylist()}
    assert len(requests) == len(llm) + 1  # the dead letter was never a request
    assert {r["endpoint"] for r in requests.values()} == {f"kafka:rt-{run}.requests"}
    if answers_topic is not None:  # one record per event, across the restart too
        published = _records(bootstrap, answers_topic, len(answers))
        assert sorted(m.key().decode() for m in published) == sorted(answers)


def test_a_sidecar_that_reads_another_requests_topic_is_refused_at_start(
        spark, kafka_broker, tmp_path: Path) -> None:
    """The submit query writes requests to one topic, the sidecar reads another: nothing
    but the safety net would answer. The start-up check compares them and refuses in one
    line naming both topics; no query starts."""
    from spark_ext import PipelineConfigError

    run = uuid.uuid4().hex[:8]
    bootstrap = kafka_broker.bootstrap_servers
    sidecar_args = [
        "--engine", "simulated", "--sidecar-id", "rt-other", "--set", 'results.kind="kafka"',
        "--set", f'results.kafka.bootstrap_servers="{bootstrap}"',
        "--set", f'intake.topic="rt-{run}.other"', "--set", f'intake.group_id="rt-{run}"']
    with RemoteSidecar(tmp_path / "results", sidecar_args,
                       log_path=tmp_path / "sidecar.log") as sidecar:
        pipeline = StsPipeline(spark, _config(tmp_path, bootstrap, run, sidecar.target,
                                              "deltalake", None))
        with pytest.raises(PipelineConfigError) as refused:
            pipeline.start()
    message = str(refused.value)
    assert "\n" not in message, message
    assert f"reads requests from 'rt-{run}.other' (its intake.topic)" in message, message
    assert f"writes them to 'rt-{run}.requests' (kafka.requests_topic" in message, message
    assert not [q for q in spark.streams.active if "sts-" in (q.name or "")]


@pytest.mark.parametrize("writer", ["spark", "deltalake"])
def test_the_models_answers_reach_the_answers_topic_in_real_time(spark, kafka_broker,
                                                                tmp_path: Path,
                                                                writer: str) -> None:
    """``output.triggers.publish: realtime`` (micro-batch submit, each writer): the
    model's answers go from the result topic to the answers topic in Real-Time Mode,
    stamped with the result's arrival (before the answers table has them); the refused
    request's fallback still comes from the change feed; across a pipeline restart each
    event's records all carry one answer from one publisher (a real-time replay may repeat
    a record; the micro-batch publisher never adds a model answer of its own)."""
    run = uuid.uuid4().hex[:8]
    bootstrap = kafka_broker.bootstrap_servers
    events, results, answers_topic = f"rtp-{run}.events", f"rtp-{run}.results", f"rtp-{run}.answers"
    first = [_event(i, "first") for i in range(6)]
    refused = _event(0, "urgent", priority="urgent")
    _produce(bootstrap, events, [*first, refused])
    sidecar_args = [
        "--engine", "simulated", "--sidecar-id", "rtp", "--set", "engine.simulated.step_base_ms=5",
        "--set", "results.flush_interval_s=0.05", "--set", 'results.kind="kafka"',
        "--set", f'results.kafka.bootstrap_servers="{bootstrap}"',
        "--set", f'results.kafka.topic_template="{results}"']
    with RemoteSidecar(tmp_path / "results", sidecar_args,
                       log_path=tmp_path / "sidecar.log") as sidecar:
        # one result topic: a real-time query holds a task slot per partition it reads
        config = PipelineConfig.from_dict({
            "source": {"format": "kafka", "options": {"subscribe": events,
                                                      "startingOffsets": "earliest"}},
            "kafka": {"bootstrap_servers": bootstrap},
            "tagging": {"event_time_ms": None, "max_tokens": 8, "callback_topic": results,
                        "sla_ms": {"high": 30_000, "normal": 40_000, "low": 50_000}},
            "sidecar": {"endpoint": sidecar.target, "result_channel": "kafka",
                        "timeout_s": 3.0, "acks_topic": f"rtp-{run}.acks"},
            "answers": {"grace_ms": 1000, "topic": answers_topic},
            "validation": {"enabled": False},
            "output": {"out_dir": str(tmp_path / "out"), "checkpoint_dir": str(tmp_path / "ckpt"),
                       "writer": writer, "triggers": {"publish": "realtime"}},
        })
        pipeline = StsPipeline(spark, config)
        pipeline.start()
        try:
            assert "sts-publish-realtime" in {q.name for q in pipeline.queries}
            _until_answered(pipeline, len(first) + 1)
        finally:
            pipeline.stop()
        second = [_event(i, "second") for i in range(4)]
        _, answers = _restarted(spark, config, bootstrap, events, second,
                                len(first) + 1 + len(second))
    llm = {k for k, _ in [*first, *second]}
    assert set(answers) == llm | {refused[0]}
    assert {answers[k]["answer_source"] for k in llm} == {"llm"}
    published: dict[str, list[dict]] = {}
    for m in _records(bootstrap, answers_topic, len(answers)):
        published.setdefault(m.key().decode(), []).append(json.loads(m.value()))
    assert set(published) == set(answers)
    for key, records in published.items():
        assert len({json.dumps(r, sort_keys=True) for r in records}) == 1, records
    fallback = published[refused[0]][0]
    assert (fallback["answer_source"], fallback["status"]) == ("fallback", "rejected")
    for key in llm:
        record, row = published[key][0], answers[key]
        assert list(record) == list(fallback), "a real-time record has other fields"
        assert (record["answer_source"], record["answer"]) == ("llm", row["answer"])
        assert all(record[c] == row[c] for c in ("request_id", "priority", "enqueue_ts",
                                                  "deadline_ts", "finish_ts", "enqueue_hour"))
        assert record["answered_ts"] < row["answered_ts"], "published by the change feed"


def test_a_realtime_request_record_carries_the_pipelines_answer_path(spark) -> None:
    """The real-time submit query's records carry ``delivery_ms`` (the sidecar's intake
    reads it like ``SubmitBatch``'s field); a row not submitted carries none."""
    from sidecar.kafka_intake import request_of
    from spark_ext.submit.realtime import request_records

    rows = spark.createDataFrame(
        [("r1", "high", "Hello", 8, 1_000, 9_000, True),
         ("r2", "low", "Hi", 8, 1_000, 9_000, False)],
        "request_id string, priority string, prompt string, max_tokens int, enqueue_ts long, "
        "deadline_ts long, go boolean")
    records = request_records(rows, pipeline_id="p1", requests_topic="req", acks_topic="acks",
                              submit_when="go", delivery_ms=700).collect()
    by_key = {r["key"]: (r["topic"], json.loads(r["value"])) for r in records}
    assert by_key["r1"][0] == "req" and by_key["r1"][1]["delivery_ms"] == 700
    assert request_of(by_key["r1"][1]).delivery_ms == 700
    assert by_key["r2"][0] == "acks" and "delivery_ms" not in by_key["r2"][1]
