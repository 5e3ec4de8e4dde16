"""Priority pools, load shedding, deadline-aware admission and metrics, in process on the
simulated engine (the over-gRPC overload scenario is in test_overload.py)."""

from __future__ import annotations

import asyncio
import collections

import pytest
from prometheus_client import generate_latest

from sidecar.config import LoadSheddingConfig, PoolConfig, SchedulerConfig
from sidecar.contract import Priority, RefusalReason
from sidecar.estimator import ServiceRateEstimator
from sidecar.metrics import SidecarMetrics
from sidecar.pools import WeightedPicker
from sidecar.request_state import ResultRecord
from sidecar.scheduler import Scheduler
from tests.utils import fast_engine, make_sidecar_request, until, with_scheduler

pytestmark = pytest.mark.timeout(60)

HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW


def _config(**kw) -> SchedulerConfig:
    kw.setdefault("deadline_admission", False)
    return SchedulerConfig(**kw)


def test_weighted_picker_shares_by_weight_and_never_starves() -> None:
    picker = WeightedPicker({HIGH: 8, NORMAL: 3, LOW: 1})
    picks = collections.Counter(picker.pick([HIGH, NORMAL, LOW]) for _ in range(1200))
    assert picks == {HIGH: 800, NORMAL: 300, LOW: 100}
    # Smoothness: low gets a turn within every 12 picks, not 100 in a burst at the end.
    window = [picker.pick([HIGH, NORMAL, LOW]) for _ in range(12)]
    assert window.count(LOW) == 1
    # Only the pools offered take turns.
    assert {picker.pick([LOW]) for _ in range(5)} == {LOW}


def test_estimator_learns_service_time_and_queue_wait() -> None:
    now = [0.0]
    est = ServiceRateEstimator(alpha=0.5, clock=lambda: now[0])
    assert not est.warm
    assert est.queue_wait_s(LOW, ahead=50, slot_free=False, share=1.0, slots=4,
                            service_s=1.0) == 0.0
    for i in range(20):
        now[0] = i * 0.1
        est.observe_dispatch(NORMAL)
        est.observe_finish(NORMAL, ttft_s=0.2, tpot_s=0.01, output_tokens=50, max_tokens=100)
    assert est.warm
    assert est.service_s(NORMAL, max_tokens=100) == pytest.approx(0.2 + 49 * 0.01)
    # 20 completions in 1.9 s (span floored at the elapsed time) -> ~10.5/s
    wait = est.queue_wait_s(NORMAL, ahead=20, slot_free=False, share=1.0, slots=4,
                            service_s=0.7)
    assert 1.5 < wait < 2.5
    assert est.queue_wait_s(NORMAL, ahead=0, slot_free=True, share=1.0, slots=4,
                            service_s=0.7) == 0.0
    # After 30 s of silence the rate falls back to slots / service time.
    now[0] = 40.0
    assert est.queue_wait_s(LOW, ahead=3, slot_free=False, share=0.5, slots=4,
                            service_s=1.0) == pytest.approx(4 / (4 * 0.5 / 1.0))


def test_pool_queue_full_is_per_pool_and_carries_fallback() -> None:
    pools = {"low": {"max_queued": 2, "fallback_text": "low fallback"},
             "high": {"max_queued": 5}}

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        lows = s.submit_batch([make_sidecar_request(f"l{i}", priority=LOW, max_tokens=200) for i in range(4)])
        highs = s.submit_batch([make_sidecar_request(f"h{i}", priority=HIGH) for i in range(3)])
        assert [a.accepted for a in lows] == [True, True, False, False]
        assert {a.reason for a in lows[2:]} == {RefusalReason.QUEUE_FULL}
        assert {a.fallback_text for a in lows[2:]} == {"low fallback"}
        assert all(a.accepted for a in highs)  # another pool's full queue does not matter
        refused = {r.request_id: r for r in results}
        assert refused["l2"].status == "shed" and refused["l2"].reason == "queue_full"
        assert refused["l2"].fallback_text == "low fallback"
        await until(lambda: len(results) == 7)

    results = asyncio.run(with_scheduler(
        fast_engine(max_num_seqs=1), _config(max_in_flight=1, pools=pools), body))
    ok = [r for r in results if r.status == "ok"]
    assert ok and all(r.fallback_text == "" for r in ok)


def test_watermarks_shed_low_first_then_normal_never_high() -> None:
    marks = LoadSheddingConfig(queue_depth={"low": 4, "normal": 6})

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        # Keep the single engine slot busy so everything else queues.
        s.submit_batch([make_sidecar_request("busy", priority=HIGH, max_tokens=2000)])
        await until(lambda: s.stats().in_flight[HIGH] == 1)
        acks = s.submit_batch([make_sidecar_request(f"l{i}", priority=LOW) for i in range(6)])
        assert [a.accepted for a in acks] == [True] * 4 + [False] * 2
        assert {a.reason for a in acks[4:]} == {RefusalReason.OVERLOADED}
        # Normal arrivals push the depth over the low watermark: queued lows go, newest first.
        acks = s.submit_batch([make_sidecar_request(f"n{i}", priority=NORMAL) for i in range(4)])
        assert all(a.accepted for a in acks)
        evicted = [r.request_id for r in results if r.request_id.startswith("l")
                   and r.reason == "overloaded"]
        assert evicted == ["l4", "l5", "l3", "l2", "l1", "l0"], evicted
        # Past the normal watermark, normal is refused too; high is never shed by a watermark.
        acks = s.submit_batch([make_sidecar_request(f"n{i}", priority=NORMAL) for i in range(4, 8)])
        assert [a.accepted for a in acks] == [True, True, False, False]
        acks = s.submit_batch([make_sidecar_request(f"h{i}", priority=HIGH) for i in range(5)])
        assert all(a.accepted for a in acks)
        stats = s.stats()
        assert stats.queued == {HIGH: 5, NORMAL: 1, LOW: 0}
        assert stats.pools[NORMAL].shed_by_reason == {"overloaded": 7}

    asyncio.run(with_scheduler(fast_engine(max_num_seqs=1),
                                _config(max_in_flight=1, load_shedding=marks), body))


def test_queued_request_is_shed_after_max_queue_delay() -> None:
    pools = {"low": {"max_queue_delay_ms": 150}}

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request("busy", priority=HIGH, max_tokens=2000)])
        s.submit_batch([make_sidecar_request("waits", priority=LOW)])
        await until(lambda: any(r.request_id == "waits" for r in results))
        row = next(r for r in results if r.request_id == "waits")
        assert (row.status, row.reason) == ("shed", "queue_delay_exceeded")
        assert row.finish_ts - row.received_ts >= 140

    asyncio.run(with_scheduler(fast_engine(max_num_seqs=1),
                                _config(max_in_flight=1, pools=pools), body))


def test_deadline_infeasible_refused_at_once_after_warm_up() -> None:
    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        # Warm up: the estimator learns ~5 ms per token.
        s.submit_batch([make_sidecar_request(f"w{i}", max_tokens=20) for i in range(4)])
        await until(lambda: len(results) == 4)
        assert s.estimator.warm
        acks = s.submit_batch([make_sidecar_request("hopeless", max_tokens=1000, deadline_in_ms=300),
                               make_sidecar_request("fine", max_tokens=10, deadline_in_ms=5000)])
        assert acks[0].reason is RefusalReason.DEADLINE_INFEASIBLE and not acks[0].accepted
        assert "after the deadline" in acks[0].detail and acks[0].fallback_text
        assert acks[1].accepted
        await until(lambda: len(results) == 6)

    engine = fast_engine(max_num_seqs=2)
    engine.config.step_base_ms = 5.0
    results = asyncio.run(with_scheduler(engine, SchedulerConfig(max_in_flight=2), body))
    by_id = {r.request_id: r for r in results}
    assert by_id["hopeless"].status == "shed" and by_id["fine"].status == "ok"


def test_pool_in_flight_and_token_limits_hold() -> None:
    pools = {"low": PoolConfig(max_in_flight=1, weight=1),
             "normal": PoolConfig(max_in_flight=4, max_tokens_in_flight=120, weight=3)}
    seen: dict[Priority, int] = collections.defaultdict(int)
    seen_tokens = [0]

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request(f"l{i}", priority=LOW, max_tokens=30) for i in range(5)]
                       + [make_sidecar_request(f"n{i}", priority=NORMAL, max_tokens=50) for i in range(5)])
        while len(results) < 10:
            st = s.stats()
            for p, n in st.in_flight.items():
                seen[p] = max(seen[p], n)
            seen_tokens[0] = max(seen_tokens[0], st.pools[NORMAL].tokens_in_flight)
            await asyncio.sleep(0.002)

    asyncio.run(with_scheduler(fast_engine(max_num_seqs=8),
                                _config(max_in_flight=8, pools=pools), body))
    assert seen[LOW] == 1
    assert 1 <= seen[NORMAL] <= 2 and seen_tokens[0] <= 120  # 2 x (3 prompt + 50) fits, 3 not


def test_metrics_count_every_result_with_priority_status_and_reason() -> None:
    pools = {"low": {"max_queued": 1}}

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request(f"m{i}", priority=LOW, max_tokens=5) for i in range(3)])
        await until(lambda: len(results) == 3)

    metrics: list[SidecarMetrics] = []

    async def run() -> None:
        engine = fast_engine(max_num_seqs=1)
        await engine.start()
        scheduler = Scheduler(engine, lambda r: metrics[0].observe(r),
                              _config(max_in_flight=1, pools=pools), "metrics-test")
        metrics.append(SidecarMetrics(scheduler))
        scheduler.start()
        results: list[ResultRecord] = []
        scheduler._emit = lambda r: (results.append(r), metrics[0].observe(r))
        try:
            await body(scheduler, results)
        finally:
            await scheduler.abort_all()
            await engine.shutdown()

    asyncio.run(run())
    text = generate_latest(metrics[0].registry).decode()
    assert 'sts_sidecar_results_total{priority="low",reason="queue_full",status="shed"} 2.0' \
        in text
    assert 'sts_sidecar_results_total{priority="low",reason="none",status="ok"} 1.0' in text
    assert 'sts_sidecar_request_latency_seconds_count{priority="low",status="ok"} 1.0' in text
    assert 'sts_sidecar_queue_depth{priority="low"} 0.0' in text


async def _dispatch_pass(s: Scheduler) -> None:
    """Wake the dispatcher and return once it has run one more pass (it clears its wake
    event, then starts whatever can start without awaiting): what did not start by then
    was held back by a limit, not by the test being early."""
    s._wake.set()
    await until(lambda: not s._wake.is_set())


def test_a_burst_into_one_pool_starts_in_order_within_the_pool_and_engine_limits() -> None:
    """Dispatch starts a run of heads from the only pool that can start work: FIFO, up to
    the pool's max_in_flight; a second pool then gets the engine's last slot."""
    pools = {"low": {"max_in_flight": 2}}

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request(f"l{i}", priority=LOW, max_tokens=2000)
                        for i in range(6)])
        await until(lambda: s.pools[LOW].in_flight == 2)
        await _dispatch_pass(s)
        assert list(s.pools[LOW].running) == ["l0", "l1"] and s.pools[LOW].queued == 4
        s.submit_batch([make_sidecar_request(f"n{i}", priority=NORMAL, max_tokens=2000)
                        for i in range(2)])
        await until(lambda: s.pools[NORMAL].in_flight == 1)
        await _dispatch_pass(s)
        assert list(s.pools[NORMAL].running) == ["n0"] and s.slots.count == 3
        assert s.pools[LOW].in_flight == 2

    results = asyncio.run(with_scheduler(fast_engine(), _config(max_in_flight=3, pools=pools),
                                         body))
    assert sorted(r.request_id for r in results) == sorted(
        [f"l{i}" for i in range(6)] + ["n0", "n1"])  # one row each, at shutdown


def test_result_histograms_expose_what_prometheus_client_would() -> None:
    """The sidecar's own lock-free histograms print the same buckets, counts and sums as
    ``prometheus_client.Histogram`` would (without its ``_created`` gauge)."""
    from prometheus_client import CollectorRegistry, Histogram

    from sidecar.metrics import _LATENCY_BUCKETS, _Histogram

    values = [0.0, 0.05, 0.07, 1.0, 2.5, 29.9, 30.0, 500.0]
    reference = CollectorRegistry()
    histogram = Histogram("h_seconds", "Doc.", ["priority", "status"],
                          buckets=_LATENCY_BUCKETS, registry=reference)
    ours = _Histogram("h_seconds", "Doc.", ["priority", "status"], _LATENCY_BUCKETS)
    registry = CollectorRegistry()
    registry.register(ours)
    for v in values:
        histogram.labels("low", "ok").observe(v)
        ours.observe(ours.series("low", "ok"), v)
    expected = [line for line in generate_latest(reference).decode().splitlines()
                if "_created" not in line]
    assert generate_latest(registry).decode().splitlines() == expected


def test_pool_config_is_validated() -> None:
    with pytest.raises(ValueError, match="unknown pools"):
        SchedulerConfig(pools={"urgent": {}})
    with pytest.raises(ValueError, match="max_in_flight"):
        SchedulerConfig(pools={"low": {"max_in_flight": 0}})
    with pytest.raises(ValueError, match="low .* must not exceed"):
        LoadSheddingConfig(queue_depth={"low": 10, "normal": 5})
    with pytest.raises(ValueError, match="unknown keys"):
        SchedulerConfig(pools={"low": {"max_depth": 3}})
    # A partial pool keeps that pool's defaults, not the generic ones.
    assert SchedulerConfig(pools={"low": {"max_queued": 7}}).pools["low"].weight == 1
    assert SchedulerConfig(pools={"high": {"max_queued": 7}}).pools["high"].weight == 8


def test_estimator_memory_stays_bounded_without_estimates() -> None:
    """Light load never asks for an estimate; the event windows must still be trimmed."""
    now = [0.0]
    est = ServiceRateEstimator(clock=lambda: now[0])
    for i in range(20_000):
        now[0] = i * 0.01  # 100 requests/s for 200 s
        est.observe_dispatch(LOW)
        est.observe_finish(LOW, ttft_s=0.1, tpot_s=0.01, output_tokens=5, max_tokens=10)
    assert len(est._finishes) <= 1001 and len(est._pools[LOW].dispatches) <= 1001
    assert est.completions_per_s() == pytest.approx(100, rel=0.01)


def test_cancelled_blocking_call_aborts_its_request_exactly_once() -> None:
    """Generate() whose caller goes away: running and queued requests are both aborted,
    each with one terminal result, and the engine slot is freed for the next request."""

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        running = asyncio.create_task(s.generate(make_sidecar_request("gen-run", max_tokens=2000)))
        queued = asyncio.create_task(s.generate(make_sidecar_request("gen-queued", max_tokens=2000)))
        await until(lambda: s.stats().in_flight[NORMAL] == 1 and s.stats().queued[NORMAL] == 1)
        running.cancel()
        queued.cancel()
        await asyncio.gather(running, queued, return_exceptions=True)
        await until(lambda: len(results) == 2)
        after = await s.generate(make_sidecar_request("gen-after", max_tokens=3))
        assert after.status == "ok"

    results = asyncio.run(with_scheduler(fast_engine(max_num_seqs=1),
                                          _config(max_in_flight=1), body))
    by_id = collections.Counter(r.request_id for r in results)
    assert by_id == {"gen-run": 1, "gen-queued": 1, "gen-after": 1}
    aborted = [r for r in results if r.request_id != "gen-after"]
    assert {(r.status, r.finish_reason) for r in aborted} == {("error", "abort")}
    assert all(r.error == "caller cancelled the blocking call" for r in aborted)
