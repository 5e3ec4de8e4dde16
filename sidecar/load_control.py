"""Admission against load: pool limits, load-shedding watermarks, queue delay, deadlines.

:class:`LoadControl` reads the pools and the service-rate estimate and decides,
for one request, whether it can be admitted (:meth:`LoadControl.check`), whether a
queued one should still start (:meth:`LoadControl.infeasible_now`) and which
queued requests a crossed watermark sheds (:meth:`LoadControl.watermark_victims`).
It changes nothing itself: the :class:`~sidecar.scheduler.Scheduler` acts on its
answers. The order of the checks is documented in :mod:`sidecar.scheduler`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sidecar.admission import Refusal
from sidecar.config import SchedulerConfig
from sidecar.contract import Priority, RefusalReason, now_ms
from sidecar.estimator import ServiceRateEstimator
from sidecar.pools import Pool
from sidecar.request_state import SidecarRequest


class LoadControl:
    """Load-dependent admission decisions over the scheduler's pools.

    Args:
        config: The scheduler's limits.
        pools: The scheduler's pools (read, never changed here).
        estimator: Online service-rate estimate.
        in_flight: Requests currently inside the engine (all pools).
    """

    def __init__(self, config: SchedulerConfig, pools: dict[Priority, Pool],
                 estimator: ServiceRateEstimator, *, in_flight: Callable[[], int]) -> None:
        self.config = config
        self.pools = pools
        self.estimator = estimator
        self._in_flight = in_flight

    def total_queued(self) -> int:
        """Requests waiting in all pools."""
        return sum(pool.queued for pool in self.pools.values())

    def total_tokens_in_flight(self) -> int:
        """Prompt plus ``max_tokens`` of every request inside the engine."""
        return sum(pool.tokens_in_flight for pool in self.pools.values())

    def share(self, priority: Priority) -> float:
        """The pool's share of dispatches among the pools that have work."""
        busy = [p for p, pool in self.pools.items() if pool.queued or pool.in_flight]
        weights = {p: self.pools[p].config.weight for p in set(busy) | {priority}}
        return weights[priority] / sum(weights.values())

    def estimate_wait_s(self, req: SidecarRequest) -> float:
        """Expected queue wait of ``req`` if it were admitted now, seconds."""
        assert req.priority is not None
        pool = self.pools[req.priority]
        slot_free = (self._in_flight() < self.config.max_in_flight
                     and pool.has_room_for(req))
        slots = min(pool.config.max_in_flight, self.config.max_in_flight)
        return self.estimator.queue_wait_s(
            req.priority, ahead=pool.queued, slot_free=slot_free, share=self.share(req.priority),
            slots=slots, service_s=self.estimator.service_s(req.priority,
                                                            max_tokens=req.max_tokens))

    def over_watermark(self, priority: Priority) -> str | None:
        """Why ``priority`` is being shed right now, or ``None``."""
        marks = self.config.load_shedding
        name = str(priority)
        depth = marks.queue_depth.get(name)
        if depth is not None and self.total_queued() >= depth:
            return f"{self.total_queued()} requests queued (watermark for {name}: {depth})"
        tokens = marks.tokens_in_flight.get(name)
        if tokens is not None and self.total_tokens_in_flight() >= tokens:
            return (f"{self.total_tokens_in_flight()} tokens in the engine "
                    f"(watermark for {name}: {tokens})")
        return None

    def check(self, req: SidecarRequest) -> Refusal | None:
        """Admission against pool limits, watermarks, queue delay and the deadline."""
        assert req.priority is not None
        pool = self.pools[req.priority]
        if pool.queued >= pool.config.max_queued:
            return Refusal(RefusalReason.QUEUE_FULL,
                           f"{pool.queued} requests already queued in pool {req.priority} "
                           f"(max_queued {pool.config.max_queued})")
        if req.priority is not Priority.HIGH and (why := self.over_watermark(req.priority)):
            return Refusal(RefusalReason.OVERLOADED, f"load shedding: {why}")
        wait_s = self.estimate_wait_s(req)
        if wait_s * 1000.0 > pool.config.max_queue_delay_ms:
            return Refusal(RefusalReason.QUEUE_DELAY_EXCEEDED,
                           f"estimated queue wait {wait_s * 1000:.0f} ms exceeds pool "
                           f"{req.priority}'s max_queue_delay_ms {pool.config.max_queue_delay_ms}")
        if self.config.deadline_admission and self.estimator.warm:
            service_s = self.estimator.service_s(req.priority, max_tokens=req.max_tokens)
            done_ms = now_ms() + self.config.deadline_slack * (wait_s + service_s) * 1000.0
            if done_ms > req.deadline_ts:
                return Refusal(RefusalReason.DEADLINE_INFEASIBLE,
                               f"estimated completion in {done_ms - now_ms():.0f} ms (wait "
                               f"{wait_s * 1000:.0f} ms + service {service_s * 1000:.0f} ms) is "
                               f"after the deadline, {req.deadline_ts - now_ms()} ms away")
        return None

    def watermark_victims(self) -> Iterator[tuple[SidecarRequest, Refusal]]:
        """Queued ``low`` (then ``normal``) requests to shed, newest first, while the total
        queue depth is over their watermark. The caller removes each victim from its
        queue before asking for the next one."""
        for priority in (Priority.LOW, Priority.NORMAL):
            mark = self.config.load_shedding.queue_depth.get(str(priority))
            if mark is None:
                continue
            pool = self.pools[priority]
            while self.total_queued() > mark and (victim := pool.newest_queued()):
                yield victim, Refusal(RefusalReason.OVERLOADED,
                                      f"load shedding: queue depth over the {priority} "
                                      f"watermark ({mark}) after admission")

    def infeasible_now(self, req: SidecarRequest) -> Refusal | None:
        """At the head of the queue: shed instead of starting work that cannot finish."""
        if not (self.config.deadline_admission and self.estimator.warm):
            return None
        assert req.priority is not None
        service_s = self.estimator.service_s(req.priority, max_tokens=req.max_tokens)
        left_ms = req.deadline_ts - now_ms()
        if self.config.deadline_slack * service_s * 1000.0 > left_ms:
            return Refusal(RefusalReason.DEADLINE_INFEASIBLE,
                           f"after queueing, {left_ms} ms left is less than the estimated "
                           f"service time {service_s * 1000:.0f} ms")
        return None
