"""Admission, priority queues, dispatch into the engine and deadline aborts.

One :class:`Scheduler` per sidecar. :meth:`Scheduler.submit_batch` runs in the
gRPC handler: it validates, de-duplicates and enqueues, and returns one
:class:`Ack` per request at once; it never waits for generation. A single
dispatch loop moves queued requests into the engine, highest priority first
(FIFO within a priority), while fewer than ``max_in_flight`` are running. Each
running request is one task that consumes the engine's stream under the
request's deadline; cancelling it aborts the request inside the engine.

Every request with a ``request_id`` ends in exactly one terminal result, written
through :meth:`_finish`, which ignores a second finish of the same request.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.admission import Refusal, check_prompt_tokens, check_static
from sidecar.config import SchedulerConfig
from sidecar.engine import Engine, EngineRequest
from sidecar.exceptions import EngineDeadError
from sidecar.request_state import (
    STATUSES,
    Priority,
    RefusalReason,
    RequestStatus,
    ResultRecord,
    SidecarRequest,
    now_ms,
)

logger = logging.getLogger(__name__)

_TOKEN_RATE_WINDOW_S = 10.0


@dataclass(frozen=True)
class Ack:
    """The admission answer for one request."""

    request_id: str
    accepted: bool
    reason: RefusalReason | None = None
    detail: str = ""
    duplicate: bool = False
    received_ts: int = 0


@dataclass
class SchedulerStats:
    """Live figures (what the Stats RPC and ``/metrics`` report)."""

    queued: dict[Priority, int]
    in_flight: dict[Priority, int]
    submitted: int
    accepted: int
    duplicates: int
    results_by_status: dict[str, int]
    refusals_by_reason: dict[str, int]
    output_tokens_per_s: float
    prompt_tokens_total: int
    cached_tokens_total: int
    draining: bool

    @property
    def prefix_cache_hit_rate(self) -> float:
        if not self.prompt_tokens_total:
            return 0.0
        return self.cached_tokens_total / self.prompt_tokens_total


class Scheduler:
    """Priority queues in front of an :class:`Engine`.

    Args:
        engine: A started engine.
        emit: Called once with each terminal :class:`ResultRecord`.
        config: Limits.
        sidecar_id: Written into every result.
        log_requests: Log each admission and finish.
    """

    def __init__(self, engine: Engine, emit: Callable[[ResultRecord], None],
                 config: SchedulerConfig, sidecar_id: str, *, log_requests: bool = False) -> None:
        self.engine = engine
        self.config = config
        self.sidecar_id = sidecar_id
        self.log_requests = log_requests
        self._emit = emit
        self._queues: dict[Priority, collections.deque[SidecarRequest]] = {
            p: collections.deque() for p in Priority
        }
        self._queued = {p: 0 for p in Priority}
        self._in_flight = {p: 0 for p in Priority}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._deadline_timers: dict[str, asyncio.TimerHandle] = {}
        self._seen: collections.OrderedDict[str, Ack] = collections.OrderedDict()
        self._arrivals = itertools.count()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._dispatcher: asyncio.Task[None] | None = None
        self._token_events: collections.deque[tuple[float, int]] = collections.deque()
        self.draining = False
        self.engine_dead = False
        self.submitted = 0
        self.accepted = 0
        self.duplicates = 0
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self.results_by_status = {s: 0 for s in STATUSES}
        self.refusals_by_reason = {str(r): 0 for r in RefusalReason}

    # ------------------------------------------------------------------ admission

    def start(self) -> None:
        """Start the dispatch loop (inside the event loop)."""
        if self._dispatcher is None:
            self._dispatcher = asyncio.create_task(self._dispatch_loop(), name="dispatch")

    def submit_batch(self, requests: list[SidecarRequest]) -> list[Ack]:
        """Admit or refuse each request; one ack each, in order. Never waits."""
        now = now_ms()
        acks: list[Ack | None] = [None] * len(requests)
        to_encode: list[int] = []
        model_names = frozenset({self.engine.model_name})
        batch_ids: set[str] = set()
        repeats_in_batch: list[int] = []
        for i, req in enumerate(requests):
            self.submitted += 1
            req.received_ts = now
            if not req.request_id:
                self._count_refusal(RefusalReason.MISSING_REQUEST_ID)
                acks[i] = Ack("", False, RefusalReason.MISSING_REQUEST_ID,
                              "request_id is required", received_ts=now)
                continue
            if req.request_id in self._seen or req.request_id in batch_ids:
                self.duplicates += 1
                repeats_in_batch.append(i)
                continue
            batch_ids.add(req.request_id)
            req.model = req.model or self.engine.model_name
            if self.draining:
                acks[i] = self._refuse(req, Refusal(RefusalReason.DRAINING,
                                                    "sidecar is shutting down"))
                continue
            if refusal := check_static(req, self.config, model_names=model_names, now_ms=now):
                acks[i] = self._refuse(req, refusal)
                continue
            to_encode.append(i)
        if to_encode:
            encoded = self.engine.encode_prompt([requests[i].prompt for i in to_encode])
            max_len = getattr(self.engine, "max_model_len", 1 << 30)
            for i, ids in zip(to_encode, encoded):
                req = requests[i]
                req.prompt_token_ids = ids
                if refusal := check_prompt_tokens(req, self.config, max_model_len=max_len):
                    acks[i] = self._refuse(req, refusal)
                elif sum(self._queued.values()) >= self.config.max_queued:
                    acks[i] = self._refuse(req, Refusal(
                        RefusalReason.QUEUE_FULL,
                        f"{self.config.max_queued} requests already queued"))
                else:
                    acks[i] = self._enqueue(req)
        # A replay repeats the first copy's decision (made above if it was in this batch).
        for i in repeats_in_batch:
            rid = requests[i].request_id
            first = self._seen.get(rid) or Ack(rid, True)  # evicted: it was admitted long ago
            acks[i] = Ack(rid, first.accepted, first.reason, first.detail, duplicate=True,
                          received_ts=now)
        return [a for a in acks if a is not None]

    def _remember(self, ack: Ack) -> Ack:
        self._seen[ack.request_id] = ack
        while len(self._seen) > self.config.dedupe_window:
            self._seen.popitem(last=False)
        return ack

    def _count_refusal(self, reason: RefusalReason) -> None:
        self.refusals_by_reason[str(reason)] += 1

    def _refuse(self, req: SidecarRequest, refusal: Refusal) -> Ack:
        self._count_refusal(refusal.reason)
        req.error = refusal.detail
        self._finish(req, refusal.reason.status, finish_reason=refusal.reason.status.external)
        return self._remember(Ack(req.request_id, False, refusal.reason, refusal.detail,
                                  received_ts=req.received_ts))

    def _enqueue(self, req: SidecarRequest) -> Ack:
        assert req.priority is not None
        self.accepted += 1
        req.arrival_seq = next(self._arrivals)
        req.status = RequestStatus.QUEUED
        self._queues[req.priority].append(req)
        self._queued[req.priority] += 1
        loop = asyncio.get_running_loop()
        delay = max(0.0, (req.deadline_ts - now_ms()) / 1000.0)
        self._deadline_timers[req.request_id] = loop.call_later(delay, self._expire_queued, req)
        self._idle.clear()
        self._wake.set()
        if self.log_requests:
            logger.info("Admitted request %s (%s).", req.request_id, req.priority)
        return self._remember(Ack(req.request_id, True, received_ts=req.received_ts))

    def _expire_queued(self, req: SidecarRequest) -> None:
        """Deadline passed while still queued: finish it without engine work."""
        self._deadline_timers.pop(req.request_id, None)
        if req.status is RequestStatus.QUEUED:
            assert req.priority is not None
            self._queued[req.priority] -= 1
            req.error = "deadline passed while queued"
            self._finish(req, RequestStatus.FINISHED_EXPIRED, finish_reason="timeout")

    # ------------------------------------------------------------------ dispatch

    def _next_request(self) -> SidecarRequest | None:
        for priority in Priority:  # HIGH, NORMAL, LOW
            queue = self._queues[priority]
            while queue:
                req = queue.popleft()
                if req.status is RequestStatus.QUEUED:
                    return req
        return None

    async def _dispatch_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while sum(self._in_flight.values()) < self.config.max_in_flight:
                req = self._next_request()
                if req is None:
                    break
                assert req.priority is not None
                self._queued[req.priority] -= 1
                self._in_flight[req.priority] += 1
                if timer := self._deadline_timers.pop(req.request_id, None):
                    timer.cancel()
                req.status = RequestStatus.RUNNING
                self._tasks[req.request_id] = asyncio.create_task(
                    self._serve(req), name=f"serve-{req.request_id}")
            self._update_idle()

    async def _serve(self, req: SidecarRequest) -> None:
        assert req.priority is not None
        engine_req = EngineRequest(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            seed=req.seed,
            priority=int(req.priority),
        )
        remaining_s = (req.deadline_ts - now_ms()) / 1000.0
        status, finish_reason = RequestStatus.FINISHED_ERROR, "error"
        try:
            async with asyncio.timeout(max(remaining_s, 0.0)):
                async for progress in self.engine.generate(engine_req):
                    if req.first_token_ts is None and progress.output_tokens > 0:
                        req.first_token_ts = now_ms()
                    req.text = progress.text
                    req.output_tokens = progress.output_tokens
                    req.cached_tokens = max(req.cached_tokens, progress.cached_tokens)
                    if progress.finished:
                        finish_reason = progress.finish_reason or "stop"
                        status = (RequestStatus.FINISHED_LENGTH if finish_reason == "length"
                                  else RequestStatus.FINISHED_OK)
            if status is RequestStatus.FINISHED_ERROR:
                req.error = "engine stream ended without a final output"
        except TimeoutError:
            status, finish_reason = RequestStatus.FINISHED_EXPIRED, "timeout"
            req.error = f"deadline passed after {req.output_tokens} output tokens; aborted"
        except asyncio.CancelledError:
            status, finish_reason = RequestStatus.FINISHED_ABORTED, "abort"
            req.error = "aborted by sidecar shutdown"
            raise
        except EngineDeadError as e:
            self.engine_dead = True
            req.error = f"engine died: {e}"
            logger.error("Engine died while serving %s: %s", req.request_id, e)
        except Exception as e:  # one request's failure is data, not a crash
            req.error = f"{type(e).__name__}: {e}"
            logger.exception("Request %s failed in the engine.", req.request_id)
        finally:
            self._in_flight[req.priority] -= 1
            self._tasks.pop(req.request_id, None)
            self.prompt_tokens_total += req.prompt_tokens
            self.cached_tokens_total += req.cached_tokens
            self._finish(req, status, finish_reason=finish_reason)
            self._wake.set()

    # ------------------------------------------------------------------ results

    def _finish(self, req: SidecarRequest, status: RequestStatus, *, finish_reason: str) -> None:
        """The only place a request becomes terminal; a second call is ignored."""
        if req.status.is_finished():
            return
        req.status = status
        req.finish_reason = finish_reason
        req.finish_ts = now_ms()
        record = ResultRecord.from_request(req, self.sidecar_id)
        self.results_by_status[record.status] += 1
        if req.output_tokens:
            self._token_events.append((time.monotonic(), req.output_tokens))
        if self.log_requests:
            logger.info("Finished request %s: %s.", req.request_id, record.status)
        self._emit(record)
        self._update_idle()

    def _update_idle(self) -> None:
        if not any(self._queued.values()) and not any(self._in_flight.values()):
            self._idle.set()

    # ------------------------------------------------------------------ lifecycle

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests, let queued and running ones finish (or hit their
        deadlines) for up to ``timeout_s``, then abort what is left."""
        self.draining = True
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            logger.warning("Drain timed out after %.1fs; aborting %d running and %d queued.",
                           timeout_s, len(self._tasks), sum(self._queued.values()))
        await self.abort_all()

    async def abort_all(self) -> None:
        """Abort every queued and running request (each gets an ``error`` result)."""
        if task := self._dispatcher:
            self._dispatcher = None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for priority, queue in self._queues.items():
            while queue:
                req = queue.popleft()
                if req.status is RequestStatus.QUEUED:
                    self._queued[priority] -= 1
                    if timer := self._deadline_timers.pop(req.request_id, None):
                        timer.cancel()
                    req.error = "aborted by sidecar shutdown"
                    self._finish(req, RequestStatus.FINISHED_ABORTED, finish_reason="abort")
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stats(self) -> SchedulerStats:
        cutoff = time.monotonic() - _TOKEN_RATE_WINDOW_S
        while self._token_events and self._token_events[0][0] < cutoff:
            self._token_events.popleft()
        tokens = sum(n for _, n in self._token_events)
        return SchedulerStats(
            queued=dict(self._queued),
            in_flight=dict(self._in_flight),
            submitted=self.submitted,
            accepted=self.accepted,
            duplicates=self.duplicates,
            results_by_status=dict(self.results_by_status),
            refusals_by_reason={k: v for k, v in self.refusals_by_reason.items() if v},
            output_tokens_per_s=tokens / _TOKEN_RATE_WINDOW_S,
            prompt_tokens_total=self.prompt_tokens_total,
            cached_tokens_total=self.cached_tokens_total,
            draining=self.draining,
        )
