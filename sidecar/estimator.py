"""Online estimate of the engine's service rate, for deadline-aware admission.

Learned from what the sidecar observes, per pool:

* ``ttft_s``: dispatch to first token (prefill plus the engine's own queueing);
* ``tpot_s``: seconds per output token after the first, with the mean batch
  size (sequences in the engine) the request ran in;
* decode speed as a function of batch size (:class:`BatchSpeedModel`): per
  sequence, a step gets slower as more sequences run together; fitted online
  (a line through the observed ``(batch, tpot)`` pairs) with a prior shape until
  the observed batch sizes spread enough to fit it;
* ``output_ratio``: output tokens / ``max_tokens`` (how much of its budget a
  request uses; 1.0 until the first request finishes, so the cold start is
  cautious about length but optimistic about speed);
* dispatch times, over a sliding window: how fast the pool's queue moves.

All smoothed with an exponentially weighted moving average (``alpha``), so the
estimate follows a change of load within a few dozen requests. The estimate of
a new request's completion is ``now + queue wait + ttft + expected tokens x tpot(batch)``.

The queue wait is positional: a request with ``ahead`` requests before it in its
pool needs ``ahead + 1`` slots, of which its pool gets ``share`` of those that free;
the slots free when the running requests end (their expected finish times), then at
the engine's observed completion rate. A lone request in a sparse pool therefore
waits for one slot, not for its pool's history.
"""

from __future__ import annotations

import collections
import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

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


class _RecentMedian:
    """The median of the last ``size`` observations: one slow outlier (a cold start, a
    CPU hiccup) moves it little, a change of regime moves it within ``size / 2``."""

    def __init__(self, size: int) -> None:
        self._values: collections.deque[float] = collections.deque(maxlen=size)

    @property
    def value(self) -> float | None:
        return statistics.median(self._values) if self._values else None

    def update(self, x: float) -> None:
        self._values.append(x)

    def get(self, default: float) -> float:
        v = self.value
        return default if v is None else v


@dataclass
class _PoolEstimate:
    alpha: float
    ttft_s: _Ewma = field(init=False)
    tpot_s: _Ewma = field(init=False)
    batch: _Ewma = field(init=False)
    output_ratio: _Ewma = field(init=False)
    dispatches: collections.deque[float] = field(default_factory=collections.deque)

    def __post_init__(self) -> None:
        self.ttft_s = _Ewma(self.alpha)
        self.tpot_s = _Ewma(self.alpha)
        self.batch = _Ewma(self.alpha)
        self.output_ratio = _Ewma(self.alpha)


class BatchSpeedModel:
    """Seconds per output token of one sequence as a function of the batch size.

    A table: per batch size (rounded to whole sequences) the median of the last
    ``window`` observed ``tpot`` values. A size never observed is interpolated between
    the nearest observed sizes below and above it; beyond the observed range the line
    is extended with the slope fitted over the observed sizes (least squares, when
    they spread over at least ``min_spread`` sequences and the slope is positive) or
    else with the prior shape ``per_seq = prior_per_seq x base`` (vLLM on CPU here:
    ~58 ms at batch 1, ~97 ms at batch 8 on an idle machine, so ``per_seq`` ~ 0.1 x
    ``base``; under CPU contention the slope is steeper and is then learnt).

    A table remembers what each batch size costs: the small batches seen at start-up
    or while a high-priority request ran alone keep their figure while the engine
    spends minutes at its full batch, so the estimate of a shrunk batch stays measured,
    not assumed.

    Args:
        window: Observations kept per batch size.
        prior_per_seq: The prior relative cost of one more sequence.
        min_spread: Distance between the smallest and largest observed batch sizes
            needed to fit a slope.

    Example:
        >>> m = BatchSpeedModel()
        >>> for b, t in [(1, 0.05), (8, 0.084)] * 20:
        ...     m.observe(b, t)
        >>> round(m.tpot(1), 3), round(m.tpot(8), 3), round(m.tpot(4), 3)
        (0.05, 0.084, 0.065)
        >>> round(m.tpot(16), 3)  # the fitted slope beyond the observed range
        0.123
    """

    def __init__(self, window: int = 16, prior_per_seq: float = 0.1,
                 min_spread: float = 2.0) -> None:
        self.window = window
        self.prior_per_seq = prior_per_seq
        self.min_spread = min_spread
        self._by_size: dict[int, _RecentMedian] = {}
        self._sizes: list[int] = []
        self.version = 0
        """Counts observations: figures derived from the model may be cached per version."""
        self._cache: dict[float, float] = {}  # batch -> tpot, for this version
        self._slope_cache: tuple[float | None] | None = None

    @property
    def known(self) -> bool:
        return bool(self._sizes)

    def observe(self, batch: float, tpot_s: float) -> None:
        """One request decoded at a mean of ``batch`` sequences, ``tpot_s`` per token."""
        if not (batch >= 1.0 and tpot_s > 0.0 and math.isfinite(tpot_s)):
            return
        size = max(1, round(batch))
        if (avg := self._by_size.get(size)) is None:
            avg = self._by_size[size] = _RecentMedian(self.window)
            self._sizes = sorted(self._by_size)
        avg.update(tpot_s)
        self.version += 1
        self._cache.clear()
        self._slope_cache = None

    def _value(self, size: int) -> float:
        return self._by_size[size].get(0.0)

    def _slope(self) -> float | None:
        """Least-squares slope over the observed sizes, when they spread enough and it
        is positive (computed once per observation)."""
        if self._slope_cache is None:
            self._slope_cache = (self._fit_slope(),)
        return self._slope_cache[0]

    def _fit_slope(self) -> float | None:
        sizes = self._sizes
        if sizes[-1] - sizes[0] < self.min_spread:
            return None
        mx = sum(sizes) / len(sizes)
        my = sum(self._value(s) for s in sizes) / len(sizes)
        var = sum((s - mx) ** 2 for s in sizes)
        slope = sum((s - mx) * (self._value(s) - my) for s in sizes) / var
        return slope if slope > 0.0 else None

    def _prior_slope(self, size: int) -> float:
        """The prior shape's slope through the observation at ``size``."""
        return self.prior_per_seq * self._value(size) / (1.0 + self.prior_per_seq * size)

    def tpot(self, batch: float) -> float:
        """Expected seconds per token at ``batch`` sequences (0.0 before any observation)."""
        if (cached := self._cache.get(batch)) is not None:
            return cached
        value = self._cache[batch] = self._tpot(batch)
        return value

    def _tpot(self, batch: float) -> float:
        sizes = self._sizes
        if not sizes:
            return 0.0
        b = max(batch, 1.0)
        lo, hi = sizes[0], sizes[-1]
        if b < lo or b > hi:
            edge = lo if b < lo else hi
            slope = self._slope()
            if slope is None:
                slope = self._prior_slope(edge)
            value = self._value(edge) + slope * (b - edge)
            # Never below the prior's cost of a lone sequence at that edge.
            return max(value, self._value(edge) / (1.0 + self.prior_per_seq * edge))
        below = max(s for s in sizes if s <= b)
        above = min(s for s in sizes if s >= b)
        if below == above:
            return self._value(below)
        w = (b - below) / (above - below)
        return self._value(below) * (1.0 - w) + self._value(above) * w

    def ratio(self, batch: float, observed_at: float) -> float:
        """How much slower a token is at ``batch`` than at ``observed_at`` sequences."""
        at = self.tpot(observed_at)
        return self.tpot(batch) / at if at > 0.0 else 1.0


def _interpolate(points: list[tuple[float, float, float]],
                 batch: float) -> tuple[float, float]:
    """The (TTFT, TPOT) of sorted ``(batch, ttft, tpot)`` points at ``batch``: linear
    between the two nearest sizes, the nearest one's beyond them.

    Example:
        >>> _interpolate([(1.0, 0.02, 0.010), (9.0, 0.06, 0.014)], 5.0)
        (0.04, 0.012)
        >>> _interpolate([(1.0, 0.02, 0.010), (9.0, 0.06, 0.014)], 64.0)
        (0.06, 0.014)
    """
    if batch <= points[0][0]:
        return points[0][1], points[0][2]
    for (b0, f0, t0), (b1, f1, t1) in zip(points, points[1:]):
        if batch <= b1:
            w = (batch - b0) / (b1 - b0)
            return round(f0 + (f1 - f0) * w, 9), round(t0 + (t1 - t0) * w, 9)
    return points[-1][1], points[-1][2]


class ServiceRateEstimator:
    """Per-pool estimates of queue wait and service time.

    Args:
        alpha: EWMA weight of each new observation.
        clock: Monotonic clock in seconds (injectable for tests; default
            ``time.monotonic`` as it is when the estimator is made).

    Example:
        >>> est = ServiceRateEstimator()
        >>> est.observe_finish(Priority.HIGH, ttft_s=0.1, tpot_s=0.02, output_tokens=50,
        ...                    max_tokens=100)
        >>> round(est.service_s(Priority.HIGH, max_tokens=100), 2)
        1.08
    """

    def __init__(self, alpha: float = 0.1, clock: Callable[[], float] | None = None) -> None:
        self.alpha = alpha
        self.clock = clock if clock is not None else time.monotonic
        self._pools = {p: _PoolEstimate(alpha) for p in Priority}
        self._all_tpot = _Ewma(alpha)
        self._all_ttft = _Ewma(alpha)
        self._ttft_pairs: collections.deque[tuple[float, float]] = collections.deque(maxlen=32)
        """Recent (ttft, batch it was observed at) pairs, engine-wide."""
        self._ttft_version = 0
        self._ttft_steps: tuple[tuple[int, int], float] | None = None
        self.speed = BatchSpeedModel()
        self._finishes: collections.deque[float] = collections.deque()
        self._first_event: float | None = None
        self.completed = 0
        """Requests that completed in the engine since start (calibration aside): each
        taught its pool how much of ``max_tokens`` an answer uses."""
        self.calibration: tuple[Any, ...] = ()
        """The samples given to :meth:`calibrate` (the warm-up's timed generations)."""
        self._clean: list[tuple[float, float, float]] = []
        """(batch, median TTFT, median TPOT) of each calibrated batch size, by size."""

    # -------------------------------------------------------------- observations

    def observe_dispatch(self, priority: Priority) -> None:
        now = self.clock()
        if self._first_event is None:
            self._first_event = now
        self._record(self._pools[priority].dispatches, now)

    def observe_finish(self, priority: Priority, *, ttft_s: float | None, tpot_s: float | None,
                       output_tokens: int, max_tokens: int, batch: float | None = None,
                       ttft_batch: float | None = None) -> None:
        """A request finished in the engine (``ok``, or aborted at its deadline); ``batch``
        is the mean number of sequences in the engine while it decoded, ``ttft_batch``
        the number it joined (itself included) when it was dispatched."""
        pool = self._pools[priority]
        if ttft_s is not None:
            pool.ttft_s.update(ttft_s)
            self._all_ttft.update(ttft_s)
            if ttft_batch is not None:
                self._ttft_pairs.append((ttft_s, ttft_batch))
                self._ttft_version += 1
        if tpot_s is not None:
            pool.tpot_s.update(tpot_s)
            self._all_tpot.update(tpot_s)
            if batch is not None:
                pool.batch.update(batch)
                self.speed.observe(batch, tpot_s)
        if max_tokens > 0 and output_tokens > 0:
            pool.output_ratio.update(min(1.0, output_tokens / max_tokens))
            self.completed += 1
        self._record(self._finishes, self.clock())

    def calibrate(self, samples: Iterable[Any]) -> None:
        """Seed the engine-wide figures with measured generations (objects with
        ``batch``, ``ttft_s``, ``tpot_s``; see :func:`sidecar.warmup.calibrate`). No pool's
        own figures change: how long a pool's answers are is learnt from its requests."""
        samples = tuple(samples)
        self.calibration = samples
        by_batch: dict[float, list[Any]] = collections.defaultdict(list)
        for s in samples:
            if s.tpot_s is not None:
                by_batch[float(s.batch)].append(s)
        self._clean = sorted((b, statistics.median(x.ttft_s for x in group),
                              statistics.median(x.tpot_s for x in group))
                             for b, group in by_batch.items())
        for s in samples:
            self._all_ttft.update(s.ttft_s)
            self._ttft_pairs.append((s.ttft_s, float(s.batch)))
            self._ttft_version += 1
            if s.tpot_s is not None:
                self._all_tpot.update(s.tpot_s)
                self.speed.observe(s.batch, s.tpot_s)

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
        """Whether the engine's speed is known: calibrated or a request has finished
        (before that, every estimate is 0 wait)."""
        return self._all_tpot.value is not None or self._all_ttft.value is not None

    @property
    def measured(self) -> bool:
        """Whether a request has completed, so answer lengths are known. Before that the
        service time of a request assumes it uses all of ``max_tokens``, so every queue
        wait built on it is an upper bound, not an expectation: admission does not
        refuse on it (:mod:`sidecar.admission.load`)."""
        return self.completed > 0

    def ttft_s(self, priority: Priority, batch: float | None = None) -> float:
        """Seconds from dispatch to the first token. At ``batch`` sequences when given:
        the median of the recent engine-wide observations (every pool's requests keep it
        fresh, a pool that was refused for a while does not), each scaled by
        :class:`BatchSpeedModel` from the batch it was observed at (a prefill shares its
        steps with the decodes)."""
        if batch is not None and self.speed.known and self._ttft_pairs:
            return self._ttft_in_steps() * self.speed.tpot(batch)
        return self._pools[priority].ttft_s.get(self._all_ttft.get(0.0))

    def _ttft_in_steps(self) -> float:
        """The recent first tokens in decode steps of the batch each was observed at
        (median); times ``tpot(batch)`` it is the TTFT at ``batch``. Cached until the
        speed model or the observations change."""
        key = (self.speed.version, self._ttft_version)
        if self._ttft_steps is None or self._ttft_steps[0] != key:
            steps = [t / step for t, b in self._ttft_pairs
                     if (step := self.speed.tpot(b)) > 0.0]
            self._ttft_steps = (key, statistics.median(steps) if steps else 0.0)
        return self._ttft_steps[1]

    def tpot_s(self, priority: Priority, batch: float | None = None) -> float:
        """Seconds per output token of the pool's requests; at ``batch`` sequences when
        given: the engine's speed at that batch (:class:`BatchSpeedModel`; a decode step
        costs the same whichever pool its sequences came from)."""
        pool = self._pools[priority]
        if batch is None:
            return pool.tpot_s.get(self._all_tpot.get(0.0))
        if self.speed.known:
            return self.speed.tpot(batch)
        return pool.tpot_s.get(self._all_tpot.get(0.0))

    def expected_output_tokens(self, priority: Priority, max_tokens: int) -> float:
        return max_tokens * self._pools[priority].output_ratio.get(1.0)

    def service_s(self, priority: Priority, *, max_tokens: int,
                  batch: float | None = None) -> float:
        """Expected seconds from dispatch to the last token (at ``batch`` sequences when
        given, else at the batch sizes the pool has seen)."""
        tokens = self.expected_output_tokens(priority, max_tokens)
        return (self.ttft_s(priority, batch)
                + max(tokens - 1.0, 0.0) * self.tpot_s(priority, batch))

    def clean_service_s(self, priority: Priority, *, max_tokens: int,
                        batch: float) -> float | None:
        """Expected seconds from dispatch to the last token at ``batch`` sequences on the
        engine as the warm-up measured it: decoding with no other prompt prefilled
        between its steps (each calibrated size's median TTFT and TPOT, interpolated
        between sizes and held beyond them). ``None`` without calibration."""
        if not self._clean:
            return None
        ttft, tpot = _interpolate(self._clean, batch)
        tokens = self.expected_output_tokens(priority, max_tokens)
        return ttft + max(tokens - 1.0, 0.0) * tpot

    def clean_tpot_s(self, batch: float) -> float | None:
        """Seconds per output token at ``batch`` sequences as the warm-up measured it
        (see :meth:`clean_service_s`); ``None`` without calibration."""
        return _interpolate(self._clean, batch)[1] if self._clean else None

    def completions_per_s(self) -> float:
        """Requests leaving the engine per second over the recent window."""
        return self._rate(self._finishes)

    def dispatch_rate(self, priority: Priority) -> float:
        """Requests of ``priority`` entering the engine per second over the recent window."""
        return self._rate(self._pools[priority].dispatches)

    def queue_wait_s(self, priority: Priority, *, ahead: int, slot_free: bool,
                     share: float, slots: int, service_s: float,
                     slots_free_in_s: list[float] | None = None) -> float:
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
            slots_free_in_s: Seconds until each running request the pool could
                take the slot of is expected to end. With it, the wait is
                positional: the ``ceil((ahead + 1) / share)``-th slot to free,
                then the engine's completion rate past the running ones.
        """
        if ahead == 0 and slot_free:
            return 0.0
        if not self.warm:
            return 0.0
        if slots_free_in_s is not None:
            share = min(max(share, 1e-6), 1.0)
            # Smooth weighted round robin: the k-th slot to the pool is about the
            # (k / share)-th to free, rounded (its first one is the first to free
            # when its weight dominates).
            need = max(1, round((ahead + 1) / share))
            ends = sorted(slots_free_in_s)
            if need <= len(ends):
                return ends[need - 1]
            rate = self.completions_per_s()
            if rate <= 0.0:
                rate = max(slots, 1) / service_s if service_s > 0.0 else 0.0
            if rate <= 0.0:
                return ends[-1] if ends else 0.0
            return (ends[-1] if ends else 0.0) + (need - len(ends)) / rate
        rate = max(self.dispatch_rate(priority), self.completions_per_s() * share)
        if rate <= 0.0:
            if service_s <= 0.0:
                return 0.0
            rate = max(slots, 1) * share / service_s
        return (ahead + 1) / rate
