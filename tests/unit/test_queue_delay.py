"""The queue-delay rule (README "Scheduling knobs", step 3): no refusal on a wait the
sidecar has not measured, and ``max_queue_delay_ms`` never turns away a request whose
deadline leaves room for its wait and its measured service time. In process: the load
model on a clock the test sets, and the scheduler on the simulated engine."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.admission import LoadCheck
from sidecar.config import SchedulerConfig
from sidecar.contract import Priority, RefusalReason
from sidecar.estimator import ServiceRateEstimator
from sidecar.load_control import LoadControl
from sidecar.pools import Pool
from sidecar.request_state import RequestStatus, ResultRecord, SidecarRequest
from sidecar.scheduler import Scheduler
from sidecar.warmup import SpeedSample
from tests.utils import fast_engine, make_sidecar_request, until, with_scheduler

pytestmark = pytest.mark.timeout(60)

HIGH, LOW = Priority.HIGH, Priority.LOW
SLOTS = 8
#: The warm-up calibration of SmolLM2 on this machine's CPU (sidecar log).
CALIBRATION = [SpeedSample(1, 0.19, 0.083)] + [SpeedSample(SLOTS, 1.16, 0.124)] * SLOTS


def _load() -> tuple[LoadControl, dict[Priority, Pool]]:
    """The shipped pools (``high``: ``max_queue_delay_ms`` 2000) on a frozen clock,
    calibrated, nothing served yet."""
    config = SchedulerConfig(max_in_flight=SLOTS)
    pools = {p: Pool(p, config.pools[str(p)]) for p in Priority}
    est = ServiceRateEstimator(clock=lambda: 100.0)
    est.calibrate(CALIBRATION)
    return LoadControl(config, pools, est,
                       in_flight=lambda: sum(p.in_flight for p in pools.values())), pools


def _burst(load: LoadControl, pools: dict[Priority, Pool], *, deadline_in_ms: int,
           n: int = 2 * SLOTS, max_tokens: int = 64
           ) -> list[tuple[SidecarRequest, RefusalReason | None, float]]:
    """``n`` ``high`` arrivals admitted one after the other (as one SubmitBatch is):
    each request, its refusal reason and the wait estimated for it."""
    check = LoadCheck(load)
    out = []
    for i in range(n):
        req = make_sidecar_request(f"h{i}", priority=HIGH, max_tokens=max_tokens,
                                   deadline_in_ms=deadline_in_ms)
        refusal = check.check(req)
        if refusal is None:
            pools[HIGH].push(req)
        out.append((req, refusal.reason if refusal else None, check.wait_s))
    return out


def test_a_fresh_sidecar_refuses_no_request_on_an_unmeasured_wait() -> None:
    """Before any answer, the service time assumes every answer is ``max_tokens`` long:
    the waits it gives are upper bounds. A burst of twice the slots is admitted whole,
    with a far deadline and even with a deadline the bound says is too near."""
    load, pools = _load()
    assert load.estimator.warm and not load.estimator.measured
    limit_s = pools[HIGH].config.max_queue_delay_ms / 1000
    burst = _burst(load, pools, deadline_in_ms=120_000)
    assert [reason for _, reason, _ in burst] == [None] * (2 * SLOTS)
    # The estimate said the second half would wait longer than the pool's bound.
    assert all(wait > limit_s for _, _, wait in burst[SLOTS:]), burst
    assert all(wait == 0.0 for _, _, wait in burst[:SLOTS])
    load, pools = _load()
    burst = _burst(load, pools, deadline_in_ms=8_000, max_tokens=24)
    assert [reason for _, reason, _ in burst] == [None] * (2 * SLOTS)
    assert not load.finishes_in_time(burst[-1][0], burst[-1][2])  # by the bound


def _measured(load: LoadControl) -> None:
    """One answer seen: ``high`` answers use half their ``max_tokens``."""
    load.estimator.observe_finish(HIGH, ttft_s=0.19, tpot_s=0.083, output_tokens=32,
                                  max_tokens=64, batch=1, ttft_batch=1)
    assert load.estimator.measured


def test_once_measured_a_wait_over_max_queue_delay_is_refused_only_when_the_deadline_is_too_near(
        ) -> None:
    load, pools = _load()
    _measured(load)
    limit_s = pools[HIGH].config.max_queue_delay_ms / 1000
    far = _burst(load, pools, deadline_in_ms=120_000)
    assert [reason for _, reason, _ in far] == [None] * (2 * SLOTS)
    assert sum(wait > limit_s for _, _, wait in far) >= SLOTS // 2, far  # over the bound
    # The threshold is the deadline: room for the wait plus the service at the full
    # batch is admitted, a little less is refused.
    check = LoadCheck(load)
    probe = make_sidecar_request("probe", priority=HIGH, max_tokens=64)
    wait_s = load.estimate_wait_s(probe)
    assert wait_s > limit_s
    need_ms = (wait_s + load.estimator.service_s(HIGH, max_tokens=64, batch=SLOTS)) * 1000
    roomy = make_sidecar_request("roomy", priority=HIGH, max_tokens=64,
                                 deadline_in_ms=int(need_ms) + 300)
    tight = make_sidecar_request("tight", priority=HIGH, max_tokens=64,
                                 deadline_in_ms=int(need_ms) - 300)
    assert check.check(roomy) is None
    refusal = check.check(tight)
    assert refusal is not None and refusal.reason is RefusalReason.QUEUE_DELAY_EXCEEDED
    assert "max_queue_delay_ms 2000" in refusal.detail and "deadline" in refusal.detail
    # deadline_slack > 1 is more cautious here too.
    load.config.deadline_slack = 2.0
    refusal = check.check(roomy)
    assert refusal is not None and refusal.reason is RefusalReason.QUEUE_DELAY_EXCEEDED


def test_a_short_burst_with_near_deadlines_is_refused_for_its_queue_once_measured() -> None:
    """A deadline with room for one answer, not for a wait for a slot as well."""
    load, pools = _load()
    _measured(load)
    alone_ms = load.estimator.service_s(HIGH, max_tokens=64, batch=1) * 1000
    burst = _burst(load, pools, deadline_in_ms=int(alone_ms) + 400)
    reasons = [reason for _, reason, _ in burst]
    assert reasons[:SLOTS] == [None] * SLOTS, reasons  # they start at once
    assert set(reasons[SLOTS:]) == {RefusalReason.QUEUE_DELAY_EXCEEDED}, reasons


def test_a_queued_request_outlives_max_queue_delay_when_its_deadline_leaves_room() -> None:
    """At ``max_queue_delay_ms`` of waiting, the request whose deadline cannot hold its
    service is shed; the one with a far deadline waits on and is answered. The shed
    row proves the delay has passed for both (the far one's timer was armed first)."""
    pools = {"low": {"max_queue_delay_ms": 150, "max_in_flight": 1}}

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.estimator.calibrate([SpeedSample(1, 0.002, 0.001)])  # 1 ms per token
        s.submit_batch([make_sidecar_request("busy", priority=LOW, max_tokens=2000,
                                             deadline_in_ms=60_000)])
        await until(lambda: s.pools[LOW].in_flight == 1)
        far = make_sidecar_request("far", priority=LOW, max_tokens=10, deadline_in_ms=60_000)
        near = make_sidecar_request("near", priority=LOW, max_tokens=1000, deadline_in_ms=700)
        acks = s.submit_batch([far, near])
        assert all(a.accepted for a in acks), acks
        await until(lambda: any(r.request_id == "near" for r in results), 10)
        row = next(r for r in results if r.request_id == "near")
        assert (row.status, row.reason) == ("shed", "queue_delay_exceeded"), row
        assert row.finish_ts - row.received_ts >= 140
        assert far.status is RequestStatus.QUEUED  # past its delay, still waiting
        await until(lambda: len(results) == 3, 20)

    results = asyncio.run(with_scheduler(
        fast_engine(max_num_seqs=1), SchedulerConfig(max_in_flight=1, pools=pools,
                                                     deadline_admission=False), body))
    rows = {r.request_id: r for r in results}
    assert rows["far"].status == "ok" and rows["busy"].status == "ok"
    assert rows["far"].first_token_ts - rows["far"].received_ts > 150


def test_a_wait_is_judged_by_the_batch_the_request_will_get_not_the_full_one() -> None:
    """A ``normal`` request behind an engine full of long ``low`` work waits longer than
    its pool's ``max_queue_delay_ms``; in the full batch its service would end after the
    deadline, but lower work is held back for a request that needs a small batch once it
    starts, so with nothing ahead of it it counts on running alone, and is admitted (it
    was refused ``queue_delay_exceeded`` before: issue 31). Behind queued ``high`` work,
    which starts first and shares the batch, the same request is refused."""
    from sidecar.pools import Running

    load, pools = _load()
    _measured(load)
    NORMAL = Priority.NORMAL
    for i in range(SLOTS):  # every slot: low work that ends in 20 s
        low = make_sidecar_request(f"l{i}", priority=LOW, max_tokens=400)
        pools[LOW].started(low, Running(low, 100.0, 120.0, live=True))
    req = make_sidecar_request("n", priority=NORMAL, max_tokens=64, deadline_in_ms=27_000)
    wait_s = load.evidence_wait_s(load.estimate_wait_s(req))
    assert wait_s * 1000 > pools[NORMAL].config.max_queue_delay_ms
    alone = load.estimator.service_s(NORMAL, max_tokens=64, batch=1)
    full = load.estimator.service_s(NORMAL, max_tokens=64, batch=SLOTS)
    assert wait_s + alone < 27.0 < wait_s + full  # fits alone, not in the full batch
    assert LoadCheck(load).check(req) is None  # refused queue_delay_exceeded before
    assert load.batch_after_wait(req) == 1
    for i in range(SLOTS):  # high work queued: it starts first and fills the batch
        pools[HIGH].push(make_sidecar_request(f"h{i}", priority=HIGH, max_tokens=64))
    assert load.batch_after_wait(req) == SLOTS
    refusal = LoadCheck(load).check(req)
    assert refusal is not None and refusal.reason in (RefusalReason.QUEUE_DELAY_EXCEEDED,
                                                      RefusalReason.DEADLINE_INFEASIBLE)


def test_a_running_request_frees_its_slot_by_its_deadline_in_the_wait_estimate() -> None:
    """A request running toward a deadline it cannot meet leaves its slot by then (it is
    aborted, or late work that on-time work may abort), so an arrival's estimated wait
    is at most that, not the long service the running one would need. (Estimated from
    the service, a sidecar shared by a test that left long requests running refused the
    next test's requests ``queue_delay_exceeded`` on a slow machine.)"""

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.estimator.calibrate([SpeedSample(1, 0.002, 0.01)])  # 10 ms per token
        acks = s.submit_batch([make_sidecar_request("long", priority=LOW, max_tokens=2000,
                                                    deadline_in_ms=1_000)])  # ~20 s of work
        assert acks[0].accepted, acks
        await until(lambda: s.pools[LOW].in_flight == 1)
        arrival = make_sidecar_request("next", priority=LOW, max_tokens=10,
                                       deadline_in_ms=60_000)
        assert s.load.natural_wait_s(arrival) <= 1.0

    asyncio.run(with_scheduler(
        fast_engine(max_num_seqs=1), SchedulerConfig(max_in_flight=1, deadline_admission=False),
        body))
