"""The scheduler's counters and the snapshots the Stats RPC and ``/metrics`` report."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from sidecar.contract import STATUSES, Priority, RefusalReason
from sidecar.engines import EngineStats
from sidecar.quantiles import percentile
from sidecar.request_state import ResultRecord
from sidecar.result_channels.base import ResultChannelStats
from sidecar.scale_signal import DemandMeter, ScaleSignal

#: Output tokens/s is measured over the requests finished in this many seconds.
TOKEN_RATE_WINDOW_S = 10.0

#: How many recent wait-estimate errors are kept per pool.
WAIT_ERROR_SAMPLES = 10_000


@dataclass(frozen=True)
class PoolSnapshot:
    """Live figures of one pool."""

    queued: int
    in_flight: int
    tokens_in_flight: int
    max_queued: int
    max_in_flight: int
    max_tokens_in_flight: int
    max_queue_delay_ms: int
    estimated_queue_wait_s: float
    ttft_s: float
    tpot_s: float
    shed_by_reason: dict[str, int]
    results_by_status: dict[str, int]
    met_deadline: int


@dataclass(frozen=True)
class Admissions:
    """What admission saw: requests submitted, accepted into a pool, repeated ids
    (``duplicates``) and, of those, repeats whose prompt or ``max_tokens`` differed from
    the first submission's (``id_conflicts``: two requests sharing an id, not replays)."""

    submitted: int
    accepted: int
    duplicates: int
    id_conflicts: int


@dataclass
class SchedulerStats:
    """Live figures (what the Stats RPC and ``/metrics`` report)."""

    pools: dict[Priority, PoolSnapshot]
    engine: EngineStats
    admissions: Admissions
    results_by_status: dict[str, int]
    refusals_by_reason: dict[str, int]
    output_tokens_per_s: float
    prompt_tokens_total: int
    cached_tokens_total: int
    draining: bool
    late_results: int = 0
    """Late ``ok`` rows emitted (``finish_and_backfill``); not in ``results_by_status``."""
    late_aborted: int = 0
    """Late work aborted without a late row (to free a slot for on-time work, drain)."""
    late_in_flight: int = 0
    """Requests generating past their deadline now."""
    preemptions: int = 0
    batch_catch_ups: int = 0
    """Checks at which a running request behind its deadline had lower work held back
    (its first) or preempted (a later one) for a smaller batch, or narrowed the lower
    priorities' intake windows (``preemption.hold_lower``)."""
    wait_error_s: dict[Priority, dict[str, float | None]] = field(default_factory=dict)
    """Per pool: ``p50``/``p99`` of actual minus estimated queue wait (seconds) and ``n``."""
    result_channel: ResultChannelStats | None = None
    """The result channel's figures (``None``: the scheduler was given no channel)."""
    calibration: tuple = ()
    """The warm-up's timed generations (:class:`~sidecar.warmup.SpeedSample`), as given
    to :meth:`~sidecar.estimator.ServiceRateEstimator.calibrate`."""
    scale: ScaleSignal | None = None
    """Demand against capacity and the GPUs the capacity formula asks for
    (:mod:`sidecar.scale_signal`)."""

    @property
    def queued(self) -> dict[Priority, int]:
        return {p: s.queued for p, s in self.pools.items()}

    @property
    def in_flight(self) -> dict[Priority, int]:
        return {p: s.in_flight for p, s in self.pools.items()}

    @property
    def prefix_cache_hit_rate(self) -> float:
        """From the engine's own prefix-cache counters when it keeps them (vLLM),
        else cached over prompt tokens of finished requests."""
        if self.engine.prefix_cache_queries:
            return (self.engine.prefix_cache_hits or 0) / self.engine.prefix_cache_queries
        if not self.prompt_tokens_total:
            return 0.0
        return self.cached_tokens_total / self.prompt_tokens_total

    @property
    def tokens_in_flight(self) -> int:
        return sum(p.tokens_in_flight for p in self.pools.values())


@dataclass
class SchedulerCounters:
    """Cumulative counters of one scheduler, and the recent output-token rate."""

    submitted: int = 0
    accepted: int = 0
    duplicates: int = 0
    id_conflicts: int = 0
    """Duplicates whose prompt or ``max_tokens`` differed from the first submission's."""
    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0
    late_results: int = 0
    """Late ``ok`` rows: counted here only, never again as terminal results."""
    late_aborted: int = 0
    """Late work aborted without a late row."""
    preemptions: int = 0
    """Running requests aborted and requeued for higher-priority work."""
    catch_ups: int = 0
    """Checks at which a running request behind its deadline had lower work held back
    (its first) or preempted (a later one) for a smaller batch."""
    wait_errors: dict[Priority, collections.deque[float]] = field(
        default_factory=lambda: {p: collections.deque(maxlen=WAIT_ERROR_SAMPLES)
                                 for p in Priority}, repr=False)
    """Per pool, the last actual minus estimated queue waits (seconds) of started requests."""
    results_by_status: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    refusals_by_reason: dict[str, int] = field(
        default_factory=lambda: {str(r): 0 for r in RefusalReason})
    _token_events: collections.deque[tuple[float, int]] = field(
        default_factory=collections.deque, repr=False)
    demand: DemandMeter = field(default_factory=DemandMeter, repr=False)
    """Arrivals over the scale signal's window (:mod:`sidecar.scale_signal`)."""
    _estimated_waits: dict[str, tuple[float, float]] = field(default_factory=dict, repr=False)
    """Per queued request: (estimated wait at admission, monotonic admission time)."""

    def wait_estimated(self, request_id: str, estimated_s: float, now: float) -> None:
        """A request was queued at ``now`` (monotonic) with a queue wait estimate."""
        self._estimated_waits[request_id] = (estimated_s, now)

    def wait_ended(self, request_id: str) -> None:
        """A request left its queue without starting (or starts again after a
        preemption): its estimate is not compared."""
        if self._estimated_waits:
            self._estimated_waits.pop(request_id, None)

    def wait_started(self, request_id: str, priority: Priority,
                     now: float) -> tuple[float, float] | None:
        """A request started at ``now`` (monotonic): record its actual minus estimated
        queue wait; returns (estimated, actual) seconds, ``None`` without an estimate."""
        if (estimate := self._estimated_waits.pop(request_id, None)) is None:
            return None
        actual = now - estimate[1]
        self.wait_error(priority, actual - estimate[0])
        return estimate[0], actual

    def wait_error(self, priority: Priority, error_s: float) -> None:
        """Record one started request's actual minus estimated queue wait."""
        self.wait_errors[priority].append(error_s)

    def refused(self, reason: RefusalReason) -> None:
        self.refusals_by_reason[str(reason)] += 1

    def finished(self, record: ResultRecord) -> None:
        """Count one terminal result."""
        self.results_by_status[record.status] += 1
        if record.output_tokens:
            events = self._token_events
            events.append((time.monotonic(), record.output_tokens))
            # Bounded even when nobody reads the stats; a reader trims first, so a trim
            # every 256 events is enough (one per result was a clock read per request).
            if not len(events) & 255:
                self._trim()

    def late_finished(self, record: ResultRecord, *, tokens_counted: int) -> None:
        """Count one late row; ``tokens_counted`` of its output tokens were already
        counted with its terminal row."""
        self.late_results += 1
        if (extra := record.output_tokens - tokens_counted) > 0:
            self._token_events.append((time.monotonic(), extra))
            self._trim()
    def wait_error_summary(self) -> dict[Priority, dict[str, float | None]]:
        """Per pool: ``n``, ``p50`` and ``p99`` of actual minus estimated wait, seconds."""
        out: dict[Priority, dict[str, float | None]] = {}
        for p, errors in self.wait_errors.items():
            xs = list(errors)
            out[p] = {"n": float(len(xs)), "p50": percentile(xs, 50),
                      "p99": percentile(xs, 99)}
        return out

    def output_tokens_per_s(self) -> float:
        self._trim()
        return sum(n for _, n in self._token_events) / TOKEN_RATE_WINDOW_S

    def _trim(self) -> None:
        cutoff = time.monotonic() - TOKEN_RATE_WINDOW_S
        while self._token_events and self._token_events[0][0] < cutoff:
            self._token_events.popleft()
