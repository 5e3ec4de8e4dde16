"""Tracing L0-L4 end to end: a real OTLP receiver (gRPC), real Spark local mode, a
simulated-engine sidecar process and real Delta tables; one trace per event."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest

from sidecar import write_text_atomically
from sidecar.contract import event_span_id
from spark_ext.config import PipelineConfig
from spark_ext.pipeline.sts_pipeline import StsPipeline
from sts_harness.trace_receiver import TraceReceiver
from tests.utils import RemoteSidecar, wait_until

pytestmark = pytest.mark.timeout(240)

INCOMING_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
INCOMING_SPAN = "00f067aa0ba902b7"
L3_CHILDREN = {"sts.l3.admission", "sts.l3.queue", "sts.l3.engine", "sts.l3.result_write"}


def _config(tmp: Path, endpoint: str) -> PipelineConfig:
    return PipelineConfig.from_dict({
        "source": {"path": str(tmp / "events"),
                   "schema": "event_id STRING, text STRING, priority STRING, event_ts LONG, "
                             "traceparent STRING"},
        "tagging": {"event_time_ms": None, "max_tokens": 8, "traceparent": "traceparent",
                    # low: a deadline already past when it reaches the sidecar -> fallback
                    "sla_ms": {"high": 120_000, "normal": 120_000, "low": 1}},
        "sidecar": {"endpoint": endpoint, "results_dir": str(tmp / "results"), "timeout_s": 3.0},
        "answers": {"grace_ms": 5000},
        "output": {"out_dir": str(tmp / "out"), "checkpoint_dir": str(tmp / "ckpt"),
                   "writer": "deltalake"},
    })


def test_one_trace_per_event_from_the_spark_task_through_the_sidecar_to_the_answer(
        spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with TraceReceiver(port=0, out=tmp_path / "spans.jsonl") as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
        monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
        monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        events = [
            {"event_id": "tr-1", "text": "Where is my parcel?", "priority": "high",
             "event_ts": 0, "traceparent": f"00-{INCOMING_TRACE}-{INCOMING_SPAN}-01"},
            {"event_id": "tr-2", "text": "Refund please.", "priority": "normal",
             "event_ts": 0, "traceparent": None},
            {"event_id": "tr-3", "text": "Cancel my order.", "priority": "low",
             "event_ts": 0, "traceparent": "not a traceparent"},
        ]
        args = ["--engine", "simulated", "--sidecar-id", "traced",
                "--set", "engine.simulated.step_base_ms=5",
                "--set", "scheduler.deadline_admission=false",
                "--set", "results.flush_interval_s=0.05"]
        with RemoteSidecar(tmp_path / "results", args,
                           log_path=tmp_path / "sidecar.log") as sidecar:
            pipeline = StsPipeline(spark, _config(tmp_path, sidecar.target))
            try:
                pipeline.start()
                write_text_atomically(tmp_path / "events" / "e.json",
                                      "".join(json.dumps(e) + "\n" for e in events))
                deadline = time.monotonic() + 90
                while len(pipeline.store.read("answers").to_pylist()) < 3:
                    assert time.monotonic() < deadline, "no answers"
                    pipeline.process_all_available()
                    time.sleep(0.3)
            finally:
                pipeline.stop()  # flushes the driver's spans
        # the sidecar drained and flushed its spans as it stopped
        answers = {a["event_id"]: a for a in pipeline.store.read("answers").to_pylist()}
        wait_until(lambda: sum(s["name"].startswith("sts.l4") for s in receiver.spans) >= 3
                   and sum(s["name"] == "sts.l3.request" for s in receiver.spans) >= 3
                   and sum(s["name"] == "sts.l1.event" for s in receiver.spans) >= 3,
                   30, what="spans of the three events")
        spans = list(receiver.spans)

    assert answers["tr-1"]["answer_source"] == "llm", answers
    assert answers["tr-3"]["answer_source"] == "fallback"
    # trace_id holds the W3C trace id: the event's own, else the request id
    assert answers["tr-1"]["trace_id"] == INCOMING_TRACE
    assert answers["tr-2"]["trace_id"] == answers["tr-2"]["request_id"]
    assert answers["tr-3"]["trace_id"] == answers["tr-3"]["request_id"]  # not a traceparent
    by_trace: dict[str, list[dict]] = defaultdict(list)
    for s in spans:
        by_trace[s["trace_id"]].append(s)
    for event_id, answer in answers.items():
        trace = by_trace[answer["trace_id"]]
        names = defaultdict(list)
        for s in trace:
            names[s["name"]].append(s)
        event = names["sts.l1.event"]
        assert len(event) == 1, (event_id, [s["name"] for s in trace])
        event = event[0]
        assert event["component"] == "spark-task"
        assert event["span_id"] == event_span_id(answer["request_id"])
        assert event["parent_span_id"] == (INCOMING_SPAN if event_id == "tr-1" else "")
        (submit,) = names["sts.l1.submit"]
        assert submit["parent_span_id"] == event["span_id"]
        assert submit["links"], "the submit span links to its batch's span"
        (request,) = names["sts.l3.request"]
        assert request["component"] == "sidecar"
        assert request["parent_span_id"] == event["span_id"]
        children = {s["name"] for s in trace if s["parent_span_id"] == request["span_id"]}
        l4 = names["sts.l4.fallback" if event_id == "tr-3" else "sts.l4.answer"]
        assert len(l4) == 1 and l4[0]["component"] == "spark-driver"
        assert l4[0]["parent_span_id"] == event["span_id"]
        if event_id == "tr-3":  # past its deadline: refused at admission, no engine
            assert "sts.l3.admission" in children and "sts.l3.engine" not in children
            assert request["attributes"]["sts.status"] == "rejected"
        else:
            assert children == L3_CHILDREN
            (engine,) = names["sts.l3.engine"]
            assert [e["name"] for e in engine["events"]] == ["first_token"]
            assert l4[0]["attributes"]["sts.answer_source"] == "llm"
    batches = [s for s in spans if s["name"] == "sts.l1.submit_batch"]
    linked = {link["span_id"] for b in batches for link in b["links"]}
    assert {event_span_id(a["request_id"]) for a in answers.values()} <= linked
    assert (tmp_path / "spans.jsonl").read_text().count("\n") == len(spans)
