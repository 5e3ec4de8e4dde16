"""Preemption, batch size as a scheduling lever and positional wait estimates, in process
on the simulated engine."""

from __future__ import annotations

import asyncio
import collections

import pytest

from sidecar.admission import LoadCheck
from sidecar.config import SchedulerConfig
from sidecar.contract import Priority, RefusalReason
from sidecar.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from sidecar.estimator import BatchSpeedModel, ServiceRateEstimator
from sidecar.load_control import LoadControl
from sidecar.pools import Pool, Running
from sidecar.request_state import ResultRecord
from sidecar.scheduler import Scheduler
from tests.unit.virtual_time import run_in_virtual_time
from tests.utils import make_sidecar_request, until, with_scheduler

pytestmark = pytest.mark.timeout(60)

HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW
STEP_MS = 10.0


def _engine(seqs: int, per_seq_ms: float = 0.0, progress_every: int = 0) -> SimulatedEngine:
    return SimulatedEngine(SimulatedEngineConfig(max_num_seqs=seqs, step_base_ms=STEP_MS,
                                                 step_per_seq_ms=per_seq_ms,
                                                 progress_every=progress_every))


def _config(slots: int, **kw) -> SchedulerConfig:
    pools = {p: {"max_in_flight": slots} for p in ("high", "normal", "low")}
    return SchedulerConfig(max_in_flight=slots, pools=pools, **kw)


def _by_id(results: list[ResultRecord]) -> dict[str, ResultRecord]:
    rows = collections.Counter(r.request_id for r in results)
    assert all(n == 1 for n in rows.values()), rows  # one terminal row per request
    return {r.request_id: r for r in results}


def _decoding(s: Scheduler, rid: str) -> bool:
    """Whether ``rid`` runs in the engine and has produced a token (so it can be
    preempted: its serving task has begun)."""
    running = next((pool.running[rid] for pool in s.pools.values() if rid in pool.running),
                   None)
    return running is not None and running.live and running.req.output_tokens > 0


def test_high_preempts_long_low_work_and_the_low_request_finishes_later() -> None:
    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request(f"low{i}", priority=LOW, max_tokens=60,
                                             deadline_in_ms=60_000) for i in range(2)])
        await until(lambda: s.pools[LOW].in_flight == 2  # both low requests are decoding
                    and all(r.req.output_tokens > 0 for r in s.pools[LOW].running.values()))
        [ack] = s.submit_batch([make_sidecar_request("hi", priority=HIGH, max_tokens=5,
                                                     deadline_in_ms=3000)])
        assert ack.accepted
        await until(lambda: len(results) == 3)
        assert s.stats().preemptions == 1

    results = asyncio.run(with_scheduler(_engine(2), _config(2), body))
    rows = _by_id(results)
    hi = rows["hi"]
    assert hi.status == "ok"
    # It started within one decode step plus dispatch, not after a 60-token low answer.
    assert hi.ttft_ms is not None and hi.ttft_ms <= 4 * STEP_MS + 30, hi
    lows = [rows["low0"], rows["low1"]]
    assert all(r.status == "ok" and r.output_tokens == 60 for r in lows), lows
    # The preempted one ran again from scratch after the high request: its TTFT is that
    # of its final run (long after its first start), and it ended after the high one.
    victim = max(lows, key=lambda r: r.finish_ts)
    assert victim.first_token_ts is not None and victim.first_token_ts >= hi.received_ts
    assert victim.finish_ts > hi.finish_ts


def test_a_request_is_preempted_at_most_max_per_request_times() -> None:
    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request("low", priority=LOW, max_tokens=40,
                                             deadline_in_ms=60_000)])
        await until(lambda: _decoding(s, "low"))
        s.submit_batch([make_sidecar_request("h1", priority=HIGH, max_tokens=3)])
        await until(lambda: len(results) == 1)  # h1 done; low runs again
        await until(lambda: _decoding(s, "low"))
        s.submit_batch([make_sidecar_request("h2", priority=HIGH, max_tokens=3)])
        await until(lambda: len(results) == 3)

    results = asyncio.run(with_scheduler(
        _engine(1), _config(1, preemption={"max_per_request": 1}), body))
    order = [r.request_id for r in results]
    assert order == ["h1", "low", "h2"], order  # low was not preempted a second time
    assert all(r.status == "ok" for r in results)


def test_preemption_off_makes_high_wait_for_a_slot() -> None:
    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request("low", priority=LOW, max_tokens=30)])
        await until(lambda: s.pools[LOW].in_flight == 1)
        s.submit_batch([make_sidecar_request("hi", priority=HIGH, max_tokens=3)])
        await until(lambda: len(results) == 2)
        assert s.stats().preemptions == 0

    results = asyncio.run(with_scheduler(
        _engine(1), _config(1, preemption={"enabled": False}), body))
    assert [r.request_id for r in results] == ["low", "hi"]


def _load_control(slots: int, clock) -> tuple[LoadControl, dict[Priority, Pool]]:
    config = _config(slots)
    pools = {p: Pool(p, config.pools[str(p)]) for p in Priority}
    est = ServiceRateEstimator(clock=clock)
    return LoadControl(config, pools, est,
                       in_flight=lambda: sum(p.in_flight for p in pools.values())), pools


def _run(pools: dict[Priority, Pool], rid: str, priority: Priority, now: float, ends_in: float,
         **kw) -> None:
    req = make_sidecar_request(rid, priority=priority, max_tokens=100)
    pools[priority].started(req, Running(req, now, now + ends_in, live=True, **kw))


def test_lone_high_request_waits_for_one_slot_not_its_pools_history() -> None:
    now = [100.0]
    load, pools = _load_control(4, lambda: now[0])
    load.config.preemption.enabled = False
    est = load.estimator
    # Warm: a slow history of the high pool (a dispatch every few seconds) and fast lows.
    for i in range(5):
        now[0] = 90.0 + 2 * i
        est.observe_dispatch(HIGH)
        est.observe_finish(HIGH, ttft_s=0.05, tpot_s=0.01, output_tokens=50, max_tokens=64)
    now[0] = 100.0
    for rid, ends_in in (("l1", 0.4), ("l2", 3.0), ("l3", 6.0), ("l4", 9.0)):
        _run(pools, rid, LOW, now[0], ends_in)
    pools[LOW].push(make_sidecar_request("lq", priority=LOW))  # low work queued too
    lone = make_sidecar_request("hi", priority=HIGH, max_tokens=64)
    # One slot frees in 0.4 s; high's weight 8 vs low's 1 -> it needs that one slot.
    assert load.estimate_wait_s(lone) == pytest.approx(0.4)
    # Behind two queued high requests it needs the third slot to free.
    pools[HIGH].push(make_sidecar_request("h0", priority=HIGH))
    pools[HIGH].push(make_sidecar_request("h1", priority=HIGH))
    assert load.estimate_wait_s(lone) == pytest.approx(6.0)
    # With preemption on, lower work makes room within one decode step.
    load.config.preemption.enabled = True
    assert load.estimate_wait_s(lone) < 0.1


def test_batch_speed_model_and_shrinking_the_batch_instead_of_refusing() -> None:
    model = BatchSpeedModel()
    model.observe(8, 0.084)
    # One batch size seen: the prior shape (10 % per extra sequence) gives the slope.
    assert model.tpot(1) < model.tpot(8) == pytest.approx(0.084)
    now = [0.0]
    load, pools = _load_control(8, lambda: now[0])
    est = load.estimator
    for _ in range(20):  # 12 tokens/s each at batch 8, 20 tokens/s alone
        est.observe_finish(LOW, ttft_s=0.1, tpot_s=1 / 12, output_tokens=64, max_tokens=64,
                           batch=8)
        est.observe_finish(LOW, ttft_s=0.1, tpot_s=1 / 20, output_tokens=64, max_tokens=64,
                           batch=1)
        est.observe_finish(HIGH, ttft_s=0.1, tpot_s=1 / 12, output_tokens=64, max_tokens=64,
                           batch=8)
    for i in range(7):
        _run(pools, f"l{i}", LOW, now[0], 20.0)
    # 64 tokens at batch 8 take ~5.4 s; alone ~3.3 s. A 4.5 s deadline fits a small batch.
    req = make_sidecar_request("hi", priority=HIGH, max_tokens=64, deadline_in_ms=4500)
    assert LoadCheck(load).check(req) is None  # not refused as infeasible while low work runs
    batch = load.target_batch(req)
    assert batch is not None and batch < 8
    # Without preemption the same request is refused.
    load.config.preemption.enabled = False
    refusal = LoadCheck(load).check(req)
    assert refusal is not None and refusal.reason is RefusalReason.DEADLINE_INFEASIBLE


def test_speed_model_remembers_small_batches_while_the_engine_runs_full() -> None:
    """A pool refused for a while must not be judged by the full batch alone: the cost
    of a small batch seen once (start-up, a preempted run) survives many full-batch
    observations, and a TTFT seen at batch 8 is scaled down for a batch of 1."""
    model = BatchSpeedModel()
    model.observe(1, 0.080)
    for _ in range(500):  # minutes at the full batch, under CPU contention
        model.observe(8, 0.173)
    assert model.tpot(1) == pytest.approx(0.080)
    assert model.tpot(8) == pytest.approx(0.173)
    assert 0.080 < model.tpot(4) < 0.173
    est = ServiceRateEstimator()
    est.speed = model
    for _ in range(20):
        est.observe_finish(LOW, ttft_s=1.0, tpot_s=0.173, output_tokens=48, max_tokens=48,
                           batch=8, ttft_batch=8)
    # The high pool never ran: its service at batch 1 comes from the engine-wide figures.
    at_1 = est.service_s(HIGH, max_tokens=48, batch=1)
    assert at_1 == pytest.approx(1.0 * 0.080 / 0.173 + 47 * 0.080)
    assert at_1 < 0.5 * est.service_s(HIGH, max_tokens=48, batch=8)
    # A cold start's 10 s first token does not make every later estimate slow.
    est.observe_finish(LOW, ttft_s=10.0, tpot_s=0.9, output_tokens=48, max_tokens=48,
                       batch=1, ttft_batch=1)
    assert est.ttft_s(HIGH, batch=8) == pytest.approx(1.0)
    assert model.tpot(1) == pytest.approx(0.080 / 2 + 0.9 / 2)  # two batch-1 figures


def _served_on_time(*, shrink_batch: bool) -> dict[Priority, float]:
    """Per priority, the share of requests answered ``ok`` by their deadline when 60
    requests arrive every 0.1 s on an engine whose per-sequence speed falls steeply with
    the batch (like vLLM on CPU), with SLAs that make ``high`` feasible only in a small
    batch. Run in virtual time: every decode step takes its nominal time whatever the
    machine's load, so the outcome is the same on every run."""
    sla_ms = {HIGH: 1500, NORMAL: 4000, LOW: 12_000}
    sent: dict[Priority, int] = collections.Counter()

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        prios = [LOW, NORMAL, LOW, HIGH, NORMAL, LOW, NORMAL, LOW, HIGH, LOW]
        for i in range(60):
            p = prios[i % len(prios)]
            sent[p] += 1
            s.submit_batch([make_sidecar_request(f"r{i}", priority=p, max_tokens=40,
                                                 deadline_in_ms=sla_ms[p])])
            await asyncio.sleep(0.1)  # arrivals every 0.1 s (virtual)
        await until(lambda: len(results) == 60, 40)

    config = SchedulerConfig(max_in_flight=8, preemption={"shrink_batch": shrink_batch})
    results = run_in_virtual_time(with_scheduler(_engine(8, per_seq_ms=6.0), config, body))
    _by_id(results)
    ok = collections.Counter(Priority.parse(r.priority) for r in results
                             if r.status == "ok" and r.finish_ts <= r.deadline_ts)
    return {p: ok[p] / sent[p] for p in Priority}


def test_served_share_is_ordered_high_normal_low_on_a_cpu_like_engine() -> None:
    """The LLM answers high >= normal >= low on time, and it is the batch lever that
    does it (lower work held back at dispatch while a ``high`` request needs a small
    batch): without it the same load leaves ``high`` behind."""
    share = _served_on_time(shrink_batch=True)
    assert share[HIGH] >= share[NORMAL] >= share[LOW], share
    assert share[HIGH] >= 0.5, share
    without = _served_on_time(shrink_batch=False)
    assert without[HIGH] < without[NORMAL] and without[HIGH] < share[HIGH], without


def test_late_low_work_in_a_full_engine_gives_way_to_a_feasible_high() -> None:
    """Late ``low`` work (past its deadline, generating on for a backfill) fills the
    engine; a ``high`` request that can finish only in a small batch is admitted and
    finishes on time: late work is aborted for it at once, so it is no floor under the
    batch ``high`` can get (issue 31). Before, admission counted late work as slots that
    stay and refused the request as ``deadline_infeasible``."""
    from sidecar.warmup import SpeedSample

    seen: dict[str, object] = {}

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        # admitted before the engine's speed is known (nothing refuses them then)
        s.submit_batch([make_sidecar_request(f"low{i}", priority=LOW, max_tokens=2000,
                                             deadline_in_ms=300) for i in range(8)])
        await until(lambda: len(s.slots.late) == 8, 10)  # all eight generate past their deadline
        # 16 ms per token alone, 58 ms in a batch of 8 (the engine below)
        s.estimator.calibrate([SpeedSample(1, 0.016, 0.016), SpeedSample(8, 0.058, 0.058)])
        # 40 tokens: ~0.65 s alone, ~2.3 s at batch 8; 1.2 s fits a batch of 3 or fewer
        [ack] = s.submit_batch([make_sidecar_request("hi", priority=HIGH, max_tokens=40,
                                                     deadline_in_ms=1200)])
        seen["ack"] = ack
        await until(lambda: any(r.request_id == "hi" for r in results), 10)
        seen["late_left"] = len(s.slots.late)

    config = _config(8)
    config.pools["low"].on_deadline = "finish_and_backfill"
    results = run_in_virtual_time(with_scheduler(_engine(8, per_seq_ms=6.0), config, body))
    ack = seen["ack"]
    assert ack.accepted, ack  # type: ignore[attr-defined]
    hi = _by_id(results)["hi"]
    assert hi.status == "ok" and hi.finish_ts <= hi.deadline_ts, hi
    assert seen["late_left"] <= 2, "late work was aborted down to the batch high needed"


def _high_beside_seven_lows(*, tpot_at_8_s: float, deadline_in_ms: int,
                            delivery_ms: int = 0, request_delivery_ms: int = 0
                            ) -> tuple[ResultRecord, int]:
    """A ``high`` request of 40 tokens started beside seven long ``low`` ones, on an
    engine that decodes a batch of 8 at 58 ms per token (16 alone: 2.3 s for it in the
    full batch), the estimator calibrated at ``tpot_at_8_s`` for the full batch: its
    result and the catch-ups counted."""
    from sidecar.warmup import SpeedSample

    seen: dict[str, int] = {}

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request(f"low{i}", priority=LOW, max_tokens=2000,
                                             deadline_in_ms=60_000) for i in range(7)])
        await until(lambda: all(_decoding(s, f"low{i}") for i in range(7)), 10)
        s.estimator.calibrate([SpeedSample(1, 0.016, 0.016),
                               SpeedSample(8, tpot_at_8_s, tpot_at_8_s)])
        [ack] = s.submit_batch([make_sidecar_request("hi", priority=HIGH, max_tokens=40,
                                                     deadline_in_ms=deadline_in_ms,
                                                     delivery_ms=request_delivery_ms)])
        assert ack.accepted, ack
        await until(lambda: any(r.request_id == "hi" for r in results), 10)
        seen["catch_ups"] = s.stats().batch_catch_ups

    # progress every token, as vLLM reports it
    results = run_in_virtual_time(with_scheduler(
        _engine(8, per_seq_ms=6.0, progress_every=1), _config(8, delivery_ms=delivery_ms),
        body))
    return _by_id(results)["hi"], seen["catch_ups"]


def _behind_schedule() -> tuple[ResultRecord, int]:
    """The estimator calibrated on a faster engine (30 ms per token at batch 8) says the
    ``high`` request finishes in ~1.2 s of its 1.6 s deadline; it takes 2.3 s."""
    return _high_beside_seven_lows(tpot_at_8_s=0.030, deadline_in_ms=1600)


def test_a_running_high_that_falls_behind_its_deadline_gets_a_smaller_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The start's plan rests on other requests' speeds; a ``high`` request whose own
    decode speed says it will miss its deadline in the full batch gets a smaller one
    while it runs (lower work preempted and held back) and finishes on time; without
    the check the same request runs on in the full batch and times out (issue 31: the
    real engine on a slow CPU, `high` 51-77 % of what it gets alone)."""
    hi, catch_ups = _behind_schedule()
    assert hi.status == "ok" and hi.finish_ts <= hi.deadline_ts, hi
    assert catch_ups >= 1
    monkeypatch.setattr(Scheduler, "_keep_on_schedule", lambda self, req, run: None)
    hi, catch_ups = _behind_schedule()
    assert hi.status == "timeout" and catch_ups == 0, hi


def _high_in_a_full_engine(delivery_ms: int, request_delivery_ms: int = 0) -> ResultRecord:
    """The estimator knows the engine: 2.3 s in the full batch, the deadline 3 s away,
    ``delivery_ms`` (the sidecar's) or ``request_delivery_ms`` (the request's own) for
    the result's trip to the answer."""
    return _high_beside_seven_lows(tpot_at_8_s=0.058, deadline_in_ms=3000,
                                   delivery_ms=delivery_ms,
                                   request_delivery_ms=request_delivery_ms)[0]


def test_delivery_ms_plans_a_result_to_leave_that_long_before_its_deadline() -> None:
    """``scheduler.delivery_ms``: the pipeline needs ~1 s to turn a result into an
    answer, so the sidecar plans ``high`` to finish 1 s before its deadline (a smaller
    batch, lower work held back) where planning to the deadline itself runs it in the
    full batch and finishes too late for its answer to land in time (issue 31: on a
    slow CPU most `high` misses of the demo finished 0.1-0.5 s before their deadline
    and landed after it)."""
    planned = _high_in_a_full_engine(1000)
    assert planned.status == "ok" and planned.finish_ts <= planned.deadline_ts - 1000, planned
    to_deadline = _high_in_a_full_engine(0)
    assert to_deadline.status == "ok", to_deadline
    assert to_deadline.deadline_ts - 1000 < to_deadline.finish_ts <= to_deadline.deadline_ts


def test_a_requests_own_delivery_ms_plans_it_early_on_a_sidecar_without_one() -> None:
    """The pipeline sends its answer path with every request (``sidecar.delivery_ms``,
    issue 61: on two cores 17 of 41 ``high`` answers whose results finished in time were
    readable only after their deadline): the sidecar plans that request as
    ``scheduler.delivery_ms`` would, with nothing set on the sidecar."""
    planned = _high_in_a_full_engine(0, request_delivery_ms=1000)
    assert planned.status == "ok" and planned.finish_ts <= planned.deadline_ts - 1000, planned


def test_delivery_ms_picks_a_smaller_batch_and_refuses_nothing() -> None:
    """A ``high`` request that fits its deadline in the full batch but not its deadline
    less ``delivery_ms`` is admitted either way (a refusal tests the deadline itself) and
    starts in a smaller batch with it; when no reachable batch gets it there early, it
    runs as planned for its deadline."""
    now = [0.0]
    load, pools = _load_control(8, lambda: now[0])
    est = load.estimator
    for _ in range(20):  # 12 tokens/s each at batch 8, 20 tokens/s alone
        for priority, tpot_s, batch in ((LOW, 1 / 12, 8), (LOW, 1 / 20, 1), (HIGH, 1 / 12, 8)):
            est.observe_finish(priority, ttft_s=0.1, tpot_s=tpot_s, output_tokens=64,
                               max_tokens=64, batch=batch)
    for i in range(7):
        _run(pools, f"l{i}", LOW, now[0], 20.0)
    # 64 tokens take ~5.4 s at batch 8, ~3.3 s alone; the deadline is 6 s away.
    req = make_sidecar_request("hi", priority=HIGH, max_tokens=64, deadline_in_ms=6000)
    assert LoadCheck(load).check(req) is None and load.target_batch(req) is None
    load.config.delivery_ms = 1500
    assert LoadCheck(load).check(req) is None
    batch = load.target_batch(req)
    assert batch is not None and batch < 8
    load.config.delivery_ms = 4000  # 2 s: not even alone; planned for the deadline
    assert LoadCheck(load).check(req) is None and load.target_batch(req) is None
    load.config.delivery_ms = 0  # the request's own, the larger of the two counts
    req.delivery_ms = 1500
    assert LoadCheck(load).check(req) is None and load.target_batch(req) == batch
    load.config.delivery_ms = 4000
    assert load.target_batch(req) is None
