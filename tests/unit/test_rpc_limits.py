"""Bounded request bytes: calls that would push the bytes being processed past
``server.max_inflight_rpc_mb`` are refused at once with ``RESOURCE_EXHAUSTED``; a lone
call always goes through (``serve`` in process, real sockets)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from sidecar.client import request_to_proto
from sidecar.config import SidecarConfig
from sidecar.pb.sts.v1 import inference_pb2 as pb
from sidecar.pb.sts.v1 import inference_pb2_grpc as pb_grpc
from sidecar.server import serve
from tests.utils import free_port, make_request

pytestmark = pytest.mark.timeout(60)


def test_inflight_request_bytes_are_capped(tmp_path: Path) -> None:
    port = free_port()
    config = SidecarConfig.from_dict({
        "server": {"listen": f"127.0.0.1:{port}", "max_inflight_rpc_mb": 1},
        "engine": {"kind": "simulated", "simulated": {"step_base_ms": 5.0}},
        "scheduler": {"deadline_admission": False},
        "results": {"results_dir": str(tmp_path / "results")},
    })
    # ~1.2 MiB: 300 requests with 4 KiB prompts.
    big = pb.SubmitBatchRequest(requests=[
        request_to_proto(make_request(f"big-{i}", prompt="x" * 4096, max_tokens=1))
        for i in range(300)])
    assert big.ByteSize() > 1 << 20
    seen: dict[str, object] = {}

    async def body() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await channel.channel_ready()
            stub = pb_grpc.InferenceStub(channel)
            # A blocking Generate holds its (small) bytes until its result: ~200 steps.
            slow = asyncio.ensure_future(stub.Generate(request_to_proto(
                make_request("slow", max_tokens=200))))
            async with asyncio.timeout(20):  # until it is admitted: its bytes are held
                while not (await stub.GetStats(pb.GetStatsRequest())).accepted:
                    await asyncio.sleep(0.01)
            assert not slow.done()
            try:
                await stub.SubmitBatch(big)
            except grpc.aio.AioRpcError as e:
                seen["while busy"] = e.code()
            seen["slow"] = (await slow).status
            seen["alone"] = len((await stub.SubmitBatch(big)).acks)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(serve(config, stop=stop))
        try:
            await body()
        finally:
            stop.set()
            await task

    asyncio.run(main())
    assert seen == {"while busy": grpc.StatusCode.RESOURCE_EXHAUSTED, "slow": pb.STATUS_OK,
                    "alone": 300}
