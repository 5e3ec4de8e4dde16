"""Priority pools, dispatch into the engine, deadline aborts and the one terminal row.

One :class:`Scheduler` per sidecar. :meth:`Scheduler.submit_batch` runs in the
gRPC handler: the admission pipeline (:class:`~sidecar.admission.Admission`: validate,
dedupe, gate, load) decides on the batch and returns its decisions (one
:class:`~sidecar.admission.Ack` per request, the accepted requests, the refusals),
which the scheduler applies at once; it never waits for generation. What happens
after that is here.

Once queued, a request is shed when it has waited ``max_queue_delay_ms`` and its
deadline does not leave room for the rest of its wait and its service, when
a higher-priority arrival pushes the queue past its priority's watermark
(newest first), or at the head of the queue when its deadline has become
infeasible; it times out if its deadline passes while queued. A single
dispatch loop moves queued requests into the engine while fewer than
``max_in_flight`` run, choosing between pools with work and room by
:class:`~sidecar.pools.WeightedPicker` (FIFO within a pool). Each running
request is one task that consumes the engine's stream under the request's
deadline; cancelling it aborts the request inside the engine.

Preemption (``scheduler.preemption``): when the head of a ``high`` queue cannot
start because the engine is full (or the head of a ``normal`` queue would miss its
deadline waiting for a slot), the running request of the lowest priority with the
most work left is aborted in the engine and put back at the front of its pool's
queue, its deadline unchanged and its partial output dropped; it is preempted at
most ``max_per_request`` times. When a request can only meet its deadline in a
smaller batch (per-sequence decode speed falls as the batch grows), lower work is
preempted and held back while it runs (:meth:`LoadControl.fit_batch`).

Every request with a ``request_id`` ends in exactly one terminal result, written
through :meth:`_finish`, which ignores a second finish of the same request (the one
exception: a refusal while the result channel has no room left even for refusal rows
is answered by its ack alone, see :mod:`sidecar.admission.gate`).

At the deadline of a running request its pool's ``on_deadline`` decides. ``abort``:
the request is aborted in the engine and ends ``timeout``. ``finish_and_backfill``:
the ``timeout`` row is written at once (:meth:`_deadline_passed_running`), and the
request goes on generating as *late work*: it leaves its pool's quota and, to the
estimator, looks like a request aborted at its deadline, but it keeps its engine
slot (it counts in ``max_in_flight``) until an on-time request needs that slot;
then the dispatcher aborts it first (:meth:`_make_room`). Late work that completes
gets one more row, ``ok`` with ``late`` true (:meth:`_finish_late`); late work that
is aborted (for a slot, by the drain, or by shutdown) or fails gets none.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.acks import Ack, Refusal
from sidecar.admission import Admission, Decisions, GateState
from sidecar.config import SchedulerConfig
from sidecar.contract import FinishReason, Priority, Status, now_ms
from sidecar.dispatch_order import DispatchOrder
from sidecar.engine_slots import EngineSlots, mean_batch
from sidecar.engines import Engine, EngineRequest
from sidecar.estimator import ServiceRateEstimator
from sidecar.exceptions import EngineDeadError
from sidecar.lifecycle import Lifecycle
from sidecar.load_control import LoadControl
from sidecar.pools import Pool, Running, slot_free_by
from sidecar.request_state import RequestStatus, ResultRecord, SidecarRequest
from sidecar.scale_signal import ScaleSignal, scale_signal
from sidecar.stats import Admissions, PoolSnapshot, SchedulerCounters, SchedulerStats
from sidecar.timers import DeadlineTimers
from sidecar.waiters import Waiters

if TYPE_CHECKING:
    from sidecar.result_channels import ResultChannel
    from sidecar.tracing import SidecarTracer

logger = logging.getLogger(__name__)


#: A running request's own decode speed is first compared with its deadline at this many
#: output tokens (two token intervals measured), then every
#: :data:`SCHEDULE_CHECK_EVERY` tokens.
SCHEDULE_CHECK_FIRST = 3
SCHEDULE_CHECK_EVERY = 4


@dataclass(slots=True)
class _Run:
    """One run of a request in the engine: its outcome so far and its timings
    (``time.monotonic()``; areas are
    :meth:`~sidecar.engine_slots.EngineSlots.area` readings)."""

    started: float
    area_at_start: float
    status: RequestStatus = RequestStatus.FINISHED_ERROR
    finish_reason: FinishReason = FinishReason.ERROR
    first_token_at: float | None = None
    last_token_at: float | None = None
    area_at_first: float = 0.0
    preempted: bool = False
    """Cancelled for a preemption: it goes back to its queue, no row."""
    check_at: int = SCHEDULE_CHECK_FIRST
    """Output tokens at which :meth:`Scheduler._keep_on_schedule` looks at it next."""


def _uncancel_current() -> int:
    """Withdraw one cancel request of the current task; the ones left."""
    task = asyncio.current_task()
    return task.uncancel() if task is not None else 0

class Scheduler:
    """Priority queues in front of an :class:`Engine`.

    Args:
        engine: A started engine.
        emit: Called once with each terminal :class:`ResultRecord`.
        config: Limits.
        sidecar_id: Written into every result.
        log_requests: Log each admission and finish.
        results: The result channel behind ``emit``, when admission should check that
            it has room for each request's row (a bounded channel: Kafka).
    """

    def __init__(self, engine: Engine, emit: Callable[[ResultRecord], None],
                 config: SchedulerConfig, sidecar_id: str, *, log_requests: bool = False,
                 results: ResultChannel | None = None) -> None:
        self.engine = engine
        if engine.batches > 1 and config.preemption.shrink_batch:
            logger.warning("The engine decodes %d independent batches; the batch-size lever "
                           "(preemption.shrink_batch) is off.", engine.batches)
            config = dataclasses.replace(config, preemption=dataclasses.replace(
                config.preemption, shrink_batch=False))
        self.config = config
        self.sidecar_id = sidecar_id
        self.log_requests = log_requests
        self._emit = emit
        self.pools = {p: Pool(p, config.pools[str(p)]) for p in Priority}
        self.estimator = ServiceRateEstimator()
        self.slots = EngineSlots()
        self.load = LoadControl(config, self.pools, self.estimator,
                                in_flight=lambda: self.slots.count,
                                late=lambda: len(self.slots.late))
        self.order = DispatchOrder(self.pools, self.load)
        self._timers = DeadlineTimers()
        """Every deadline of a queued or running request, behind one loop timer."""
        self._preemptions: dict[str, int] = {}
        """Times each request still alive was preempted."""
        self.waiters = Waiters()
        self._wake = asyncio.Event()
        self._dispatcher: asyncio.Task[None] | None = None
        self.lifecycle = Lifecycle()
        self.counters = SchedulerCounters()
        self.tracer: SidecarTracer | None = None
        """Notes dispatch times of traced requests (``None``: tracing off)."""
        self.results = results
        self.admission = Admission(config, engine=engine, load=self.load,
                                   counters=self.counters, results=results)

    @property
    def engine_error(self) -> str | None:
        """Why the engine can no longer serve (``None`` while it is healthy)."""
        return self.lifecycle.engine_error

    @property
    def engine_dead(self) -> asyncio.Event:
        """Set once the engine failed: the server turns ``NOT_SERVING`` and exits."""
        return self.lifecycle.engine_dead

    @property
    def draining(self) -> bool:
        """Whether the sidecar drains for shutdown (new requests are refused)."""
        return self.lifecycle.draining

    # ------------------------------------------------------------------ start and intake

    def start(self) -> None:
        """Start the dispatch loop and the engine's watchdog (inside the event loop)."""
        if self._dispatcher is None and self.engine_error is None:
            self._dispatcher = asyncio.create_task(self._dispatch_loop(), name="dispatch")
        self.lifecycle.watch(self.engine, self.config.engine_check_interval_s,
                             self.engine_failed)

    def submit_batch(self, requests: list[SidecarRequest]) -> list[Ack]:
        """Admit or refuse each request; one ack each, in order. Never waits.

        :class:`~sidecar.admission.Admission` decides on the batch from one
        :class:`~sidecar.admission.GateState` of this scheduler; here the decisions are
        applied: refusals end their requests (one row each), accepted requests join their
        pools' queues, then the queue watermarks shed what they must."""
        self.lifecycle.check(self.engine, self.engine_failed)
        decisions = Decisions()
        try:
            self.admission.decide(requests, GateState(self.engine_error, self.draining,
                                                      self._outstanding()), decisions)
        finally:  # what was decided (and remembered for replays) is applied, even then
            for req, refusal in decisions.refused:
                self._shed(req, refusal)
            for req, wait_s in decisions.accepted:
                self._enqueue(req, wait_s)
            self._shed_over_watermarks()
            self._count_demand(decisions.accepted, decisions.refused)
        return decisions.acks

    def _count_demand(self, accepted: list[tuple[SidecarRequest, float]],
                      refused: list[tuple[SidecarRequest, Refusal]]) -> None:
        """The batch's arrivals, per pool, for the scale signal: their expected output
        tokens, how many, how many refused."""
        per_pool: dict[Priority, list[float]] = {}
        for pairs, was_refused in ((accepted, 0), (refused, 1)):
            for req, _ in pairs:
                if req.priority is None:
                    continue
                entry = per_pool.setdefault(req.priority, [0.0, 0, 0])
                entry[0] += self.estimator.expected_output_tokens(req.priority,
                                                                  max(req.max_tokens, 0))
                entry[1] += 1
                entry[2] += was_refused
        for priority, (tokens, n, n_refused) in per_pool.items():
            self.counters.demand.arrived(priority, tokens=tokens, requests=int(n),
                                         refused=int(n_refused))

    def _outstanding(self) -> int:
        """Rows that queued and running requests (late work included) will still write."""
        return self.load.total_queued() + self.slots.count

    async def generate(self, req: SidecarRequest) -> ResultRecord | Ack:
        """Admit one request and wait for its terminal result (the blocking baseline
        path). Returns the :class:`Ack` instead when no result will come for it
        (a duplicate or a request without ``request_id``)."""
        fresh = bool(req.request_id) and req.request_id not in self.waiters
        waiter = self.waiters.result_of(req.request_id) if fresh else None
        ack = self.submit_batch([req])[0]
        if waiter is None or ack.duplicate or (not waiter.done() and not ack.accepted):
            if fresh:
                self.waiters.forget(req.request_id)
            return ack
        try:
            return await waiter
        except asyncio.CancelledError:
            self.cancel(req, "caller cancelled the blocking call")
            raise

    def cancel(self, req: SidecarRequest, why: str) -> None:
        """Abort one request wherever it is (its result row says ``error``/``abort``)."""
        self.waiters.forget(req.request_id)
        if req.status is RequestStatus.QUEUED:
            self._leave_queue(req)
            req.error = why
            self._finish(req, RequestStatus.FINISHED_ABORTED, FinishReason.ABORT)
        elif task := self.slots.tasks.get(req.request_id):
            req.error = why
            task.cancel()

    def _shed_over_watermarks(self) -> None:
        """Shed the queued requests :meth:`LoadControl.watermark_victims` picks."""
        if not self.load.over_any_queue_watermark():
            return
        for victim, refusal in self.load.watermark_victims():
            assert victim.priority is not None
            self.pools[victim.priority].queue.pop()
            self._leave_queue(victim)
            self._shed(victim, refusal)

    def _shed(self, req: SidecarRequest, refusal: Refusal, *, queued: bool = False) -> None:
        """Terminal refusal of a request (at admission, or from the queue: ``queued``)."""
        self.counters.refused(refusal.reason)
        self.load.note_refused(req, refusal.reason, queued=queued)
        req.error = refusal.detail
        req.reason = refusal.reason
        shed = refusal.reason.status is Status.SHED
        self._finish(req, RequestStatus.refused(refusal.reason),
                     FinishReason.SHED if shed else FinishReason.REJECTED)

    def _enqueue(self, req: SidecarRequest, estimated_wait_s: float) -> None:
        """An admitted request joins its pool's queue (the admission pipeline's last
        step); ``estimated_wait_s`` is logged against its actual wait."""
        assert req.priority is not None
        pool = self.pools[req.priority]
        self.counters.accepted += 1
        req.status = RequestStatus.QUEUED
        pool.push(req)
        delay_deadline = (req.deadline_ts - now_ms()) / 1000.0
        delay_queue = pool.config.max_queue_delay_ms / 1000.0
        pool.timers[req.request_id] = self._timers.call_later(
            min(delay_deadline, delay_queue), self._expire_queued, req,
            delay_deadline <= delay_queue)
        self._wake.set()
        if self.log_requests:
            logger.info("Admitted request %s (%s).", req.request_id, req.priority)
        self.counters.wait_estimated(req.request_id, estimated_wait_s, time.monotonic())

    def _leave_queue(self, req: SidecarRequest) -> None:
        """Bookkeeping of a request that stops being queued (the deque drops it lazily)."""
        assert req.priority is not None
        if timer := self.pools[req.priority].leave(req):
            self._timers.cancel(timer)

    def _expire_queued(self, req: SidecarRequest, deadline: bool) -> None:
        """Still queued at its deadline (``timeout``, without engine work) or after the
        pool's ``max_queue_delay_ms``: then shed (``queue_delay_exceeded``) unless its
        deadline still leaves room for the rest of its wait and its measured service
        time (:meth:`LoadControl.queue_delay_refusal`); such a request waits on, until
        it starts, its deadline passes, or at the head of its queue it can no longer
        finish (``deadline_infeasible``)."""
        assert req.priority is not None
        self.pools[req.priority].timers.pop(req.request_id, None)
        if req.status is not RequestStatus.QUEUED:
            return
        if deadline:
            self._leave_queue(req)
            self.load.note_timed_out_queued(req)
            req.error = "deadline passed while queued"
            self._finish(req, RequestStatus.FINISHED_EXPIRED, FinishReason.TIMEOUT)
            return
        ahead = self.pools[req.priority].position(req)
        wait_s = self.load.evidence_wait_s(self.load.estimate_wait_s(req, ahead))
        if refusal := self.load.queue_delay_refusal(req, wait_s, queued=True, ahead=ahead):
            self._leave_queue(req)
            self._shed(req, refusal, queued=True)
        else:  # only its deadline ends its wait now
            self.pools[req.priority].timers[req.request_id] = self._timers.call_later(
                (req.deadline_ts - now_ms()) / 1000.0, self._expire_queued, req, True)

    # ------------------------------------------------------------------ dispatch

    def _start_run(self, pool: Pool) -> None:
        """Start the following heads of ``pool`` while it was the only pool that could
        start one (nothing in this loop makes another pool eligible: no request arrives,
        and starts only take room), exactly as repeated
        :meth:`~sidecar.dispatch_order.DispatchOrder.next_request` calls would, without
        looking at the other pools for each request."""
        # At most max_in_flight; lower while a higher pool's running request holds work
        # back, which no start of this pool changes.
        limit = self.load.batch_limit(pool.priority)
        while self.slots.count < limit:
            req = pool.head()
            if req is None or not pool.has_room_for(req):
                return
            self._take_and_start(pool, req)

    def _take_and_start(self, pool: Pool, req: SidecarRequest) -> bool:
        """Take ``req`` (its pool's head) off the queue and start it, or shed it when
        its deadline can no longer be met; ``True`` when it started."""
        pool.queue.popleft()
        self._leave_queue(req)
        if refusal := self.load.infeasible_now(req):
            self._shed(req, refusal, queued=True)
            return False
        self._start(req)
        return True

    async def _dispatch_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.slots.count < self.config.max_in_flight or self._make_room():
                req = self.order.next_request(self.slots.count)
                if req is None:
                    break
                assert req.priority is not None
                pool = self.pools[req.priority]
                if self._take_and_start(pool, req) and self.order.sole_pool is pool:
                    self._start_run(pool)
            self._preempt_for_waiting()
            self._update_idle()

    def _start(self, req: SidecarRequest) -> None:
        """Hand a request that left its queue to the engine (one serving task)."""
        assert req.priority is not None
        pool = self.pools[req.priority]
        now = time.monotonic()
        rid = req.request_id
        target = self.load.target_batch(req)
        batch = target or min(self.slots.count + 1, self.config.max_in_flight)
        service_s = self.estimator.service_s(req.priority, max_tokens=req.max_tokens,
                                             batch=batch)
        ends = slot_free_by(now, service_s, (req.deadline_ts - now_ms()) / 1000.0)
        pool.started(req, Running(req, now, ends,
                                  self._preemptions.get(rid, 0) if self._preemptions else 0,
                                  target))
        if target is not None:  # it needs a small batch: make room now, late work first
            self._shrink_batch(req, self.slots.count + 1 - target,
                               "a request that needs a small batch started")
        self.slots.area(now)
        self.slots.count += 1
        if self.tracer is not None:
            self.tracer.dispatched(req)
        self.estimator.observe_dispatch(req.priority)
        req.status = RequestStatus.RUNNING
        waited = self.counters.wait_started(rid, req.priority, now)
        if waited is not None and self.log_requests:
            logger.info("Queue wait of %s (%s): estimated %.1f ms, actual %.1f ms.",
                        rid, req.priority, waited[0] * 1000, waited[1] * 1000)
        # Unnamed: naming a task (an f-string and ``set_name``) costs as much as a
        # tenth of creating it.
        self.slots.tasks[rid] = asyncio.get_running_loop().create_task(self._serve(req))

    def _shrink_batch(self, req: SidecarRequest, excess: int, why: str) -> None:
        """Make room for ``req``, which needs a smaller batch: ``excess`` sequences leave
        the engine, late work first, then lower work preempted (:meth:`LoadControl.victims`)."""
        assert req.priority is not None
        for late in self.slots.late_victims()[:max(excess, 0)]:
            self._abort_late(late, why)
            excess -= 1
        for victim in self.load.victims(req.priority)[:max(excess, 0)]:
            self._preempt(victim)

    def _keep_on_schedule(self, req: SidecarRequest, run: _Run) -> None:
        """A running request whose own decode speed so far says it misses its deadline in
        the batch it runs in gets a smaller one (:meth:`LoadControl.catch_up_batch`): at
        first lower work is held back (no lower request starts, so the batch shrinks as
        running ones end and no work is thrown away); still behind at its next check,
        lower work is preempted down to it, as for a request that needs a small batch at
        its start. A start is planned with medians of other requests' speeds; this
        corrects one that turned out slower (a CPU engine beside other work, arrivals'
        prefills between its decode steps)."""
        assert req.priority is not None and run.first_token_at is not None
        pool = self.pools[req.priority]
        running = pool.running.get(req.request_id)
        if running is None or req.late or run.last_token_at is None:
            return
        now = time.monotonic()
        tpot_s = (run.last_token_at - run.first_token_at) / (req.output_tokens - 1)
        ran_in = mean_batch(run.area_at_first, self.slots.area(now), now - run.first_token_at)
        target = self.load.catch_up_batch(req, tpot_s, ran_in or float(self.slots.count))
        if target is None:
            self._note_slowed(req, tpot_s)
            return
        held = running.target_batch
        if held is not None:
            target = min(target, held)
        running.target_batch = pool.holding[req.request_id] = target
        self.counters.catch_ups += 1
        if self.log_requests:
            logger.info("Request %s (%s) falls behind its deadline at %.0f ms per token: "
                        "lower work %s down to a batch of %d.", req.request_id, req.priority,
                        tpot_s * 1000, "held back" if held is None else "preempted", target)
        if held is not None:  # held back since its last check and still behind
            self._shrink_batch(req, self.slots.count - target,
                               "a running request fell behind its deadline")

    def _note_slowed(self, req: SidecarRequest, tpot_s: float) -> None:
        """Narrow the intake windows below ``req``'s priority when, decoding at
        ``tpot_s`` per token, it misses its deadline only because of the work starting
        beside it (``preemption.hold_lower``, :mod:`sidecar.intake_window`)."""
        assert req.priority is not None
        if req.priority is Priority.LOW or not self.load.slowed_by_others(req, tpot_s):
            return
        before = self.load.windows.decreases
        self.load.windows.slowed(req.priority)
        if self.load.windows.decreases > before:
            self.counters.catch_ups += 1
            if self.log_requests:
                logger.info("Request %s (%s) falls behind its deadline at %.0f ms per "
                            "token: fewer lower requests start (windows %s).",
                            req.request_id, req.priority, tpot_s * 1000,
                            {str(p): self.load.windows.limit(p) for p in Priority})

    # ------------------------------------------------------------------ preemption

    def _preempt_for_waiting(self) -> None:
        """Preempt lower work for queue heads that cannot start: at once for the
        priorities in ``preemption.immediate``, else when the head's deadline is at risk."""
        if not self.config.preemption.enabled:
            return
        for priority in (Priority.HIGH, Priority.NORMAL):
            pool = self.pools[priority]
            head = pool.head()
            if head is None or self.load.slot_free(head):
                continue
            if not pool.has_room_for(head) or self.load.windows.limit(priority) < \
                    self.config.max_in_flight:
                continue  # its own pool's limit or its narrowed window blocks it
            waiting = pool.queued if self.load.preempts_at_once(priority) else \
                self._at_risk(pool)
            need = waiting - self.order.owed[priority]
            for victim in self.load.victims(priority):
                if need <= 0:
                    break
                if victim.req.request_id in self.slots.preempting:
                    continue
                if self._preempt(victim):
                    self.order.owed[priority] += 1
                    need -= 1

    def _at_risk(self, pool: Pool) -> int:
        """1 when the head of ``pool`` would miss its deadline waiting for a slot, else 0."""
        head = pool.head()
        if head is None or not self.estimator.warm:
            return 0
        wait_s = self.load.natural_wait_s(head)
        return int(self.load.fit_batch(head, wait_s) is None)

    def _preempt(self, victim: Running) -> bool:
        """Abort a running request in the engine; :meth:`_serve` requeues it."""
        rid = victim.req.request_id
        task = self.slots.tasks.get(rid)
        if task is None or rid in self.slots.preempting or not task.cancel():
            return False
        self.slots.preempting.add(rid)
        self._preemptions[rid] = self._preemptions.get(rid, 0) + 1
        self.counters.preemptions += 1
        if self.log_requests:
            logger.info("Preempted request %s (%s), %d time(s).", rid, victim.req.priority,
                        self._preemptions[rid])
        return True

    def _requeue(self, req: SidecarRequest) -> None:
        """A preempted request goes back to the front of its pool's queue, with its
        deadline; its partial output is dropped and it starts from scratch later."""
        assert req.priority is not None
        if self.engine_error is not None:
            req.error = f"preempted, then the engine died: {self.engine_error}"
            self._finish(req, RequestStatus.FINISHED_ERROR, FinishReason.ERROR)
            return
        if self._dispatcher is None:  # shutting down: nothing will start it again
            req.error = "preempted, then aborted by sidecar shutdown"
            self._finish(req, RequestStatus.FINISHED_ABORTED, FinishReason.ABORT)
            return
        req.status = RequestStatus.QUEUED
        req.text, req.output_tokens, req.cached_tokens = "", 0, 0
        req.first_token_ts = None
        req.error = None
        self.pools[req.priority].push_front(req)
        delay_s = (req.deadline_ts - now_ms()) / 1000.0
        self.pools[req.priority].timers[req.request_id] = self._timers.call_later(
            delay_s, self._expire_queued, req, True)
        self.counters.wait_ended(req.request_id)

    async def _serve(self, req: SidecarRequest) -> None:
        """The serving task of a running request: consume the engine's stream under the
        request's deadline, then end the run (:meth:`_served`)."""
        assert req.priority is not None
        pool = self.pools[req.priority]
        if running := pool.running.get(req.request_id):
            running.live = True
        deadline_timer = self._timers.call_later(
            (req.deadline_ts - now_ms()) / 1000.0, self._deadline_passed_running
            if pool.config.on_deadline == "finish_and_backfill" else self._deadline_abort, req)
        started = time.monotonic()
        run = _Run(started, self.slots.area(started))
        try:
            await self._generate(req, run)
        except asyncio.CancelledError:
            if self._cancelled(req, run):
                raise
        except EngineDeadError as e:
            req.error = f"engine died: {e}"
            logger.error("Engine died while serving %s: %s", req.request_id, e)
            self.engine_failed(str(e))
        except Exception as e:  # one request's failure is data, not a crash
            req.error = f"{type(e).__name__}: {e}"
            logger.exception("Request %s failed in the engine.", req.request_id)
        finally:
            self._timers.cancel(deadline_timer)
            self._served(req, pool, run)

    async def _generate(self, req: SidecarRequest, run: _Run) -> None:
        """Consume the engine's stream of ``req``: text and tokens into ``req``, the
        outcome and token times into ``run``."""
        assert req.priority is not None
        engine_req = EngineRequest(req.request_id, req.prompt_token_ids, req.max_tokens,
                                   req.temperature, req.seed, int(req.priority))
        async for progress in self.engine.generate(engine_req):
            if progress.output_tokens > req.output_tokens:
                run.last_token_at = time.monotonic()
                if run.first_token_at is None:
                    run.first_token_at = run.last_token_at
                    run.area_at_first = self.slots.area(run.last_token_at)
                    req.first_token_ts = now_ms()
                    if self.config.preemption.hold_lower:
                        # Its prompt waited behind others': will the rest come in time?
                        self._note_slowed(req, self.estimator.tpot_s(req.priority,
                                                                     self.slots.count))
            req.text = progress.text
            req.output_tokens = progress.output_tokens
            if req.output_tokens >= run.check_at and not progress.finished:
                run.check_at = req.output_tokens + SCHEDULE_CHECK_EVERY
                self._keep_on_schedule(req, run)
            if progress.cached_tokens > req.cached_tokens:
                req.cached_tokens = progress.cached_tokens
            if progress.finished:
                run.finish_reason = progress.finish_reason or FinishReason.STOP
                run.status = (RequestStatus.FINISHED_LENGTH
                              if run.finish_reason is FinishReason.LENGTH
                              else RequestStatus.FINISHED_OK)
        if run.status is RequestStatus.FINISHED_ERROR:
            req.error = "engine stream ended without a final output"

    def _cancelled(self, req: SidecarRequest, run: _Run) -> bool:
        """Record why the serving task of ``req`` was cancelled: a preemption (it goes
        back to its queue), the engine's death (an error row), its deadline (``timeout``)
        or a shutdown (``abort``). Returns whether the cancel must propagate (it was
        someone else's too)."""
        rid = req.request_id
        if rid in self.slots.preempting and run.status is RequestStatus.FINISHED_ERROR:
            run.preempted = True  # requeued by _served; the cancel was ours
            return False
        if self.engine_error is not None:
            # engine_failed cancelled it: one error row, not an abort.
            req.error = f"engine died: {self.engine_error}"
            return _uncancel_current() > 0  # cancelled by someone else too (shutdown)
        if rid in self.slots.expiring and _uncancel_current() == 0:
            # Our deadline cancel and nobody else's (asyncio.timeout's rule).
            run.status, run.finish_reason = RequestStatus.FINISHED_EXPIRED, FinishReason.TIMEOUT
            req.error = f"deadline passed after {req.output_tokens} output tokens; aborted"
            return False
        run.status, run.finish_reason = RequestStatus.FINISHED_ABORTED, FinishReason.ABORT
        req.error = req.error or "aborted by sidecar shutdown"
        return True

    def _served(self, req: SidecarRequest, pool: Pool, run: _Run) -> None:
        """A run left the engine: free its slot, teach the estimator, and end it (its
        terminal row, its late row, or back to its queue after a preemption)."""
        rid = req.request_id
        area_at_last = self.slots.area()
        late = self.slots.late.pop(rid, None) if self.slots.late else None
        if not req.late:  # late work left its pool at the deadline
            pool.stopped(req)
        if not req.late or late is not None:  # _abort_late freed the slot already
            self.slots.count -= 1
        self.slots.tasks.pop(rid, None)
        self.slots.preempting.discard(rid)
        self.slots.expiring.discard(rid)
        if run.preempted:
            self._requeue(req)
        else:
            self.counters.prompt_tokens_total += req.prompt_tokens
            self.counters.cached_tokens_total += req.cached_tokens
            if run.first_token_at is not None:
                self._observe_run(req, run, area_at_last)
            if not req.late:
                self._finish(req, run.status, run.finish_reason)
            elif late is not None:
                self._end_late_work(req, run.status, run.finish_reason, tokens_counted=late[1])
        self._wake.set()
        self._update_idle()

    def _observe_run(self, req: SidecarRequest, run: _Run, area_at_last: float) -> None:
        """Teach the estimator a run's TTFT, TPOT and the batches it ran in."""
        assert req.priority is not None and run.first_token_at is not None
        first, last = run.first_token_at, run.last_token_at
        completed = (run.status in (RequestStatus.FINISHED_OK, RequestStatus.FINISHED_LENGTH)
                     and not req.late)  # to the estimator, late work was aborted
        tpot = ((last - first) / (req.output_tokens - 1)
                if last is not None and req.output_tokens > 1 else None)
        self.estimator.observe_finish(
            req.priority, ttft_s=first - run.started, tpot_s=tpot,
            output_tokens=req.output_tokens if completed else 0, max_tokens=req.max_tokens,
            ttft_batch=mean_batch(run.area_at_start, run.area_at_first,
                                        first - run.started),
            batch=mean_batch(run.area_at_first, area_at_last,
                                   last - first if last is not None else 0.0))

    def _deadline_abort(self, req: SidecarRequest) -> None:
        """The deadline of a running request of an ``abort`` pool: cancel its serving
        task, which aborts it in the engine and ends it ``timeout``."""
        if req.status is not RequestStatus.RUNNING:
            return
        if (task := self.slots.tasks.get(req.request_id)) is not None and task.cancel():
            self.slots.expiring.add(req.request_id)

    # ------------------------------------------------------------------ late work

    def _deadline_passed_running(self, req: SidecarRequest) -> None:
        """The deadline of a running request of a ``finish_and_backfill`` pool: write
        its ``timeout`` row now and keep generating as late work (while draining,
        abort it instead)."""
        if req.status is not RequestStatus.RUNNING:
            return
        assert req.priority is not None
        if self.draining:
            req.error = (f"deadline passed after {req.output_tokens} output tokens; "
                         "aborted (draining)")
            self._finish(req, RequestStatus.FINISHED_EXPIRED, FinishReason.TIMEOUT)
            if task := self.slots.tasks.get(req.request_id):
                task.cancel()
            return
        req.error = (f"deadline passed after {req.output_tokens} output tokens; generation "
                     "continues for a late result")
        self._finish(req, RequestStatus.FINISHED_EXPIRED, FinishReason.TIMEOUT)
        req.late = True
        self.pools[req.priority].stopped(req)
        self.slots.late[req.request_id] = (req, req.output_tokens)
        if self.log_requests:
            logger.info("Request %s passed its deadline; continuing as late work.",
                        req.request_id)
        self._wake.set()  # its pool's quota is free for on-time work

    def _make_room(self) -> bool:
        """The engine is full: abort one late request if an on-time one is waiting for
        a slot (lowest priority first, then the most overdue). Returns whether a slot
        was freed."""
        if not self.slots.late:
            return False
        if not any((head := pool.head()) is not None and pool.has_room_for(head)
                   for pool in self.pools.values()):
            return False
        self._abort_late(self.slots.late_victims()[0], "an on-time request needed its engine slot")
        return True

    def _late_victims(self) -> list[SidecarRequest]:
        """Late work in the order it gives way: lowest priority first, then the most
        overdue."""
        return sorted((r for r, _ in self.slots.late.values()),
                      key=lambda r: (-int(r.priority or 0), r.deadline_ts))

    def _abort_late(self, req: SidecarRequest, why: str) -> None:
        """Abort late work now: its slot is free at once, and it gets no late row."""
        if self.slots.late.pop(req.request_id, None) is None:
            return
        self.slots.count -= 1
        self.counters.late_aborted += 1
        logger.info("Aborted late work %s (%s); it gets no late result.", req.request_id, why)
        if task := self.slots.tasks.get(req.request_id):
            task.cancel()
        self._update_idle()

    def _end_late_work(self, req: SidecarRequest, status: RequestStatus,
                       finish_reason: FinishReason, *, tokens_counted: int) -> None:
        """Late work left the engine by itself: completed (one late row) or not (none)."""
        if status in (RequestStatus.FINISHED_OK, RequestStatus.FINISHED_LENGTH):
            self._finish_late(req, finish_reason, tokens_counted=tokens_counted)
        else:
            self.counters.late_aborted += 1
            logger.info("Late work %s ended without a late result: %s.",
                        req.request_id, req.error)
        self._update_idle()

    def _finish_late(self, req: SidecarRequest, finish_reason: FinishReason, *,
                     tokens_counted: int) -> None:
        """Emit the one late ``ok`` row of a request whose terminal row was ``timeout``;
        it is counted as a late result, never as a terminal one."""
        req.finish_reason = finish_reason
        req.finish_ts = now_ms()
        record = ResultRecord.late_from_request(req, self.sidecar_id)
        self.counters.late_finished(record, tokens_counted=tokens_counted)
        if self.log_requests:
            logger.info("Late result for request %s.", req.request_id)
        self._emit(record)

    # ------------------------------------------------------------------ results

    def _finish(self, req: SidecarRequest, status: RequestStatus,
                finish_reason: FinishReason) -> None:
        """The only place a request becomes terminal; a second call is ignored."""
        if req.status > RequestStatus.RUNNING:  # is_finished(), inlined: once per request
            return
        rid = req.request_id
        if self._preemptions:
            self._preemptions.pop(rid, None)
        self.counters.wait_ended(rid)
        req.status = status
        req.finish_reason = finish_reason
        req.finish_ts = now_ms()
        priority = req.priority
        pool = self.pools[priority or Priority.NORMAL]
        req.fallback_text = pool.config.fallback_text
        record = ResultRecord.from_request(req, self.sidecar_id)
        self.counters.finished(record)
        if priority is not None:
            pool.results_by_status[record.status] += 1
            if record.status == "shed":
                pool.shed_by_reason[record.reason] += 1
            elif record.status == "ok" and record.finish_ts <= req.deadline_ts:
                pool.met_deadline += 1
                self.load.windows.on_time(priority)
        if self.log_requests:
            logger.info("Finished request %s: %s.", rid, record.status)
        self._emit(record)
        self.waiters.finished(record)
        self._update_idle()

    def idle(self) -> bool:
        """Nothing queued and nothing in the engine (late work included)."""
        return not self.slots.count and not self.load.total_queued()

    async def wait_idle(self) -> None:
        """Return once :meth:`idle` holds (at once when it does already)."""
        if self.idle():
            return
        await self.waiters.idle_future()

    def _update_idle(self) -> None:
        if self.waiters.waiting_for_idle() and self.idle():
            self.waiters.idle()

    # ------------------------------------------------------------------ lifecycle

    def engine_failed(self, why: str) -> None:
        """The engine can no longer serve: refuse new work (``engine_unavailable``),
        end every queued and running request ``error`` (one row each), drop late work
        (no late row) and set :attr:`engine_dead`. Idempotent."""
        if self.engine_error is not None:
            return
        self.lifecycle.engine_error = why or "engine failed"
        logger.error("Engine failed (%s): refusing new requests, failing %d running and "
                     "%d queued.", self.engine_error, len(self.slots.tasks),
                     self.load.total_queued())
        self.engine_dead.set()
        if task := self._dispatcher:
            self._dispatcher = None
            task.cancel()
        for req, _ in list(self.slots.late.values()):
            self._abort_late(req, "the engine died")
        for pool in self.pools.values():
            while pool.queue:
                req = pool.queue.popleft()
                if req.status is RequestStatus.QUEUED:
                    self._leave_queue(req)
                    req.error = f"engine died while queued: {self.engine_error}"
                    self._finish(req, RequestStatus.FINISHED_ERROR, FinishReason.ERROR)
        current = asyncio.current_task()
        for task in list(self.slots.tasks.values()):
            if task is not current:
                task.cancel()
        self._update_idle()

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests, let queued and running ones finish (or hit their
        deadlines) for up to ``timeout_s``, then abort what is left."""
        self.lifecycle.draining = True
        for req, _ in list(self.slots.late.values()):
            self._abort_late(req, "sidecar is draining")
        try:
            async with asyncio.timeout(timeout_s):
                await self.wait_idle()
        except TimeoutError:
            logger.warning("Drain timed out after %.1fs; aborting %d running and %d queued.",
                           timeout_s, len(self.slots.tasks), self.load.total_queued())
        await self.abort_all()

    async def abort_all(self) -> None:
        """Abort every queued and running request (each gets an ``error`` result)."""
        if (task := self._dispatcher) is not None:
            self._dispatcher = None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self.lifecycle.stop_watching()
        for pool in self.pools.values():
            while pool.queue:
                req = pool.queue.popleft()
                if req.status is RequestStatus.QUEUED:
                    self._leave_queue(req)
                    req.error = "aborted by sidecar shutdown"
                    self._finish(req, RequestStatus.FINISHED_ABORTED, FinishReason.ABORT)
        tasks = list(self.slots.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _pool_snapshot(self, pool: Pool) -> PoolSnapshot:
        cfg = pool.config
        probe_tokens = max(1, round(self.estimator.expected_output_tokens(pool.priority, 64)))
        probe = SidecarRequest(request_id="", trace_id="", priority=pool.priority, enqueue_ts=0,
                               deadline_ts=0, model="", prompt="", max_tokens=probe_tokens,
                               temperature=0.0)
        return PoolSnapshot(
            queued=pool.queued,
            in_flight=pool.in_flight,
            tokens_in_flight=pool.tokens_in_flight,
            max_queued=cfg.max_queued,
            max_in_flight=cfg.max_in_flight,
            max_tokens_in_flight=cfg.max_tokens_in_flight,
            max_queue_delay_ms=cfg.max_queue_delay_ms,
            estimated_queue_wait_s=self.load.estimate_wait_s(probe),
            ttft_s=self.estimator.ttft_s(pool.priority),
            tpot_s=self.estimator.tpot_s(pool.priority),
            shed_by_reason=dict(pool.shed_by_reason),
            results_by_status=dict(pool.results_by_status),
            met_deadline=pool.met_deadline,
        )

    def stats(self) -> SchedulerStats:
        c = self.counters
        return SchedulerStats(
            pools={p: self._pool_snapshot(pool) for p, pool in self.pools.items()},
            engine=self.engine.stats(),
            admissions=Admissions(c.submitted, c.accepted, c.duplicates, c.id_conflicts),
            results_by_status=dict(c.results_by_status),
            refusals_by_reason={k: v for k, v in c.refusals_by_reason.items() if v},
            output_tokens_per_s=c.output_tokens_per_s(),
            prompt_tokens_total=c.prompt_tokens_total,
            cached_tokens_total=c.cached_tokens_total,
            draining=self.draining,
            late_results=c.late_results,
            late_aborted=c.late_aborted,
            late_in_flight=len(self.slots.late),
            preemptions=c.preemptions,
            batch_catch_ups=c.catch_ups,
            wait_error_s=c.wait_error_summary(),
            result_channel=self.results.stats() if self.results is not None else None,
            calibration=self.estimator.calibration,
            scale=self._scale_signal(),
        )

    def _scale_signal(self) -> ScaleSignal:
        """Demand against capacity now (:mod:`sidecar.scale_signal`)."""
        est = self.estimator
        backlog = sum(est.expected_output_tokens(p, r.max_tokens) for p, pool in self.pools.items()
                      for r in pool.queue if r.status is RequestStatus.QUEUED)
        full = self.config.max_in_flight
        c = self.counters
        return scale_signal(
            c.demand, backlog_tokens=backlog, full_batch=full,
            tpot_at_full_batch_s=est.tpot_s(Priority.NORMAL, full) if est.speed.known else None,
            gpus=self.engine.batches, target_utilisation=self.config.target_utilisation,
            finished=sum(c.results_by_status.values()),
            timeouts=c.results_by_status.get("timeout", 0))
