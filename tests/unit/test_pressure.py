"""Pressure (docs/scheduling.md, ``load_shedding.under_pressure``, off by default): while
a pool loses requests to waiting, ``low`` arrivals are shed at once. Counted queue
watermarks cannot see this on a slow engine, where twenty queued requests are half a
minute of work. In process: the load model on a clock the test sets."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.admission import LoadCheck
from sidecar.config import SchedulerConfig, SidecarConfigError
from sidecar.contract import Priority, RefusalReason
from sidecar.estimator import ServiceRateEstimator
from sidecar.load_control import LoadControl
from sidecar.pools import Pool
from sidecar.request_state import ResultRecord
from sidecar.scheduler import Scheduler
from sidecar.warmup import SpeedSample
from tests.utils import fast_engine, make_sidecar_request, until, with_scheduler

HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW
SLOTS = 8
#: The slow CPU's calibration (AVX2 only: 0.6 s to the first token, 154 ms per token
#: at the full batch).
CALIBRATION = [SpeedSample(1, 0.19, 0.099)] + [SpeedSample(SLOTS, 0.6, 0.154)] * SLOTS


class Clock:
    """Monotonic seconds the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _config(under_pressure: list[str] | None = None) -> SchedulerConfig:
    config = SchedulerConfig(max_in_flight=SLOTS)
    config.load_shedding.under_pressure = ["low"] if under_pressure is None else under_pressure
    return config


def _load(config: SchedulerConfig | None = None) -> tuple[LoadControl, dict[Priority, Pool],
                                                           Clock]:
    config = config or _config()
    pools = {p: Pool(p, config.pools[str(p)]) for p in Priority}
    clock = Clock()
    est = ServiceRateEstimator(clock=clock)
    est.calibrate(CALIBRATION)
    load = LoadControl(config, pools, est,
                       in_flight=lambda: sum(p.in_flight for p in pools.values()))
    return load, pools, clock


def test_a_low_arrival_is_shed_while_normal_loses_requests_to_waiting() -> None:
    load, pools, clock = _load()
    check = LoadCheck(load)
    assert check.check(make_sidecar_request("low-before", priority=LOW)) is None
    lost = make_sidecar_request("n-lost", priority=NORMAL)
    load.note_timed_out_queued(lost)
    assert load.losing(NORMAL) and load.losing_above(LOW) is NORMAL
    refusal = check.check(make_sidecar_request("low-during", priority=LOW))
    assert refusal is not None and refusal.reason is RefusalReason.OVERLOADED
    assert "pool normal lost a request to waiting" in refusal.detail
    assert "under_pressure" in refusal.detail
    # Only the priorities listed: normal and high are admitted.
    assert check.check(make_sidecar_request("normal-during", priority=NORMAL)) is None
    assert check.check(make_sidecar_request("high-during", priority=HIGH)) is None
    # Once the window has passed with no further loss, low is admitted again.
    clock.now += load.config.load_shedding.pressure_window_s + 0.1
    assert not load.losing(NORMAL)
    assert check.check(make_sidecar_request("low-after", priority=LOW)) is None


def test_under_pressure_is_a_list_of_the_priorities_it_sheds() -> None:
    config = _config(["normal", "low"])
    load, _, _ = _load(config)
    check = LoadCheck(load)
    load.note_timed_out_queued(make_sidecar_request("h-lost", priority=HIGH))
    for prio in (NORMAL, LOW):
        refusal = check.check(make_sidecar_request(f"{prio}", priority=prio))
        assert refusal is not None and "pool high lost" in refusal.detail
    config.load_shedding.under_pressure = []
    assert check.check(make_sidecar_request("low-off", priority=LOW)) is None
    with pytest.raises(SidecarConfigError, match="under_pressure"):
        type(config.load_shedding)(under_pressure=["high"])
    with pytest.raises(SidecarConfigError, match="must be a list"):  # --set ...=[low]
        type(config.load_shedding)(under_pressure="[low]")
    with pytest.raises(SidecarConfigError, match="pressure_window_s"):
        type(config.load_shedding)(pressure_window_s=0)


def test_a_refusal_counts_as_a_loss_only_when_the_wait_cost_the_request() -> None:
    """At admission, a request refused as infeasible that would not fit even alone says
    nothing about load; one that would have fit with no wait does. A request refused
    after waiting in its queue always does."""
    load, _, _ = _load()
    hopeless = make_sidecar_request("hopeless", priority=NORMAL, max_tokens=400,
                                    deadline_in_ms=2_000)
    load.note_refused(hopeless, RefusalReason.DEADLINE_INFEASIBLE)
    assert not load.losing(NORMAL)
    load.note_refused(hopeless, RefusalReason.OVERLOADED, queued=True)
    assert not load.losing(NORMAL)  # a watermark's victim, not a wait it lost to
    load.note_refused(hopeless, RefusalReason.DEADLINE_INFEASIBLE, queued=True)
    assert load.losing(NORMAL)
    load, _, _ = _load()
    fits_alone = make_sidecar_request("fits", priority=NORMAL, max_tokens=20,
                                      deadline_in_ms=15_000)
    load.note_refused(fits_alone, RefusalReason.QUEUE_DELAY_EXCEEDED)
    assert load.losing(NORMAL)


def test_nothing_is_shed_for_pressure_by_default() -> None:
    load, _, _ = _load(SchedulerConfig(max_in_flight=SLOTS))
    load.note_timed_out_queued(make_sidecar_request("n-lost", priority=NORMAL))
    load.note_refused(make_sidecar_request("n-refused", priority=NORMAL),
                      RefusalReason.QUEUE_DELAY_EXCEEDED, queued=True)
    assert not load.losing(NORMAL)
    assert LoadCheck(load).check(make_sidecar_request("low", priority=LOW)) is None


@pytest.mark.parametrize("under_pressure", [["low"], []])
def test_the_scheduler_sheds_low_after_a_normal_request_timed_out_in_its_queue(
        under_pressure: list[str]) -> None:
    """Through the scheduler: a ``normal`` request whose deadline passes in its queue
    (the one slot is busy) makes ``normal`` lose, and the next ``low`` arrival is shed
    at once, only with ``under_pressure`` on."""
    config = SchedulerConfig(max_in_flight=1)
    config.load_shedding.under_pressure = under_pressure

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request("busy", priority=NORMAL, max_tokens=2_000,
                                             deadline_in_ms=60_000)])
        await until(lambda: s.pools[NORMAL].in_flight == 1)
        s.submit_batch([make_sidecar_request("expires", priority=NORMAL, max_tokens=5,
                                             deadline_in_ms=50)])
        await until(lambda: any(r.request_id == "expires" for r in results))
        ack = s.submit_batch([make_sidecar_request("low", priority=LOW, max_tokens=5)])[0]
        if under_pressure:
            assert not ack.accepted and ack.reason is RefusalReason.OVERLOADED
            assert "pool normal lost a request to waiting" in ack.detail
        else:
            assert ack.accepted

    results = asyncio.run(with_scheduler(fast_engine(max_num_seqs=1), config, body))
    expired = next(r for r in results if r.request_id == "expires")
    assert expired.status == "timeout"
    assert [r.request_id for r in results].count("low") == 1  # one terminal row either way
