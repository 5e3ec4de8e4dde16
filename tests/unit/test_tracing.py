"""Tracing: off unless the OTEL_* variables ask; the sidecar's L3 spans and their
parents; the bundled OTLP receiver and `sts trace show` (a real gRPC export in process)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sidecar import Tracing, start_tracing
from sidecar.cli import main
from sidecar.client import request_to_proto
from sidecar.config import SchedulerConfig
from sidecar.contract import TRACEPARENT, format_traceparent
from sidecar.pb.sts.v1 import inference_pb2 as pb
from sidecar.servicer import InferenceServicer
from sidecar.tracing import SidecarTracer, sidecar_tracer
from sts_harness.trace_receiver import TraceReceiver
from tests.utils import fast_engine, make_request, until, wait_until, with_scheduler

PARENT = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")


@pytest.fixture
def no_otel(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)


def test_tracing_is_off_by_default_and_by_otel_sdk_disabled(
        no_otel: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert sidecar_tracer() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert start_tracing("sidecar", "sts-sidecar") is None
    monkeypatch.setenv("OTEL_SDK_DISABLED", "false")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert start_tracing("sidecar", "sts-sidecar") is None


def test_sidecar_spans_are_children_of_the_requests_traceparent(no_otel: None) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )

    exporter = InMemorySpanExporter()
    tracer = SidecarTracer(Tracing("sidecar", "sts-sidecar", exporter=exporter))
    traced = {TRACEPARENT: format_traceparent(*PARENT)}
    msgs = [request_to_proto(make_request("ok", attributes=traced)),
            request_to_proto(make_request("refused", attributes=traced, max_tokens=0)),
            request_to_proto(make_request("untraced"))]

    async def body(scheduler, results) -> None:
        scheduler.tracer = tracer
        servicer = InferenceServicer(scheduler, engine_kind="simulated", started_at=0.0)
        reply = await servicer.SubmitBatch(pb.SubmitBatchRequest(requests=msgs), None)
        assert [a.accepted for a in reply.acks] == [True, False, True]
        await until(lambda: len(results) == 3)
        tracer.written(results)

    asyncio.run(with_scheduler(fast_engine(), SchedulerConfig(), body))
    tracer.tracing.flush()
    spans = exporter.get_finished_spans()
    requests = {s.attributes["sts.request_id"]: s for s in spans if s.name == "sts.l3.request"}
    assert set(requests) == {"ok", "refused"}, "only requests with a traceparent are traced"
    for rid, span in requests.items():
        assert format(span.context.trace_id, "032x") == PARENT[0]
        assert format(span.parent.span_id, "016x") == PARENT[1]
        children = {s.name: s for s in spans if s.parent is not None
                    and s.parent.span_id == span.context.span_id}
        if rid == "ok":
            assert set(children) == {"sts.l3.admission", "sts.l3.queue", "sts.l3.engine",
                                     "sts.l3.result_write"}
            assert [e.name for e in children["sts.l3.engine"].events] == ["first_token"]
            assert children["sts.l3.queue"].end_time <= children["sts.l3.engine"].start_time
        else:
            assert set(children) == {"sts.l3.admission", "sts.l3.result_write"}
            assert children["sts.l3.admission"].attributes["sts.accepted"] is False
    assert not tracer._admitted and not tracer._dispatched, "times kept after the rows"


def test_receiver_captures_an_otlp_export_and_trace_show_prints_the_tree(
        no_otel: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "spans.jsonl"
    with TraceReceiver(port=0, out=out) as receiver:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter,
        )

        tracing = Tracing("spark-task", "sts-spark", exporter=OTLPSpanExporter(
            endpoint=receiver.endpoint, insecure=True))
        root = tracing.span("sts.l1.event", start_ns=1_000_000_000, trace_id=PARENT[0],
                            span_id=PARENT[1], attributes={"sts.request_id": "r1"})
        child = tracing.span("sts.l1.submit", parent=root, start_ns=1_002_000_000)
        child.add_event("first_token", timestamp=1_003_000_000)
        child.end(end_time=1_004_500_000)
        root.end(end_time=1_010_000_000)
        tracing.shutdown()
        wait_until(lambda: len(receiver.spans) == 2, 10, what="two spans received")
        with pytest.raises(OSError, match="cannot listen on 127.0.0.1:"):
            TraceReceiver(port=receiver.port)  # the port is taken
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_name = {r["name"]: r for r in rows}
    assert by_name["sts.l1.event"]["span_id"] == PARENT[1]
    assert by_name["sts.l1.submit"]["parent_span_id"] == PARENT[1]
    assert {r["trace_id"] for r in rows} == {PARENT[0]}
    assert main(["trace", "show", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"trace {PARENT[0]}",
                     "sts.l1.event [spark-task] request_id=r1  +0.0 ms  10.0 ms",
                     "  sts.l1.submit [spark-task]  +2.0 ms  2.5 ms",
                     "    * first_token  +3.0 ms"]
    assert main(["trace", "show", str(out), "--trace-id", "ab" * 16]) == 2
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    assert main(["trace", "show", str(tmp_path / "bad.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"sts: no such trace (--trace-id {'ab' * 16})",
                   (f"sts: line 1 is not a span (Expecting property name enclosed in double "
                    f"quotes: line 1 column 2 (char 1)) ({tmp_path / 'bad.jsonl'})")]


def test_spark_side_spans_name_the_event_span_from_the_row(no_otel: None) -> None:
    import pyarrow as pa
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )

    from sidecar.contract import event_span_id
    from spark_ext.tracing import AnswerSpans, SubmitSpans

    exporter = InMemorySpanExporter()
    tracing = Tracing("spark-task", "sts-spark", exporter=exporter)
    rid, other, full = "a" * 32, "b" * 32, "c" * 32
    rows = [{"request_id": rid, "trace_id": rid, "priority": "high", "enqueue_ts": 5,
             "attributes": {}, "tp": format_traceparent(*PARENT)},
            {"request_id": other, "trace_id": "ticket-7", "priority": "low", "enqueue_ts": 5,
             "attributes": {}, "tp": None},
            {"request_id": full, "trace_id": full, "priority": "low", "enqueue_ts": 5,
             "attributes": {"k": "x" * 1000}, "tp": None}]
    spans = SubmitSpans(tracing, "tp")
    spans.prepare(rows)
    spans.end([True, False, True], [None, "queue_full", None], "127.0.0.1:1")
    assert rows[0]["trace_id"] == PARENT[0], "the event's own trace"
    assert rows[0]["attributes"][TRACEPARENT] == format_traceparent(PARENT[0], event_span_id(rid))
    assert len(rows[1]["trace_id"]) == 32 and rows[1]["trace_id"] != "ticket-7"
    assert TRACEPARENT not in rows[2]["attributes"], "never pushed over the 1 KiB limit"
    answers = AnswerSpans(tracing)
    answers.answered([{"request_id": rid, "trace_id": rows[0]["trace_id"],
                       "answer_source": "fallback", "status": "timeout", "finish_ts": 7},
                      {"request_id": "r" * 32, "trace_id": "r" * 32, "answer_source": "rule",
                       "enqueue_ts": 6}], answered_ms=9)
    answers.backfilled(pa.table({"request_id": [rid, other], "trace_id": [PARENT[0], "x"],
                                 "finish_ts": [8, 8]}), [rid], answered_ms=10)
    tracing.flush()
    got = {(s.name, s.attributes.get("sts.request_id")): s
           for s in exporter.get_finished_spans()}
    event = got[("sts.l1.event", rid)]
    assert format(event.parent.span_id, "016x") == PARENT[1]
    assert format(event.context.span_id, "016x") == event_span_id(rid)
    assert got[("sts.l1.event", other)].parent is None
    (submit,) = [s for s in exporter.get_finished_spans() if s.name == "sts.l1.submit"
                 and s.parent.span_id == event.context.span_id]
    assert submit.attributes["sts.accepted"] is True
    for name in ("sts.l4.fallback", "sts.l4.backfill"):
        span = got[(name, rid)]
        assert span.parent.span_id == event.context.span_id, name
        assert span.context.trace_id == event.context.trace_id, name
    rule = got[("sts.l4.answer", "r" * 32)]
    assert rule.parent is None and format(rule.context.span_id, "016x") == event_span_id("r" * 32)
    (batch,) = [s for s in exporter.get_finished_spans() if s.name == "sts.l1.submit_batch"]
    assert {link.context.span_id for link in batch.links} == {
        got[("sts.l1.event", r)].context.span_id for r in (rid, other, full)}
