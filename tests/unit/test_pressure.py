"""Pressure (README "Scheduling knobs", ``load_shedding.under_pressure``): while a pool
loses requests to waiting, the dispatcher holds every lower pool back for it and ``low``
arrivals are shed at once. Counted queue watermarks cannot see this on a slow engine,
where twenty queued requests are half a minute of work. In process: the load model on
a clock the test sets."""

from __future__ import annotations

import pytest

from sidecar.admission import LoadCheck
from sidecar.config import SchedulerConfig, SidecarConfigError
from sidecar.contract import Priority, RefusalReason
from sidecar.dispatch_order import DispatchOrder
from sidecar.estimator import ServiceRateEstimator
from sidecar.load_control import LoadControl
from sidecar.pools import Pool
from sidecar.warmup import SpeedSample
from tests.utils import make_sidecar_request

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


def _load(config: SchedulerConfig | None = None) -> tuple[LoadControl, dict[Priority, Pool],
                                                           Clock]:
    config = config or SchedulerConfig(max_in_flight=SLOTS)
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
    config = SchedulerConfig(max_in_flight=SLOTS)
    config.load_shedding.under_pressure = ["normal", "low"]
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


def test_a_losing_pool_with_a_feasible_head_holds_lower_pools_back() -> None:
    """The weights share the engine while the higher pool can afford it: here ``low``
    weighs 8 against ``normal``'s 1, so it takes the first turn; while ``normal``
    loses requests to waiting, every free slot goes to ``normal``."""
    config = SchedulerConfig(max_in_flight=SLOTS)
    config.pools["normal"].weight, config.pools["low"].weight = 1, 8
    load, pools, clock = _load(config)
    for i in range(4):
        pools[NORMAL].push(make_sidecar_request(f"n{i}", priority=NORMAL, max_tokens=20))
        pools[LOW].push(make_sidecar_request(f"l{i}", priority=LOW, max_tokens=20))
    order = DispatchOrder(pools, load)
    assert order.next_request(0).priority is LOW  # the weights, nothing losing
    load.note_timed_out_queued(make_sidecar_request("n-lost", priority=NORMAL))
    assert load.pressed(NORMAL)
    assert [order.next_request(0).priority for _ in range(6)] == [NORMAL] * 6
    # A head that cannot finish even if it starts now does not hold anyone back.
    pools[NORMAL].queue.appendleft(make_sidecar_request("n-late", priority=NORMAL,
                                                        max_tokens=400, deadline_in_ms=500))
    pools[NORMAL].queued += 1
    assert not load.pressed(NORMAL)
    assert order.next_request(0).priority is LOW
    pools[NORMAL].queue.popleft()
    pools[NORMAL].queued -= 1
    clock.now += config.load_shedding.pressure_window_s + 0.1
    assert not load.pressed(NORMAL)
    assert LOW in [order.next_request(0).priority for _ in range(3)]
