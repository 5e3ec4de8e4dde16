"""Online estimate of the engine's service rate, for deadline-aware admission.

Learned from what the sidecar observes, per pool:

* ``ttft_s``: dispatch to first token (prefill plus the engine's own queueing);
* ``tpot_s``: seconds per output token after the first (decode speed at the
  current batch size);
* ``output_ratio``: output tokens / ``max_tokens`` (how much of its budget a
  request uses; 1.0 until the first request finishes, so the cold start is
  cautious about length but optimistic about speed);
* dispatch times, over a sliding window: how fast the pool's queue moves.

All smoothed with an exponentially weighted moving average (``alpha``), so the
estimate follows a change of load within a few dozen requests. The estimate of
a new request's completion is ``now + queue wait + ttft + expected tokens x tpot``.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from sidecar.contract import Priority

_WINDOW_S = 10.0


@dataclass
class _Ewma:
    alpha: float
    value: float | None = None

    def update(self, x: float) -> None:
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)

    def get(self, default: float) -> float:
        return default if self.value is None else self.value


@dataclass
class _PoolEstimate:
    alpha: float
    ttft_s: _Ewma = field(init=False)
    tpot_s: _Ewma = field(init=False)
    output_ratio: _Ewma = field(init=False)
    dispatches: collections.deque[float] = field(default_factory=collections.deque)

    def __post_init__(self) -> None:
        self.ttft_s = _Ewma(self.alpha)
        self.tpot_s = _Ewma(self.alpha)
        self.output_ratio = _Ewma(self.alpha)


class ServiceRateEstimator:
    """Per-pool estimates of queue wait and service time.

    Args:
        alpha: EWMA weight of each new observation.
        clock: Monotonic clock in seconds (injectable for tests).

    Example:
        >>> est = ServiceRateEstimator()
        >>> est.observe_finish(Priority.HIGH, ttft_s=0.1, tpot_s=0.02, output_tokens=50,
        ...                    max_tokens=100)
        >>> round(est.service_s(Priority.HIGH, max_tokens=100), 2)
        1.08
    """

    def __init__(self, alpha: float = 0.1, clock=time.monotonic) -> None:
        self.alpha = alpha
        self.clock = clock
        self._pools = {p: _PoolEstimate(alpha) for p in Priority}
        self._all_tpot = _Ewma(alpha)
        self._all_ttft = _Ewma(alpha)
        self._finishes: collections.deque[float] = collections.deque()
        self._first_event: float | None = None

    # -------------------------------------------------------------- observations

    def observe_dispatch(self, priority: Priority) -> None:
        now = self.clock()
        if self._first_event is None:
            self._first_event = now
        self._record(self._pools[priority].dispatches, now)

    def observe_finish(self, priority: Priority, *, ttft_s: float | None, tpot_s: float | None,
                       output_tokens: int, max_tokens: int) -> None:
        """A request finished in the engine (``ok``, or aborted at its deadline)."""
        pool = self._pools[priority]
        if ttft_s is not None:
            pool.ttft_s.update(ttft_s)
            self._all_ttft.update(ttft_s)
        if tpot_s is not None:
            pool.tpot_s.update(tpot_s)
            self._all_tpot.update(tpot_s)
        if max_tokens > 0 and output_tokens > 0:
            pool.output_ratio.update(min(1.0, output_tokens / max_tokens))
        self._record(self._finishes, self.clock())

    # -------------------------------------------------------------- estimates

    @staticmethod
    def _trim(events: collections.deque[float], now: float) -> None:
        cutoff = now - _WINDOW_S
        while events and events[0] < cutoff:
            events.popleft()

    def _record(self, events: collections.deque[float], now: float) -> None:
        """Append one event; the window is trimmed here too, so memory stays bounded
        when no estimate is asked for (light load never needs one)."""
        events.append(now)
        self._trim(events, now)

    def _rate(self, events: collections.deque[float]) -> float:
        """Events per second over the window (or since the first event, if shorter)."""
        now = self.clock()
        self._trim(events, now)
        if self._first_event is None:
            return 0.0
        span = min(_WINDOW_S, max(now - self._first_event, 1.0))
        return len(events) / span

    @property
    def warm(self) -> bool:
        """Whether any request has finished yet (before that, every estimate is 0 wait)."""
        return self._all_tpot.value is not None or self._all_ttft.value is not None

    def ttft_s(self, priority: Priority) -> float:
        return self._pools[priority].ttft_s.get(self._all_ttft.get(0.0))

    def tpot_s(self, priority: Priority) -> float:
        return self._pools[priority].tpot_s.get(self._all_tpot.get(0.0))

    def expected_output_tokens(self, priority: Priority, max_tokens: int) -> float:
        return max_tokens * self._pools[priority].output_ratio.get(1.0)

    def service_s(self, priority: Priority, *, max_tokens: int) -> float:
        """Expected seconds from dispatch to the last token."""
        tokens = self.expected_output_tokens(priority, max_tokens)
        return self.ttft_s(priority) + max(tokens - 1.0, 0.0) * self.tpot_s(priority)

    def completions_per_s(self) -> float:
        """Requests leaving the engine per second over the recent window."""
        return self._rate(self._finishes)

    def dispatch_rate(self, priority: Priority) -> float:
        """Requests of ``priority`` entering the engine per second over the recent window."""
        return self._rate(self._pools[priority].dispatches)

    def queue_wait_s(self, priority: Priority, *, ahead: int, slot_free: bool,
                     share: float, slots: int, service_s: float) -> float:
        """Expected wait of a request with ``ahead`` requests before it in its pool.

        Args:
            ahead: Requests queued in the same pool before it.
            slot_free: Whether it could start at once if nothing were ahead.
            share: The pool's share of dispatches when pools compete (its weight
                over the weights of pools with work), used while the pool's own
                recent dispatch rate is unknown or lower.
            slots: Engine slots the pool may use; with ``service_s`` (one
                request's expected service time) they give the rate to assume
                when nothing finished in the recent window (after idle time).
        """
        if ahead == 0 and slot_free:
            return 0.0
        if not self.warm:
            return 0.0
        rate = max(self.dispatch_rate(priority), self.completions_per_s() * share)
        if rate <= 0.0:
            if service_s <= 0.0:
                return 0.0
            rate = max(slots, 1) * share / service_s
        return (ahead + 1) / rate
