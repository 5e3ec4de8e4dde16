"""The scale signal: the demand on a sidecar against what its GPUs can do, and the
number of GPUs the capacity formula asks for (issue 32, item 1).

The capacity formula (``sts plan``; docs/architecture.md, "Capacity")::

    GPUs = demand (output tokens/s) / (one GPU's output tokens/s x target utilisation)

- **Demand** is what arrived over the last ``window_s`` (accepted or refused: refused
  work is demand the fleet did not serve), each request counted at its expected length
  (its pool's measured share of ``max_tokens``; all of it before any request finished),
  per second; plus the tokens queued now, to be served within the same window.
- **Capacity** is one GPU's output tokens/s at the full batch, measured: ``batch /
  TPOT(batch)`` from the scheduler's speed model (the warm-up's calibration, then what
  the engine does), the sidecar's batch shared by the GPUs it serves (a simulated
  engine's replicas count as GPUs).

``desired_gpus`` is that formula rounded up: what an autoscaler (KEDA, an HPA, or a
controller of the pipeline's) aims the number of this sidecar's kind of GPUs at, per
sidecar; summed over sidecars for a pipeline. Also reported: the utilisation the demand
makes of the GPUs there are, and the shares of the window's requests refused and timed
out, which say the fleet is short even when the estimate is not trusted yet.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sidecar.contract import Priority

#: Seconds of arrivals the demand is measured over (and the backlog is to be served in).
WINDOW_S = 60.0


@dataclass(frozen=True)
class ScaleSignal:
    """Demand against capacity on one sidecar (what ``GetStats`` and ``/metrics`` say)."""

    demand_tokens_per_s: float
    """Output tokens/s asked for: the window's arrivals plus the backlog over the window."""
    demand_by_pool: dict[str, float]
    """The arrivals' part of it per pool (tokens/s)."""
    backlog_tokens: float
    """Expected output tokens of the requests queued now."""
    capacity_tokens_per_s: float
    """One GPU's output tokens/s at the full batch, measured; 0 while unknown."""
    gpus: int
    """GPUs this sidecar serves."""
    target_utilisation: float
    """The share of capacity the formula plans to use."""
    desired_gpus_exact: float
    """The formula's value (``gpus`` while the capacity is unknown)."""
    refused_share: float
    """Share of the window's arrivals refused at admission."""
    timeout_share: float
    """Share of the window's terminal rows that were ``timeout``."""

    @property
    def desired_gpus(self) -> int:
        """:attr:`desired_gpus_exact` rounded up, at least 1."""
        return max(1, math.ceil(self.desired_gpus_exact - 1e-9))

    @property
    def utilisation(self) -> float:
        """Demand over the capacity of the GPUs there are (above 1: short)."""
        total = self.capacity_tokens_per_s * self.gpus
        return self.demand_tokens_per_s / total if total > 0 else 0.0


def desired_gpus(demand_tokens_per_s: float, capacity_tokens_per_s: float,
                 target_utilisation: float) -> float:
    """The capacity formula: GPUs for a demand, at a target utilisation of each GPU.

    Example:
        >>> desired_gpus(6000.0, 3000.0, 0.5)
        4.0
    """
    return demand_tokens_per_s / (capacity_tokens_per_s * target_utilisation)


@dataclass
class DemandMeter:
    """Arrivals (expected output tokens; how many, how many refused) per pool over a
    sliding window, and the share of terminal rows that timed out over the same window.

    Cheap on the request path: a batch adds one entry per pool it holds; the timeouts'
    share is read from the scheduler's cumulative counts, remembered at each read.

    Example:
        >>> now = [0.0]
        >>> meter = DemandMeter(window_s=10.0, clock=lambda: now[0])
        >>> meter.arrived(Priority.HIGH, tokens=100.0, requests=1, refused=0)
        >>> meter.arrived(Priority.LOW, tokens=300.0, requests=1, refused=1)
        >>> now[0] = 10.0
        >>> meter.tokens_per_s(), meter.refused_share()
        (40.0, 0.5)
        >>> meter.timeout_share(finished=10, timeouts=0)
        0.0
        >>> now[0] = 15.0
        >>> meter.timeout_share(finished=30, timeouts=5)
        0.25
    """

    window_s: float = WINDOW_S
    clock: Callable[[], float] = time.monotonic
    _arrivals: collections.deque[tuple[float, Priority, float, int, int]] = field(
        default_factory=collections.deque, repr=False)
    _reads: collections.deque[tuple[float, int, int]] = field(
        default_factory=collections.deque, repr=False)
    _started: float | None = None

    def arrived(self, priority: Priority, *, tokens: float, requests: int,
                refused: int) -> None:
        """``requests`` of ``priority`` (``refused`` of them refused at admission),
        expected to generate ``tokens`` in all, arrived now."""
        now = self.clock()
        if self._started is None:
            self._started = now
        self._arrivals.append((now, priority, tokens, requests, refused))
        self._trim(now)

    def _trim(self, now: float) -> None:
        cutoff = now - self.window_s
        arrivals = self._arrivals
        while arrivals and arrivals[0][0] < cutoff:
            arrivals.popleft()

    def _span(self, now: float) -> float:
        """The window, or the time since the first arrival when shorter (at least 1 s)."""
        if self._started is None:
            return self.window_s
        return min(self.window_s, max(now - self._started, 1.0))

    def tokens_per_s(self, priority: Priority | None = None) -> float:
        """Expected output tokens/s of the window's arrivals (of ``priority``, or all)."""
        now = self.clock()
        self._trim(now)
        tokens = sum(e[2] for e in self._arrivals if priority is None or e[1] is priority)
        return tokens / self._span(now)

    def refused_share(self) -> float:
        """Share of the window's arrivals refused at admission (0 without arrivals)."""
        self._trim(self.clock())
        n = sum(e[3] for e in self._arrivals)
        return sum(e[4] for e in self._arrivals) / n if n else 0.0

    def timeout_share(self, *, finished: int, timeouts: int) -> float:
        """Share of the terminal rows written since the oldest read within the window
        that were ``timeout``, given the cumulative counts now (0 without rows)."""
        now = self.clock()
        reads = self._reads
        while len(reads) > 1 and reads[1][0] <= now - self.window_s:
            reads.popleft()
        base = reads[0] if reads else (now, 0, 0)
        reads.append((now, finished, timeouts))
        done = finished - base[1]
        return (timeouts - base[2]) / done if done > 0 else 0.0


def scale_signal(meter: DemandMeter, *, backlog_tokens: float,
                 full_batch: int, tpot_at_full_batch_s: float | None, gpus: int,
                 target_utilisation: float, finished: int, timeouts: int) -> ScaleSignal:
    """The signal from the meter, the queued tokens and the measured speed.

    Args:
        meter: The sidecar's arrivals.
        finished: Terminal rows written since start; ``timeouts``: of them ``timeout``.
        backlog_tokens: Expected output tokens of the requests queued now.
        full_batch: Sequences the sidecar runs at once (all its GPUs).
        tpot_at_full_batch_s: Seconds per output token at ``full_batch`` (``None`` or 0:
            the engine's speed is not known yet).
        gpus: GPUs the sidecar serves.
        target_utilisation: The share of capacity to plan for (0-1].
    """
    arrivals = meter.tokens_per_s()
    demand = arrivals + backlog_tokens / meter.window_s
    capacity = (full_batch / tpot_at_full_batch_s / gpus
                if tpot_at_full_batch_s else 0.0)
    exact = (desired_gpus(demand, capacity, target_utilisation) if capacity > 0
             else float(gpus))
    return ScaleSignal(
        demand_tokens_per_s=demand,
        demand_by_pool={str(p): meter.tokens_per_s(p) for p in Priority},
        backlog_tokens=backlog_tokens, capacity_tokens_per_s=capacity, gpus=gpus,
        target_utilisation=target_utilisation, desired_gpus_exact=exact,
        refused_share=meter.refused_share(),
        timeout_share=meter.timeout_share(finished=finished, timeouts=timeouts))
