"""The late-result policy per pool, in process on the simulated engine: ``abort`` gives one
row at the deadline; ``finish_and_backfill`` gives the ``timeout`` row at the deadline and
one late ``ok`` row when generation finishes, using only spare engine slots."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import generate_latest

from sidecar.config import SchedulerConfig
from sidecar.contract import Priority
from sidecar.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from sidecar.metrics import SidecarMetrics
from sidecar.request_state import ResultRecord
from sidecar.scheduler import Scheduler
from tests.utils import make_sidecar_request, until, with_scheduler

pytestmark = pytest.mark.timeout(60)

LOW, NORMAL = Priority.LOW, Priority.NORMAL
STEP_MS = 5.0  # one decode step: 100 tokens take about 0.5 s


def _engine(max_num_seqs: int = 4) -> SimulatedEngine:
    return SimulatedEngine(SimulatedEngineConfig(step_base_ms=STEP_MS, step_per_seq_ms=0.0,
                                                 max_num_seqs=max_num_seqs))


def _config(engine_slots: int = 4, **low: object) -> SchedulerConfig:
    """``low`` finishes and backfills (``low`` overrides its pool's settings); ``normal``
    and ``high`` abort (the default)."""
    pool = {"on_deadline": "finish_and_backfill", "fallback_text": "low fallback", **low}
    return SchedulerConfig(max_in_flight=engine_slots, deadline_admission=False,
                           pools={"low": pool})


def _rows(results: list[ResultRecord], rid: str) -> list[ResultRecord]:
    return [r for r in results if r.request_id == rid]


async def _idle(s: Scheduler) -> None:
    await until(lambda: not sum(s.stats().in_flight.values()) and not s.stats().late_in_flight)


async def _barrier(s: Scheduler, results: list[ResultRecord], *, max_tokens: int,
                   priority: Priority = NORMAL) -> ResultRecord:
    """Send a request of ``max_tokens`` through the idle scheduler and engine and wait
    for its row: a positive event after which a row that was still to come (generation
    that went on, a timer) would have come, since it started no later. Its row is left
    out of ``results``."""
    rid = f"barrier-{len(results)}"
    [ack] = s.submit_batch([make_sidecar_request(rid, priority=priority,
                                                 max_tokens=max_tokens)])
    assert ack.accepted
    await until(lambda: any(r.request_id == rid for r in results), 20)
    row = next(r for r in results if r.request_id == rid)
    results.remove(row)
    assert (row.status, row.output_tokens) == ("ok", max_tokens), row
    return row


def test_finish_and_backfill_answers_at_the_deadline_then_backfills_once() -> None:
    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        req = make_sidecar_request("late", priority=LOW, max_tokens=100, deadline_in_ms=200)
        req.attributes, req.submit_ts = {"ticket_id": "T-1"}, 1234
        s.submit_batch([req])
        await until(lambda: len(results) == 1, 5)
        assert s.stats().late_in_flight == 1
        await until(lambda: len(results) == 2, 10)
        await _idle(s)
        await _barrier(s, results, max_tokens=5)
        assert len(results) == 2
        stats = s.stats()
        # The one ok is the barrier's (a normal request): a late row is not terminal.
        assert stats.results_by_status["timeout"] == 1 and stats.results_by_status["ok"] == 1
        assert (stats.late_results, stats.late_aborted, stats.late_in_flight) == (1, 0, 0)
        assert stats.pools[LOW].results_by_status == {"timeout": 1}
        metrics = SidecarMetrics(s)
        for r in results:
            metrics.observe(r)
        text = generate_latest(metrics.registry).decode()
        assert 'sts_sidecar_late_results_total{priority="low"} 1.0' in text
        assert 'status="ok"' not in text  # a late row is not a terminal result

    results = asyncio.run(with_scheduler(_engine(), _config(), body))
    on_time, late = results
    assert (on_time.status, on_time.finish_reason, on_time.late) == ("timeout", "timeout", False)
    assert on_time.fallback_text == "low fallback" and on_time.text == ""
    assert 0 <= on_time.finish_ts - on_time.deadline_ts < 100, "timeout row not at the deadline"
    assert "continues" in on_time.error
    assert (late.status, late.finish_reason, late.late) == ("ok", "length", True)
    assert late.output_tokens == 100 and late.text == "[simulated] 100 tokens"
    assert late.finish_ts > late.deadline_ts + 200
    assert late.ttft_ms is not None and late.tpot_ms is not None and late.first_token_ts
    assert (late.fallback_text, late.reason, late.error) == ("", "", None)
    for row in results:
        assert (row.attributes, row.submit_ts) == ({"ticket_id": "T-1"}, 1234)


def test_abort_pool_gives_one_timeout_row() -> None:
    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request("abort", priority=NORMAL, max_tokens=100,
                                             deadline_in_ms=200)])
        await until(lambda: len(results) == 1, 5)
        await _idle(s)
        assert not s.engine.stats().running  # aborted in the engine too
        # 100 tokens started after the request: its own generation, had it gone on,
        # would have ended first.
        await _barrier(s, results, max_tokens=100)
        assert len(results) == 1 and s.stats().late_results == 0

    (row,) = asyncio.run(with_scheduler(_engine(), _config(), body))
    assert (row.status, row.finish_reason, row.late) == ("timeout", "timeout", False)
    assert row.output_tokens < 100 and 0 <= row.finish_ts - row.deadline_ts < 100


def test_request_still_queued_at_its_deadline_just_times_out() -> None:
    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request("blocker", priority=NORMAL, max_tokens=80)])
        s.submit_batch([make_sidecar_request("queued", priority=LOW, deadline_in_ms=100)])
        await until(lambda: {r.request_id for r in results} == {"blocker", "queued"}, 10)
        await _idle(s)
        # Through the same queue and engine slot: a start of "queued" would come first.
        await _barrier(s, results, max_tokens=10, priority=LOW)

    results = asyncio.run(with_scheduler(_engine(1), _config(1), body))
    (row,) = _rows(results, "queued")
    assert (row.status, row.late, row.output_tokens) == ("timeout", False, 0)
    assert "queued" in row.error
    assert _rows(results, "blocker")[0].status == "ok"


def test_late_work_gives_its_slot_to_an_on_time_request() -> None:
    """One engine slot: the late request is aborted for the on-time one, and gets no
    second row."""
    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request("late", priority=LOW, max_tokens=400,
                                             deadline_in_ms=150)])
        await until(lambda: len(results) == 1, 5)
        assert s.stats().late_in_flight == 1
        loop = asyncio.get_running_loop()
        submitted = loop.time()
        s.submit_batch([make_sidecar_request("on-time", priority=NORMAL, max_tokens=10)])
        await until(lambda: len(results) == 2, 5)
        assert loop.time() - submitted < 1.0, "the on-time request waited for late work"
        await _idle(s)
        assert not s.engine.stats().running  # the late request left the engine
        # 400 tokens in the same slot, started after the late request: had it gone on,
        # its late row would have come first.
        await _barrier(s, results, max_tokens=400)
        stats = s.stats()
        assert (stats.late_results, stats.late_aborted, stats.late_in_flight) == (0, 1, 0)

    results = asyncio.run(with_scheduler(_engine(1), _config(1), body))
    assert [(r.request_id, r.status, r.late) for r in results] == [
        ("late", "timeout", False), ("on-time", "ok", False)]


def test_late_work_leaves_its_pool_quota_and_uses_spare_slots() -> None:
    """Free engine slots: an on-time request of the same pool starts at once (the late
    one no longer holds the pool's only slot), and the late one still backfills."""
    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request("late", priority=LOW, max_tokens=150,
                                             deadline_in_ms=150)])
        await until(lambda: len(results) == 1, 5)
        loop = asyncio.get_running_loop()
        submitted = loop.time()
        s.submit_batch([make_sidecar_request("same-pool", priority=LOW, max_tokens=10)])
        await until(lambda: len(_rows(results, "same-pool")) == 1, 5)
        assert loop.time() - submitted < 0.5
        await until(lambda: len(results) == 3, 10)
        await _idle(s)
        assert (s.stats().late_results, s.stats().late_aborted) == (1, 0)

    results = asyncio.run(with_scheduler(_engine(4), _config(4, max_in_flight=1), body))
    assert [(r.request_id, r.status, r.late) for r in results] == [
        ("late", "timeout", False), ("same-pool", "ok", False), ("late", "ok", True)]


def test_drain_aborts_late_work_at_once() -> None:
    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request("late", priority=LOW, max_tokens=400,
                                             deadline_in_ms=150),
                        make_sidecar_request("running", priority=LOW, max_tokens=400,
                                             deadline_in_ms=700)])
        await until(lambda: len(results) == 1, 5)
        assert s.stats().late_in_flight == 1
        loop = asyncio.get_running_loop()
        start = loop.time()
        await s.drain(timeout_s=10)
        # "late" is aborted at once; "running" reaches its deadline while draining and
        # is aborted there (no late work while draining); neither waits for generation.
        assert loop.time() - start < 1.5
        # Both left the engine, and drain() awaited their tasks: no row can follow.
        assert not s.engine.stats().running and not s.engine.stats().waiting
        stats = s.stats()
        assert (stats.late_results, stats.late_aborted, stats.late_in_flight) == (0, 1, 0)

    results = asyncio.run(with_scheduler(_engine(2), _config(2), body))
    assert sorted((r.request_id, r.status, r.late) for r in results) == [
        ("late", "timeout", False), ("running", "timeout", False)]
    assert "draining" in _rows(results, "running")[0].error
