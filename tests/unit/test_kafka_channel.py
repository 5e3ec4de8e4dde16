"""The ``kafka`` result channel without a broker: the JSON value and topic rules, its
config errors (one line), and admission refusing ``results_backlog`` when the
producer's buffer cannot take more rows (brokers unreachable: nothing is acknowledged)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

import pytest

from sidecar import ConfigError
from sidecar.cli import main
from sidecar.config import KafkaChannelConfig, ResultChannelConfig, SchedulerConfig, SidecarConfig
from sidecar.contract import (
    RESULT_COLUMNS,
    RESULT_SCHEMA,
    Priority,
    RefusalReason,
    decode_result,
    encode_result,
    result_topic,
)
from sidecar.request_state import ResultRecord
from sidecar.result_channels import build_result_channel
from sidecar.scheduler import Scheduler
from tests.utils import fast_engine, free_port, make_sidecar_request, until

pytest.importorskip("confluent_kafka")


def _record(**kw) -> ResultRecord:
    fields = dict(
        request_id="r-1", trace_id="t-1", status="ok", text="Héllo", finish_reason="stop",
        prompt_tokens=3, output_tokens=2, cached_tokens=0, enqueue_ts=1, received_ts=2,
        first_token_ts=3, finish_ts=4, ttft_ms=1.0, tpot_ms=None, error=None, sidecar_id="s",
        model="m", priority="high", deadline_ts=9, callback_topic="",
        attributes={"ticket_id": "T-1"}, submit_ts=5)
    return ResultRecord(**(fields | kw))


def test_the_value_is_one_json_object_of_the_result_columns() -> None:
    record = _record(late=True)
    value = encode_result(record)
    row = decode_result(value)
    assert tuple(row) == RESULT_COLUMNS == tuple(f.name for f in RESULT_SCHEMA)
    assert row["text"] == "Héllo" and "Héllo".encode() in value  # UTF-8, not escaped
    assert row["attributes"] == {"ticket_id": "T-1"} and row["late"] is True
    assert row["prompt_tokens"] == 3 and row["tpot_ms"] is None and row["error"] is None
    assert b'"late":true' in value and b'"prompt_tokens":3' in value
    # A Parquet row (attributes as pairs) encodes to the same value.
    assert encode_result(dict(row, attributes=[("ticket_id", "T-1")])) == value


@pytest.mark.parametrize("change, what", [
    ({"late": None}, "late"), ({"prompt_tokens": "3"}, "prompt_tokens"),
    ({"attributes": {"a": 1}}, "attributes"), ({"request_id": None}, "request_id"),
    ({"extra": 1}, "unknown columns"),
])
def test_a_value_off_the_schema_is_refused_by_name(change: dict, what: str) -> None:
    row = decode_result(encode_result(_record()))
    with pytest.raises(ValueError, match=what):
        decode_result(json.dumps(row | change))
    with pytest.raises(ValueError, match="lacks columns"):
        decode_result(b"{}")


def test_topic_rules() -> None:
    assert result_topic("llm.result.{priority}", "", "low") == "llm.result.low"
    assert result_topic("llm.result.{priority}", "", "") == "llm.result.normal"
    assert result_topic("llm.result.{priority}", "answers.svc", "low") == "answers.svc"


@pytest.mark.parametrize("kafka, what", [
    ({"producer": {"enable.idempotence": False}}, "enable.idempotence"),
    ({"producer": {"acks": 1}}, "acks"),
    ({"producer": {"queue.buffering.max.messages": 5}}, "max_buffered"),
    ({"max_buffered": 0}, "max_buffered"),
    ({"max_buffered": 10, "refusal_reserve": 10}, "refusal_reserve"),
    ({"topic_template": "llm.{prio}"}, "topic_template"),
    ({"bootstrap_servers": "a:1", "producer": {"bootstrap.servers": "b:2"}}, "differ"),
    ({"brokers": "a:1"}, "unknown keys in results.kafka"),
])
def test_bad_kafka_settings_name_the_field(kafka: dict, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        SidecarConfig.from_dict({"results": {"kind": "kafka",
                                             "kafka": {"bootstrap_servers": "a:1"} | kafka}})


def test_config_errors_are_one_line_with_exit_code_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["sidecar", "--engine", "simulated", "--results-dir", str(tmp_path),
            "--listen", f"127.0.0.1:{free_port()}", "--set", 'results.kind="kafka"']
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "results.kafka.bootstrap_servers" in err
    # A setting librdkafka does not know: refused before the engine starts.
    assert main([*base, "--set", 'results.kafka.bootstrap_servers="127.0.0.1:1"',
                 "--set", "results.kafka.producer.no.such.setting=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'No such configuration property: "no.such.setting"' in err
    assert err.startswith("sts: the Kafka producer refused its settings")


def test_without_confluent_kafka_the_channel_is_a_config_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)  # import fails
    config = ResultChannelConfig(kind="kafka", kafka=KafkaChannelConfig(bootstrap_servers="a:1"))
    with pytest.raises(ConfigError, match=r"pip install 'sts-spark\[kafka\]'"):
        build_result_channel(config, "s0")


@pytest.mark.timeout(60)
def test_a_full_buffer_refuses_at_admission_and_keeps_every_row(
        caplog: pytest.LogCaptureFixture) -> None:
    """Brokers unreachable: nothing is acknowledged. With room for 12 rows, 4 kept for
    refusals, 8 requests are accepted (their rows wait in the producer), the next 4 are
    refused ``results_backlog`` with one result row each, and the ones after that by
    their ack alone; nothing is dropped, and closing logs what is unacknowledged."""
    channel = build_result_channel(ResultChannelConfig(kind="kafka", kafka=KafkaChannelConfig(
        bootstrap_servers=f"127.0.0.1:{free_port()}", max_buffered=12, refusal_reserve=4,
        producer={"log_level": 0})), "s0")
    rows: list[ResultRecord] = []

    def emit(record: ResultRecord) -> None:
        rows.append(record)
        channel.emit(record)

    async def run() -> list:
        engine = fast_engine()
        await engine.start()
        channel.start()
        scheduler = Scheduler(engine, emit, SchedulerConfig(deadline_admission=False),
                              "s0", results=channel)
        scheduler.start()
        try:
            acks = scheduler.submit_batch([make_sidecar_request(f"a{i}", max_tokens=2)
                                           for i in range(8)])
            await until(lambda: len(rows) == 8)  # answered; the rows wait for the brokers
            acks += scheduler.submit_batch([make_sidecar_request(f"b{i}", priority=Priority.LOW)
                                            for i in range(6)])
            stats = scheduler.stats().result_channel
            return [acks, stats]
        finally:
            await scheduler.abort_all()
            await engine.shutdown()
            with caplog.at_level(logging.INFO, logger="sidecar.result_channels.kafka"):
                await channel.close(timeout_s=0.5)

    acks, stats = asyncio.run(run())
    assert [a.accepted for a in acks[:8]] == [True] * 8
    refused = acks[8:]
    assert {a.reason for a in refused} == {RefusalReason.RESULTS_BACKLOG}
    assert all(a.fallback_text for a in refused)
    by_id = {r.request_id: r for r in rows}
    assert len(rows) == len(by_id) == 12  # 8 answers + the 4 refusals the reserve holds
    assert [by_id[f"b{i}"].reason for i in range(4)] == ["results_backlog"] * 4
    assert {by_id[f"b{i}"].status for i in range(4)} == {"shed"}
    assert "b4" not in by_id and "b5" not in by_id  # no room left: the ack alone answers
    assert stats.kind == "kafka" and stats.buffered == stats.produced == 12
    assert stats.delivered == 0 and stats.up is not True
    assert "12 result rows not acknowledged" in caplog.text
