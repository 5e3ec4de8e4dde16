"""Scheduler behaviour in process, on the simulated engine and on engines that misbehave
on purpose (test doubles; the real-vLLM path is in test_sidecar_vllm.py)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from sidecar.config import SchedulerConfig
from sidecar.contract import PRIORITY_NAMES, Priority, RefusalReason
from sidecar.engines import EngineProgress, EngineRequest
from sidecar.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from sidecar.request_state import ResultRecord
from sidecar.scheduler import Scheduler
from tests.utils import fast_engine, make_sidecar_request, until, with_scheduler

pytestmark = pytest.mark.timeout(60)


def test_queue_full_sheds_at_once() -> None:
    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        acks = s.submit_batch([make_sidecar_request(f"q{i}", max_tokens=50) for i in range(6)])
        assert [a.accepted for a in acks] == [True] * 3 + [False] * 3
        assert {a.reason for a in acks[3:]} == {RefusalReason.QUEUE_FULL}
        assert [r.status for r in results] == ["shed"] * 3  # refusals land before any work
        await until(lambda: len(results) == 6)

    results = asyncio.run(with_scheduler(
        fast_engine(max_num_seqs=1), SchedulerConfig(max_in_flight=1, pools={"normal": {"max_queued": 3}}), body))
    assert sorted(r.request_id for r in results) == [f"q{i}" for i in range(6)]


def test_every_request_ends_exactly_once_under_overload() -> None:
    rng = random.Random(7)
    n = 300

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        for start in range(0, n, 30):
            s.submit_batch([make_sidecar_request(f"o{i}", priority=rng.choice(list(Priority)),
                                 max_tokens=rng.choice([5, 20, 80, 400]),
                                 deadline_in_ms=rng.choice([50, 300, 2000]))
                            for i in range(start, start + 30)])
            await asyncio.sleep(0.02)  # the arrival pattern, not a wait for a state
        await until(lambda: len(results) == n, 30)
        stats = s.stats()
        assert sum(stats.queued.values()) == sum(stats.in_flight.values()) == 0

    results = asyncio.run(with_scheduler(
        fast_engine(max_num_seqs=8), SchedulerConfig(max_in_flight=8, pools={p: {"max_queued": 40} for p in PRIORITY_NAMES}), body))
    ids = [r.request_id for r in results]
    assert len(ids) == len(set(ids)) == n
    statuses = {r.status for r in results}
    # a 50 ms deadline can pass before admission on a loaded machine: ``rejected``
    # (deadline_passed) is that request's one terminal status
    assert statuses <= {"ok", "timeout", "shed", "rejected"}
    assert {"ok", "timeout", "shed"} <= statuses


def test_high_runs_before_queued_low_on_simulated_engine() -> None:
    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request(f"low{i}", priority=Priority.LOW, max_tokens=30) for i in range(4)])
        await until(lambda: s.pools[Priority.LOW].in_flight == 1)  # low0 holds the slot
        s.submit_batch([make_sidecar_request("high", priority=Priority.HIGH, max_tokens=30)])
        await until(lambda: len(results) == 5)

    results = asyncio.run(with_scheduler(
        fast_engine(max_num_seqs=1), SchedulerConfig(max_in_flight=1), body))
    order = [r.request_id for r in results]
    assert order.index("high") <= 1, order


def test_drain_timeout_aborts_leftovers_with_one_result_each() -> None:
    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request(f"d{i}", max_tokens=2000) for i in range(3)])
        await until(lambda: s.pools[Priority.NORMAL].in_flight == 1)  # d0 generates
        await s.drain(timeout_s=0.1)
        late = s.submit_batch([make_sidecar_request("after-drain")])[0]
        assert late.reason is RefusalReason.DRAINING

    results = asyncio.run(with_scheduler(
        fast_engine(max_num_seqs=1), SchedulerConfig(max_in_flight=1), body))
    by_id = {r.request_id: r for r in results}
    assert len(by_id) == len(results) == 4
    assert {by_id[f"d{i}"].status for i in range(3)} == {"error"}
    assert {by_id[f"d{i}"].finish_reason for i in range(3)} == {"abort"}
    assert by_id["after-drain"].status == "shed"


class FailingEngine(SimulatedEngine):
    """Test double: every other request raises inside the engine."""

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineProgress]:
        if request.request_id.endswith(("1", "3")):
            raise RuntimeError("CUDA error: device-side assert (simulated)")
        async for progress in super().generate(request):
            yield progress


def test_engine_failure_is_an_error_row_not_a_crash() -> None:
    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request(f"f{i}") for i in range(4)])
        await until(lambda: len(results) == 4)
        s.submit_batch([make_sidecar_request("after")])
        await until(lambda: len(results) == 5)

    results = asyncio.run(with_scheduler(
        FailingEngine(SimulatedEngineConfig(step_base_ms=1.0)), SchedulerConfig(), body))
    by_id = {r.request_id: r for r in results}
    assert by_id["f1"].status == by_id["f3"].status == "error"
    assert "device-side assert" in by_id["f1"].error
    assert by_id["f0"].status == by_id["f2"].status == by_id["after"].status == "ok"


def test_simulated_engine_batches_continuously() -> None:
    """Eight 50-token requests take about 50 steps together, not 400."""
    cfg = SimulatedEngineConfig(max_num_seqs=8, step_base_ms=5.0, step_per_seq_ms=0.0)

    async def run() -> float:
        engine = SimulatedEngine(cfg)
        await engine.start()
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def one(i: int) -> None:
            async for _ in engine.generate(EngineRequest(f"s{i}", [0] * 8, 50, 0.0, None, 2)):
                pass

        await asyncio.gather(*(one(i) for i in range(8)))
        await engine.shutdown()
        return loop.time() - start

    elapsed = asyncio.run(run())
    assert 50 * cfg.step_seconds(8) * 0.9 <= elapsed < 400 * cfg.step_seconds(8) / 2
