"""A dead engine is a state: the whole sidecar (``serve``) in process, on real sockets,
with a simulated engine that dies on purpose (``fail_after_s``), and a start that fails
half-way undoes itself."""

from __future__ import annotations

import asyncio
import collections
import socket
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.client import request_to_proto
from sidecar.config import SidecarConfig
from sidecar.contract import RefusalReason
from sidecar.exceptions import ConfigError, EngineDeadError
from sidecar.pb.sts.v1 import inference_pb2 as pb
from sidecar.pb.sts.v1 import inference_pb2_grpc as pb_grpc
from sidecar.server import serve
from tests.utils import free_port, make_request, read_results

pytestmark = pytest.mark.timeout(60)


def _config(tmp_path: Path, port: int, **simulated: object) -> SidecarConfig:
    return SidecarConfig.from_dict({
        "server": {"listen": f"127.0.0.1:{port}", "sidecar_id": "death",
                   "engine_death_grace_s": 1.5},
        "engine": {"kind": "simulated", "simulated": {"max_num_seqs": 8, **simulated}},
        "scheduler": {"max_in_flight": 8, "engine_check_interval_s": 0.05,
                      "deadline_admission": False},
        "results": {"results_dir": str(tmp_path / "results")},
        "warmup": {"enabled": False},  # the engine's clock (fail_after_s) starts at its start
    })


async def _health(channel: grpc.aio.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return (await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)).status


async def _wait_health(channel: grpc.aio.Channel, status: int, timeout_s: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            if await _health(channel) == status:
                return
        except grpc.aio.AioRpcError:
            pass
        assert asyncio.get_running_loop().time() < deadline, f"health never {status}"
        await asyncio.sleep(0.02)


def test_engine_death_turns_not_serving_refuses_with_rows_and_fails_in_flight_once(
        tmp_path: Path) -> None:
    port = free_port()
    config = _config(tmp_path, port, fail_after_s=2.0)
    outcome: dict[str, object] = {}

    async def main() -> None:
        task = asyncio.create_task(serve(config))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await _wait_health(channel, health_pb2.HealthCheckResponse.SERVING)
            stub = pb_grpc.InferenceStub(channel)
            # 8 running and 12 queued (each needs ~24 s) when the engine dies.
            before = [request_to_proto(make_request(f"b{i}", max_tokens=2000))
                      for i in range(20)]
            reply = await stub.SubmitBatch(pb.SubmitBatchRequest(requests=before))
            assert all(a.accepted for a in reply.acks)
            await _wait_health(channel, health_pb2.HealthCheckResponse.NOT_SERVING)
            after = [request_to_proto(make_request(f"a{i}")) for i in range(3)]
            reply = await stub.SubmitBatch(pb.SubmitBatchRequest(requests=after))
            outcome["acks"] = [(a.accepted, a.reason, a.fallback_text != "")
                               for a in reply.acks]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Generate(request_to_proto(make_request("g")))
            outcome["generate"] = err.value.code()
        with pytest.raises(EngineDeadError):
            await task
        outcome["leftover"] = [t for t in asyncio.all_tasks()
                               if t is not asyncio.current_task()]

    asyncio.run(main())
    assert outcome["acks"] == [(False, RefusalReason.ENGINE_UNAVAILABLE, True)] * 3
    assert outcome["generate"] == grpc.StatusCode.UNAVAILABLE
    assert outcome["leftover"] == []
    rows = read_results(tmp_path / "results")
    per_id = collections.Counter(r["request_id"] for r in rows)
    assert set(per_id.values()) == {1}, "exactly one row per request"
    by_id = {r["request_id"]: r for r in rows}
    assert {by_id[f"b{i}"]["status"] for i in range(20)} == {"error"}
    assert all("engine died" in by_id[f"b{i}"]["error"] for i in range(20))
    for rid in ("a0", "a1", "a2", "g"):
        assert (by_id[rid]["status"], by_id[rid]["reason"]) == ("shed", "engine_unavailable")


def test_a_failed_bind_undoes_the_start(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        config = _config(tmp_path, busy.getsockname()[1])

        async def main() -> list[asyncio.Task]:
            with pytest.raises(ConfigError, match="cannot listen"):
                await serve(config)
            return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

        leftover = asyncio.run(main())
    assert leftover == [], "engine, scheduler and result writer were all stopped"
    assert read_results(tmp_path / "results") == []


def test_a_stop_drains_and_exits_cleanly(tmp_path: Path) -> None:
    port = free_port()
    config = _config(tmp_path, port)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(serve(config, stop=stop))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await _wait_health(channel, health_pb2.HealthCheckResponse.SERVING)
            stub = pb_grpc.InferenceStub(channel)
            await stub.SubmitBatch(pb.SubmitBatchRequest(
                requests=[request_to_proto(make_request("s", max_tokens=3))]))
        stop.set()
        await task  # returns normally: exit code 0

    asyncio.run(main())
    assert [r["status"] for r in read_results(tmp_path / "results")] == ["ok"]


def test_the_address_is_held_before_the_engine_loads(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The sidecar binds its address before the engine starts: vLLM's own sockets come
    from the ephemeral range, so an engine loading for a minute could otherwise take the
    port the sidecar was given (seen: ``Address already in use`` after the warm-up)."""
    import sidecar.server as server

    port = free_port()
    config = _config(tmp_path, port)
    held: list[bool] = []
    start_engine = server._start_engine

    async def engine_after_a_probe(stack, cfg):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                held.append(False)
            except OSError:
                held.append(True)
        return await start_engine(stack, cfg)

    monkeypatch.setattr(server, "_start_engine", engine_after_a_probe)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(serve(config, stop=stop))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await _wait_health(channel, health_pb2.HealthCheckResponse.SERVING)
        stop.set()
        await task

    asyncio.run(main())
    assert held == [True]


def test_an_engine_that_does_not_load_frees_the_address(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The address bound before the engine is given back when the engine fails to load
    (an embedding process may start the sidecar again on it)."""
    import sidecar.server as server

    async def engine_fails(stack, cfg):
        raise RuntimeError("the engine did not load")

    monkeypatch.setattr(server, "_start_engine", engine_fails)
    port = free_port()

    async def main() -> None:
        with pytest.raises(RuntimeError, match="did not load"):
            await serve(_config(tmp_path, port))

    asyncio.run(main())
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # free
