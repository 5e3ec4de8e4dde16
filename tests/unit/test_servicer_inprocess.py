"""The servicer and the interceptors in process: a ``grpc.aio`` server on port 0 in the
test's own event loop, a scheduler on a fast simulated engine, a real channel."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import grpc
import pytest

from sidecar.config import SchedulerConfig
from sidecar.contract import RefusalReason, Status, now_ms
from sidecar.interceptors import ExceptionInterceptor
from sidecar.pb.sts.v1 import inference_pb2 as pb
from sidecar.pb.sts.v1 import inference_pb2_grpc as pb_grpc
from sidecar.request_state import ResultRecord
from sidecar.scheduler import Scheduler
from sidecar.servicer import InferenceServicer, result_to_proto
from tests.utils import fast_engine, until

pytestmark = pytest.mark.timeout(60)


def _request(rid: str, **kw) -> pb.InferenceRequest:
    now = now_ms()
    fields = dict(request_id=rid, priority=pb.PRIORITY_NORMAL, enqueue_ts=now,
                  deadline_ts=now + 30_000, prompt="hello", max_tokens=4)
    fields.update(kw)
    return pb.InferenceRequest(**fields)


@contextlib.asynccontextmanager
async def _server() -> AsyncIterator[tuple[str, list[ResultRecord]]]:
    """A served scheduler: its ``host:port`` and the result records it wrote."""
    results: list[ResultRecord] = []
    engine = fast_engine(max_num_seqs=4)
    await engine.start()
    scheduler = Scheduler(engine, results.append, SchedulerConfig(max_in_flight=4), "inproc")
    scheduler.start()
    server = grpc.aio.server(interceptors=[ExceptionInterceptor()])
    pb_grpc.add_InferenceServicer_to_server(
        InferenceServicer(scheduler, engine_kind=engine.kind, started_at=0.0), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", results
    finally:
        await server.stop(None)
        await scheduler.abort_all()
        await engine.shutdown()


async def _serve(body) -> list[ResultRecord]:
    async with _server() as (target, results):
        async with grpc.aio.insecure_channel(target) as channel:
            await body(channel, results)
    return results


def test_submit_batch_acks_in_order_and_every_request_gets_one_result() -> None:
    async def body(channel: grpc.aio.Channel, results: list[ResultRecord]) -> None:
        stub = pb_grpc.InferenceStub(channel)
        reply = await stub.SubmitBatch(pb.SubmitBatchRequest(requests=[
            _request("a"), _request("b", prompt=""), _request("a"),
            _request("c", priority=99)]))
        assert [(a.request_id, a.accepted, a.duplicate) for a in reply.acks] == [
            ("a", True, False), ("b", False, False), ("a", True, True), ("c", False, False)]
        assert reply.acks[1].reason == RefusalReason.EMPTY_PROMPT
        assert reply.acks[3].reason == RefusalReason.UNKNOWN_PRIORITY
        assert reply.sidecar_id == "inproc"
        await until(lambda: len(results) == 3)
        stats = await stub.GetStats(pb.GetStatsRequest())
        assert (stats.submitted, stats.accepted, stats.duplicates) == (4, 1, 1)
        assert stats.engine == "simulated"

    results = asyncio.run(_serve(body))
    assert sorted((r.request_id, r.status) for r in results) == [
        ("a", Status.OK), ("b", Status.REJECTED), ("c", Status.REJECTED)]


def test_generate_returns_the_terminal_result() -> None:
    async def body(channel: grpc.aio.Channel, results: list[ResultRecord]) -> None:
        stub = pb_grpc.InferenceStub(channel)
        result = await stub.Generate(_request("g", max_tokens=3))
        assert (result.status, result.output_tokens, result.finish_reason) == (
            pb.STATUS_OK, 3, "length")

    asyncio.run(_serve(body))


def test_interceptor_answers_garbage_with_invalid_argument() -> None:
    async def body(channel: grpc.aio.Channel, results: list[ResultRecord]) -> None:
        call = channel.unary_unary("/sts.v1.Inference/SubmitBatch")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(b"\xff\xff\xff not a protobuf")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        stub = pb_grpc.InferenceStub(channel)  # and the server still serves
        assert (await stub.GetStats(pb.GetStatsRequest())).submitted == 0

    asyncio.run(_serve(body))


def test_attributes_and_submit_ts_travel_both_ways() -> None:
    from sidecar.client import request_to_proto

    attributes = {"ticket_id": "T-42", "customer": "c-7"}

    async def body(channel: grpc.aio.Channel, results: list[ResultRecord]) -> None:
        stub = pb_grpc.InferenceStub(channel)
        result = await stub.Generate(_request("attr", attributes=attributes, submit_ts=111))
        assert (dict(result.attributes), result.submit_ts, result.late) == (attributes, 111,
                                                                            False)
        too_many = {f"k{i}": "v" for i in range(33)}
        too_big = {"note": "x" * 1020, "more": "y"}
        mapped = request_to_proto({**_fields("via-client"), "attributes": None})
        reply = await stub.SubmitBatch(pb.SubmitBatchRequest(requests=[
            _request("many", attributes=too_many), _request("big", attributes=too_big),
            _request("max", attributes={f"k{i:02d}": "v" * 29 for i in range(32)}), mapped]))
        assert [(a.accepted, a.reason) for a in reply.acks] == [
            (False, RefusalReason.ATTRIBUTES_TOO_LARGE),
            (False, RefusalReason.ATTRIBUTES_TOO_LARGE), (True, 0), (True, 0)]
        assert "33 keys" in reply.acks[0].detail and "bytes" in reply.acks[1].detail
        await until(lambda: len(results) == 5)

    results = asyncio.run(_serve(body))
    by_id = {r.request_id: r for r in results}
    assert (by_id["attr"].attributes, by_id["attr"].submit_ts) == (attributes, 111)
    assert (by_id["many"].status, by_id["many"].reason) == (Status.REJECTED,
                                                            "attributes_too_large")
    assert by_id["many"].attributes == {}  # oversized attributes are not echoed
    assert len(by_id["max"].attributes) == 32 and by_id["via-client"].attributes == {}
    wire = result_to_proto(dataclasses.replace(by_id["attr"], late=True))
    assert (wire.late, dict(wire.attributes), wire.submit_ts) == (True, attributes, 111)


def _fields(rid: str) -> dict:
    now = now_ms()
    return dict(request_id=rid, priority="normal", enqueue_ts=now, deadline_ts=now + 30_000,
                prompt="hello", max_tokens=4)


def test_spark_submit_sends_only_the_chosen_rows_and_passes_the_others_through() -> None:
    """The routed submit query's ``mapInArrow`` body: rows whose ``submit_when`` column
    is not true are returned with null ack columns and never reach the sidecar."""
    import pyarrow as pa

    from spark_ext.config import SidecarEndpointConfig
    from spark_ext.submit.submission import ACK_SCHEMA, submit_batches
    from tests.utils import make_request

    rows = [dict(make_request(f"r{i}"), go=go) for i, go in enumerate([True, False, None, True])]
    batch = pa.RecordBatch.from_pylist(rows)

    async def main() -> tuple[pa.Table, list[ResultRecord]]:
        async with _server() as (target, results):
            out = await asyncio.to_thread(lambda: pa.Table.from_batches(list(submit_batches(
                iter([batch]), SidecarEndpointConfig(endpoint=target), submit_when="go"))))
            async with grpc.aio.insecure_channel(target) as channel:
                stub = pb_grpc.InferenceStub(channel)
                # submit_batches returned after its acks: all it sent is admitted by now.
                assert (await stub.GetStats(pb.GetStatsRequest())).submitted == 2
                # Sent after them, through the same pool and twice as long: a request
                # sent by mistake (16 tokens) would have its row before this one's.
                await stub.SubmitBatch(pb.SubmitBatchRequest(requests=[
                    _request("barrier", max_tokens=32)]))
                await until(lambda: any(r.request_id == "barrier" for r in results))
            return out, [r for r in results if r.request_id != "barrier"]

    out, results = asyncio.run(main())
    assert "prompt" not in out.column_names
    by_id = {r["request_id"]: r for r in out.to_pylist()}
    assert sorted(by_id) == ["r0", "r1", "r2", "r3"], "every row comes back once"
    assert [by_id[r]["accepted"] for r in ("r0", "r3")] == [True, True]
    for rid in ("r1", "r2"):
        assert all(by_id[rid][f.name] is None for f in ACK_SCHEMA), by_id[rid]
    assert sorted(r.request_id for r in results) == ["r0", "r3"]


def test_a_task_whose_sidecar_is_still_starting_refuses_at_once(monkeypatch) -> None:
    """A GPU executor that joined the stream while its sidecar warms up: every request
    of the task is refused ``unavailable`` (the pipeline answers it with the fallback at
    once), no RPC is tried, and the task does not wait for the warm-up."""
    import pyarrow as pa

    from spark_ext.config import SidecarEndpointConfig
    from spark_ext.submit import submission
    from tests.utils import make_request

    waits: list[float | None] = []

    def starting(config, *, wait_s=None):
        waits.append(wait_s)
        return "unix:///nonexistent/sts-gpu3.sock", False

    monkeypatch.setattr(submission, "task_sidecar", starting)
    batch = pa.RecordBatch.from_pylist([make_request(f"r{i}") for i in range(3)])
    config = SidecarEndpointConfig(launch="lazy")
    out = pa.Table.from_batches(list(submission.submit_batches(iter([batch]), config,
                                                               start_wait_s=0.5)))
    assert waits == [0.5]
    assert out.column("accepted").to_pylist() == [False] * 3
    assert set(out.column("reason").to_pylist()) == {"unavailable"}
    assert set(out.column("detail").to_pylist()) == {"sidecar starting: not serving yet"}


def test_the_submit_step_sends_the_pipelines_answer_path_with_every_request(
        monkeypatch) -> None:
    """``answers.delivery_ms`` reaches the sidecar's scheduler on each request over the
    wire (what the scheduler plans early with), from the submit step's ``mapInArrow``
    body; none without it."""
    import pyarrow as pa

    from spark_ext.config import SidecarEndpointConfig
    from spark_ext.submit.submission import submit_batches
    from tests.utils import make_request

    seen: dict[str, int] = {}
    original = Scheduler.submit_batch

    def recording(self, requests, *args, **kwargs):
        seen.update({r.request_id: r.delivery_ms for r in requests})
        return original(self, requests, *args, **kwargs)

    monkeypatch.setattr(Scheduler, "submit_batch", recording)

    async def main() -> None:
        async with _server() as (target, _):
            config = SidecarEndpointConfig(endpoint=target)
            for prefix, delivery in (("d", 1500), ("z", 0)):
                batch = pa.RecordBatch.from_pylist([make_request(f"{prefix}{i}")
                                                    for i in range(2)])
                await asyncio.to_thread(lambda b=batch, d=delivery: list(submit_batches(
                    iter([b]), config, delivery_ms=d)))

    asyncio.run(main())
    assert seen == {"d0": 1500, "d1": 1500, "z0": 0, "z1": 0}
