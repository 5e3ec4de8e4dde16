"""The load model: queue waits, engine slots, batch sizes and deadlines over the pools.

:class:`LoadControl` reads the pools and the service-rate estimate and answers, for
one request, how long it would wait (:meth:`LoadControl.estimate_wait_s`) and in how
small a batch it must run to meet its deadline (:meth:`LoadControl.fit_batch`);
whether a queued one should still start (:meth:`LoadControl.infeasible_now`); which
queued requests a crossed watermark sheds (:meth:`LoadControl.watermark_victims`) and
which running requests a higher-priority one may preempt (:meth:`LoadControl.victims`);
and whether a pool is losing requests to waiting (:meth:`LoadControl.losing`).
Refusals test the deadline itself; the batch a request starts in and its catch-up aim
``scheduler.delivery_ms`` earlier where a smaller batch gets it there (the time a result
then takes to land as the caller's answer; :meth:`LoadControl.left_ms`).
It changes nothing itself: the admission step :mod:`sidecar.admission.load` and the
:class:`~sidecar.scheduler.Scheduler`'s dispatcher act on its answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sidecar.acks import Refusal
from sidecar.config import SchedulerConfig
from sidecar.contract import Priority, RefusalReason, now_ms
from sidecar.estimator import ServiceRateEstimator
from sidecar.intake_window import IntakeWindows
from sidecar.pools import Pool, Running
from sidecar.request_state import SidecarRequest

#: Refusals that lose a request to waiting (when it would have fit with no wait).
_WAIT_LOSSES = frozenset({RefusalReason.QUEUE_DELAY_EXCEEDED, RefusalReason.DEADLINE_INFEASIBLE})


class LoadControl:
    """Load-dependent admission decisions over the scheduler's pools.

    Args:
        config: The scheduler's limits.
        pools: The scheduler's pools (read, never changed here).
        estimator: Online service-rate estimate.
        in_flight: Requests currently inside the engine (all pools, late work included).
        late: Late work inside the engine: requests generating past their deadline for
            a backfill, which the dispatcher aborts as soon as on-time work needs their
            slot. They count as free slots for on-time work and as the first to go when
            a request needs a small batch.
    """

    def __init__(self, config: SchedulerConfig, pools: dict[Priority, Pool],
                 estimator: ServiceRateEstimator, *, in_flight: Callable[[], int],
                 late: Callable[[], int] = lambda: 0) -> None:
        self.config = config
        self.pools = pools
        self.estimator = estimator
        self._in_flight = in_flight
        self._late = late
        self._pool_list = list(pools.values())
        self.windows = IntakeWindows(config.max_in_flight, clock=estimator.clock)
        """The intake window of each priority (:attr:`batch_limit` reads it)."""
        self._pending = dict.fromkeys(pools, 0)
        """Per pool, the requests admitted in the batch being admitted (not yet in their
        queues) less the queued ones the watermarks will shed for them."""
        self._pending_total = 0
        marks = config.load_shedding.queue_depth
        self._lowest_queue_mark = min((marks[name] for name in ("low", "normal") if name in marks),
                                      default=None)

    def in_flight(self) -> int:
        """Requests inside the engine now (all pools, late work included)."""
        return self._in_flight()

    def on_time_in_flight(self) -> int:
        """Requests inside the engine that on-time work cannot take the slot of: all but
        the late work."""
        return self._in_flight() - self._late()

    def queued(self, priority: Priority) -> int:
        """Requests waiting in ``priority``'s pool (with the batch being admitted)."""
        return self.pools[priority].queued + self._pending[priority]

    def total_queued(self) -> int:
        """Requests waiting in all pools (with the batch being admitted)."""
        n = self._pending_total
        for pool in self._pool_list:
            n += pool.queued
        return n

    def admit_pending(self, priority: Priority) -> None:
        """A request of ``priority`` was admitted in the batch being admitted: count it
        as queued, behind its pool's queue, and the queued ``low`` (then ``normal``)
        requests the queue watermarks will shed for it (:meth:`watermark_victims`) as
        gone, until :meth:`clear_pending`."""
        self._pending[priority] += 1
        self._pending_total += 1
        if not self.over_any_queue_watermark():
            return
        marks = self.config.load_shedding.queue_depth
        for victim_priority in (Priority.LOW, Priority.NORMAL):
            mark = marks.get(str(victim_priority))
            while mark is not None and self.total_queued() > mark \
                    and self.queued(victim_priority) > 0:
                self._pending[victim_priority] -= 1
                self._pending_total -= 1

    def clear_pending(self) -> None:
        """The batch is decided (its requests go into their queues now, or never)."""
        if any(self._pending.values()):
            self._pending = dict.fromkeys(self.pools, 0)
            self._pending_total = 0

    def total_tokens_in_flight(self) -> int:
        """Prompt plus ``max_tokens`` of every request inside the engine."""
        return sum(pool.tokens_in_flight for pool in self.pools.values())

    def share(self, priority: Priority) -> float:
        """The pool's share of dispatches among the pools that have work."""
        busy = [p for p, pool in self.pools.items() if self.queued(p) or pool.in_flight]
        weights = {p: self.pools[p].config.weight for p in set(busy) | {priority}}
        return weights[priority] / sum(weights.values())

    # -------------------------------------------------------------- engine slots

    def batch_limit(self, priority: Priority) -> int:
        """Most sequences the engine may hold when a ``priority`` request starts: the
        engine's ``max_in_flight``, lowered while higher-priority work is slowed by the
        work starting beside it (:attr:`windows`) and while a higher-priority request
        that needs a small batch runs (see :attr:`~sidecar.pools.Running.target_batch`)."""
        limit = self.windows.limit(priority)
        for pool in self._pool_list:
            if pool.holding and pool.priority < priority:
                limit = min(limit, *pool.holding.values())
        return limit

    def slot_free(self, req: SidecarRequest) -> bool:
        """Whether ``req`` could start now if nothing in its pool were ahead of it."""
        assert req.priority is not None
        return (self.on_time_in_flight() < self.batch_limit(req.priority)
                and self.pools[req.priority].has_room_for(req))

    def victims(self, priority: Priority) -> list[Running]:
        """Running requests a ``priority`` request may preempt, best victim first: lower
        priority, not yet preempted ``preemption.max_per_request`` times; the lowest
        priority first, then the most work left."""
        cfg = self.config.preemption
        if not cfg.enabled:
            return []
        out = [r for p, pool in self.pools.items() if p > priority
               for r in pool.running.values() if r.live and r.preemptions < cfg.max_per_request]
        out.sort(key=lambda r: (-int(r.req.priority or 0), -r.expected_end))
        return out

    def _slots_free_in_s(self, req: SidecarRequest) -> tuple[list[float], float]:
        """Seconds until each running request whose slot ``req`` could take ends, and
        the share of freed slots ``req``'s pool gets."""
        assert req.priority is not None
        pool = self.pools[req.priority]
        now = self.estimator.clock()
        step = self.estimator.tpot_s(req.priority)
        if self.on_time_in_flight() < self.batch_limit(req.priority):
            running, share = pool.running.values(), 1.0  # blocked by its own pool's limits
        else:
            running = [r for p in self.pools.values() for r in p.running.values()]
            # Freed slots are contested only by pools with queued work.
            weights = {p: pool.config.weight for p, pool in self.pools.items()
                       if self.queued(p) or p == req.priority}
            share = weights[req.priority] / sum(weights.values())
        return [max(r.expected_end - now, step) for r in running], share

    def natural_wait_s(self, req: SidecarRequest, ahead: int | None = None) -> float:
        """Expected queue wait of ``req`` without preemption: the slots it needs (its
        position in its pool), as running requests end and the engine completes work.

        Args:
            req: The request.
            ahead: Requests before it in its pool's queue; ``None``: it is an arrival,
                behind everything its pool has queued.
        """
        assert req.priority is not None
        pool = self.pools[req.priority]
        if ahead is None:
            ahead = self.queued(req.priority)
            in_flight = self.on_time_in_flight()
            if (in_flight + self.total_queued() < self.batch_limit(req.priority)
                    and pool.in_flight + ahead < pool.config.max_in_flight):
                return 0.0  # everything queued starts at the next dispatch, this one too
        slots = min(pool.config.max_in_flight, self.config.max_in_flight)
        ends, share = self._slots_free_in_s(req)
        return self.estimator.queue_wait_s(
            req.priority, ahead=ahead, slot_free=self.slot_free(req), share=share,
            slots=slots, service_s=self.estimator.service_s(req.priority,
                                                            max_tokens=req.max_tokens),
            slots_free_in_s=ends)

    def preempt_wait_s(self, req: SidecarRequest, ahead: int | None = None) -> float | None:
        """Expected wait of ``req`` when lower-priority work is preempted for it (one
        decode step), or ``None`` when there is not enough to preempt or abort (late
        work) for it and the ``ahead`` requests before it (``None``: all its pool has
        queued)."""
        assert req.priority is not None
        if ahead is None:
            ahead = self.queued(req.priority)
        if len(self.victims(req.priority)) + self._late() < ahead + 1:
            return None
        return self.estimator.tpot_s(req.priority, self._in_flight())

    def preempts_at_once(self, priority: Priority) -> bool:
        """Whether ``priority`` preempts lower work as soon as it cannot start."""
        cfg = self.config.preemption
        return cfg.enabled and str(priority) in cfg.immediate

    def estimate_wait_s(self, req: SidecarRequest, ahead: int | None = None) -> float:
        """Expected queue wait of ``req`` if it were admitted now (``ahead``: see
        :meth:`natural_wait_s`), seconds, with preemption for the priorities that
        preempt at once."""
        natural = self.natural_wait_s(req, ahead)
        if natural > 0.0 and self.preempts_at_once(req.priority):  # type: ignore[arg-type]
            if (pre := self.preempt_wait_s(req, ahead)) is not None:
                return min(natural, pre)
        return natural

    def evidence_wait_s(self, wait_s: float) -> float:
        """The part of an estimated wait a refusal may rest on: all of it once a request
        has completed (:attr:`~sidecar.estimator.ServiceRateEstimator.measured`), none
        before. Until then every service time assumes answers use all of
        ``max_tokens``, so the wait is an upper bound: it may admit, never refuse."""
        return wait_s if self.estimator.measured else 0.0

    def batch_after_wait(self, req: SidecarRequest, ahead: int | None = None) -> int:
        """The batch ``req`` can count on running in once its wait is over: the full
        batch (``max_in_flight``), or, where lower work is held back for a request that
        needs a small batch (``preemption.shrink_batch``), itself plus what starts
        before it and is not lower: every request queued in a higher pool and the
        ``ahead`` requests before it in its own (``None``: all its pool has queued)."""
        assert req.priority is not None
        full = self.config.max_in_flight
        cfg = self.config.preemption
        if not (cfg.enabled and cfg.shrink_batch):
            return full
        if ahead is None:
            ahead = self.queued(req.priority)
        higher = sum(self.queued(p) for p in self.pools if p < req.priority)
        return min(full, ahead + higher + 1)

    def _service_after_wait_s(self, req: SidecarRequest, ahead: int | None = None) -> float:
        assert req.priority is not None
        return self.estimator.service_s(req.priority, max_tokens=req.max_tokens,
                                        batch=self.batch_after_wait(req, ahead))

    def delivery_ms(self, req: SidecarRequest) -> int:
        """How long before its deadline ``req``'s result should leave: the larger of the
        request's own ``delivery_ms`` (its caller's answer path) and
        ``scheduler.delivery_ms``."""
        return max(self.config.delivery_ms, req.delivery_ms)

    def _aims(self, req: SidecarRequest) -> tuple[bool, ...]:
        """What the batch levers aim for, in turn: the deadline less ``delivery_ms``
        (``early``) when there is one, then the deadline itself."""
        return (True, False) if self.delivery_ms(req) else (False,)

    def left_ms(self, req: SidecarRequest, *, early: bool = False) -> int:
        """Milliseconds ``req`` has to finish in: to its deadline, or with ``early`` to
        its deadline less :meth:`delivery_ms` (the time its result then takes to become
        the caller's answer)."""
        return req.deadline_ts - (self.delivery_ms(req) if early else 0) - now_ms()

    def finishes_in_time(self, req: SidecarRequest, wait_s: float,
                         ahead: int | None = None) -> bool:
        """Whether the deadline and the measured service time say ``req`` finishes in
        time after waiting ``wait_s``: ``deadline_slack`` x (wait + service in the batch
        it can count on then, :meth:`batch_after_wait`) fits before ``deadline_ts``.
        ``False`` while the engine's speed is unknown (not calibrated, nothing
        finished)."""
        if not self.estimator.warm:
            return False
        left_ms = self.left_ms(req)
        service_s = self._service_after_wait_s(req, ahead)
        return self.config.deadline_slack * (wait_s + service_s) * 1000.0 <= left_ms

    def queue_delay_refusal(self, req: SidecarRequest, wait_s: float, *,
                            queued: bool = False, ahead: int | None = None) -> Refusal | None:
        """The ``queue_delay_exceeded`` refusal of ``req``, or ``None`` when it may wait.

        The rule: a request may wait up to its pool's ``max_queue_delay_ms`` on no
        evidence; it is refused for waiting longer only when the deadline and the
        measured service time do not say it still finishes in time
        (:meth:`finishes_in_time` after the wait). So ``max_queue_delay_ms`` is the
        wait a pool accepts without that proof, never a cap below what the caller's
        own deadline allows; while the engine's speed is unknown it is a plain cap.

        Args:
            req: An arrival (``queued`` false) or a request that has waited
                ``max_queue_delay_ms`` in its queue (``queued`` true).
            wait_s: The arrival's estimated wait, or the queued request's estimated
                remaining wait; seconds, as given by :meth:`evidence_wait_s`.
            queued: See ``req``.
            ahead: A queued request's position in its pool (``None``: an arrival).
        """
        assert req.priority is not None
        limit = self.pools[req.priority].config.max_queue_delay_ms
        if not queued and wait_s * 1000.0 <= limit:
            return None
        if self.finishes_in_time(req, wait_s, ahead):
            return None
        left_ms = self.left_ms(req)
        room = (f"the deadline, {left_ms} ms away, does not leave room for "
                f"{'the rest of ' if queued else ''}its wait ({wait_s * 1000:.0f} ms) and "
                f"its service ({self._service_after_wait_s(req, ahead) * 1000:.0f} ms at "
                f"batch {self.batch_after_wait(req, ahead)})"
                if self.estimator.warm else "the engine's speed is not measured yet")
        if queued:
            return Refusal(RefusalReason.QUEUE_DELAY_EXCEEDED,
                           f"waited {limit} ms in pool {req.priority} (max_queue_delay_ms) "
                           f"and {room}")
        return Refusal(RefusalReason.QUEUE_DELAY_EXCEEDED,
                       f"estimated queue wait {wait_s * 1000:.0f} ms exceeds pool "
                       f"{req.priority}'s max_queue_delay_ms {limit}, and {room}")

    def fit_batch(self, req: SidecarRequest, wait_s: float, *,
                  largest: bool = False, early: bool = False) -> int | None:
        """The batch size ``req`` should run in to finish by its deadline after waiting
        ``wait_s``: the batch it would join (sequences running plus itself; with
        ``largest``, the engine's ``max_in_flight``) when that fits, else the largest
        smaller batch that fits and that aborting late work and preempting lower work
        can reach (``preemption.shrink_batch``); ``None`` when none fits, so not even
        the smallest batch the engine can give it. ``early``: to finish by the deadline
        less ``delivery_ms``."""
        assert req.priority is not None
        natural = min(self._in_flight() + 1, self.config.max_in_flight)
        if largest:
            natural = self.config.max_in_flight
        left_ms = self.left_ms(req, early=early)
        slack = self.config.deadline_slack

        def fits(batch: int) -> bool:
            service_s = self.estimator.service_s(req.priority, max_tokens=req.max_tokens,
                                                 batch=batch)
            return slack * (wait_s + service_s) * 1000.0 <= left_ms

        if fits(natural):
            return natural
        cfg = self.config.preemption
        if not (cfg.enabled and cfg.shrink_batch):
            return None
        floor = self.on_time_in_flight() - len(self.victims(req.priority)) + 1
        for batch in range(natural - 1, max(floor, 1) - 1, -1):
            if fits(batch):
                return batch
        return None

    def catch_up_batch(self, req: SidecarRequest, tpot_s: float,
                       ran_in: float) -> int | None:
        """For a running ``req`` that decoded at ``tpot_s`` per token so far, in a mean
        batch of ``ran_in`` sequences: the largest batch below the one the engine runs
        now in which the rest of its expected answer still fits before its deadline less
        ``delivery_ms`` or, when no reachable batch gets it there, before its deadline;
        scaled from its own speed by the engine's batch speed model. ``None`` when it is
        on schedule, or when not even the smallest batch that preempting lower work can
        reach would do (others are not slowed down for nothing). The batch lever of
        :meth:`fit_batch`, applied again while it runs."""
        assert req.priority is not None
        cfg = self.config.preemption
        if not (self.config.deadline_admission and cfg.enabled and cfg.shrink_batch
                and self.estimator.warm and tpot_s > 0.0):
            return None
        remaining = self._tokens_left(req)
        slack = self.config.deadline_slack
        speed = self.estimator.speed
        now_in = self._in_flight()
        floor = self.on_time_in_flight() - len(self.victims(req.priority))
        for early in self._aims(req):
            left_s = self.left_ms(req, early=early) / 1000.0
            if left_s <= 0.0:
                continue

            def fits(batch: int) -> bool:
                return slack * remaining * tpot_s * speed.ratio(batch, ran_in) <= left_s

            if fits(now_in):
                return None
            for batch in range(now_in - 1, max(floor, 1) - 1, -1):
                if fits(batch):
                    return batch
        return None

    def fits_if_held(self, req: SidecarRequest, wait_s: float) -> bool:
        """Whether ``req``, late at the engine's present speed, would finish in time after
        waiting ``wait_s`` at the speed the warm-up measured at the batch it would join
        (no prompt prefilled beside it; ``False`` without calibration): what
        slows the engine is work starting beside it, which narrowing the intake windows
        below ``req``'s priority holds back (``preemption.hold_lower``). Never for the
        lowest priority: nothing below it to hold back."""
        assert req.priority is not None
        cfg = self.config.preemption
        if not (cfg.enabled and cfg.hold_lower) or req.priority is max(self.pools):
            return False
        service_s = self.estimator.clean_service_s(
            req.priority, max_tokens=req.max_tokens,
            batch=min(self._in_flight() + 1, self.config.max_in_flight))
        return service_s is not None and \
            self.config.deadline_slack * (wait_s + service_s) * 1000.0 <= self.left_ms(req)

    def _tokens_left(self, req: SidecarRequest) -> float:
        """Output tokens a running ``req`` is still expected to generate (at least 1)."""
        assert req.priority is not None
        expected = self.estimator.expected_output_tokens(req.priority, req.max_tokens)
        return max(min(expected, req.max_tokens) - req.output_tokens, 1.0)

    def slowed_by_others(self, req: SidecarRequest, tpot_s: float) -> bool:
        """Whether a running ``req`` that decoded at ``tpot_s`` per token so far misses
        its deadline (less ``delivery_ms`` when set, then the deadline itself) at that
        speed but would meet it at the speed the warm-up measured at the present batch
        (:meth:`~sidecar.estimator.ServiceRateEstimator.clean_tpot_s`: no prompt
        prefilled beside it): what slows it is work starting
        beside it, so fewer lower starts (``preemption.hold_lower``,
        :class:`~sidecar.intake_window.IntakeWindows`) can save it, and a request no
        speed would save holds nothing back."""
        assert req.priority is not None
        cfg = self.config.preemption
        if not (self.config.deadline_admission and cfg.enabled and cfg.hold_lower
                and self.estimator.warm and tpot_s > 0.0):
            return False
        remaining = self._tokens_left(req)
        unloaded_s = self.estimator.clean_tpot_s(self._in_flight())
        if unloaded_s is None:
            return False
        slack = self.config.deadline_slack
        for early in self._aims(req):
            left_s = self.left_ms(req, early=early) / 1000.0
            if left_s <= 0.0:
                continue
            if slack * remaining * tpot_s <= left_s:
                return False  # on schedule
            if slack * remaining * unloaded_s <= left_s:
                return True
        return False

    def over_any_queue_watermark(self) -> bool:
        """Whether the total queue depth is over the ``low`` or ``normal`` watermark (a
        quick test before :meth:`watermark_victims`)."""
        mark = self._lowest_queue_mark
        return mark is not None and self.total_queued() > mark

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
        """At the head of the queue: shed instead of starting work that cannot finish,
        even in the smallest batch preemption can give it."""
        if not (self.config.deadline_admission and self.estimator.warm):
            return None
        assert req.priority is not None
        if self.fit_batch(req, 0.0) is not None:
            return None
        if self.fits_if_held(req, 0.0):
            self.windows.slowed(req.priority)
            return None
        service_s = self.estimator.service_s(req.priority, max_tokens=req.max_tokens,
                                             batch=min(self._in_flight() + 1,
                                                       self.config.max_in_flight))
        left_ms = self.left_ms(req)
        return Refusal(RefusalReason.DEADLINE_INFEASIBLE,
                       f"after queueing, {left_ms} ms left is less than the estimated "
                       f"service time {service_s * 1000:.0f} ms")

    def note_refused(self, req: SidecarRequest, reason: RefusalReason, *,
                     queued: bool = False) -> None:
        """``req`` was refused at admission or, ``queued``, after waiting in its queue:
        when for a wait it could not afford (``queue_delay_exceeded``,
        ``deadline_infeasible``) after waiting, or at admission although it would have
        fit with no wait, its pool is losing (:meth:`losing`). Not tracked while
        ``load_shedding.under_pressure`` is off (nothing reads it then)."""
        if req.priority is None or reason not in _WAIT_LOSSES \
                or not self.config.load_shedding.under_pressure:
            return
        if queued or (self.estimator.warm and self.fit_batch(req, 0.0) is not None):
            self.pools[req.priority].lost_at = self.estimator.clock()

    def note_timed_out_queued(self, req: SidecarRequest) -> None:
        """``req``'s deadline passed while it waited in its queue: its pool is losing
        (tracked only while ``load_shedding.under_pressure`` is on)."""
        assert req.priority is not None
        if not self.config.load_shedding.under_pressure:
            return
        self.pools[req.priority].lost_at = self.estimator.clock()

    def losing(self, priority: Priority) -> bool:
        """Whether ``priority``'s pool lost a request to waiting within the last
        ``load_shedding.pressure_window_s``: the engine does not keep up with it."""
        lost = self.pools[priority].lost_at
        return lost is not None and \
            self.estimator.clock() - lost < self.config.load_shedding.pressure_window_s

    def losing_above(self, priority: Priority) -> Priority | None:
        """The highest pool above ``priority`` that is :meth:`losing`, or ``None``."""
        for pool in self._pool_list:
            if pool.priority >= priority:
                return None
            if self.losing(pool.priority):
                return pool.priority
        return None

    def target_batch(self, req: SidecarRequest) -> int | None:
        """When ``req`` starts now: the largest batch it can finish in by its deadline
        less ``delivery_ms`` or, when no reachable batch gets it there, by its deadline,
        when that is below ``max_in_flight`` (lower work is preempted down to it and held
        back while it runs), else ``None``."""
        if not (self.config.deadline_admission and self.estimator.warm
                and self.config.preemption.shrink_batch):
            return None
        for early in self._aims(req):
            if (batch := self.fit_batch(req, 0.0, largest=True, early=early)) is not None:
                return batch if batch < self.config.max_in_flight else None
        return None
