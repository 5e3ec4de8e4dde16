"""Token-length and arrival-time distributions of a traffic profile.

:class:`LengthDistribution` draws prompt or output lengths from a log-normal
fitted to a P50/P90/P99, plus a deliberate share of very long values;
:class:`ArrivalProcess` draws arrival times (Poisson, or Poisson whose rate
follows a square wave of bursts). Both are sections of
:class:`sts_capacity.profiles.TrafficProfile`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:  # numpy is imported where samples are drawn: `sts plan` needs none
    import numpy as np

ArrivalKind = Literal["poisson", "bursty"]


def check_int(name: str, value: Any, minimum: int) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer (not a bool) >= ``minimum``.

    Example:
        >>> check_int("p50", 3, 1)
        >>> check_int("p50", True, 1)
        Traceback (most recent call last):
        ...
        ValueError: p50=True must be an integer >= 1
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")


def normal_cdf(x: float) -> float:
    """The standard normal cumulative distribution function.

    Example:
        >>> normal_cdf(0.0), round(normal_cdf(1.2816), 3)
        (0.5, 0.9)
    """
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@dataclass
class LengthDistribution:
    """A token-length distribution given by its P50/P90/P99, plus deliberate very long values.

    The body is a log-normal fitted to the three percentiles:

    - ``mu = ln(p50)`` (the median of a log-normal is ``exp(mu)``, so P50 is exact);
    - ``sigma`` is the least-squares slope through the origin of
      ``ln(p_q / p50) = sigma * z_q`` over the P90 and P99 points
      (``z90 = 1.2816``, ``z99 = 2.3263``, standard normal quantiles):
      ``sigma = (z90*ln(p90/p50) + z99*ln(p99/p50)) / (z90**2 + z99**2)``.
      P90 and P99 are then matched as closely as one ``sigma`` allows.

    :meth:`sample` rounds log-normal draws to integers and clips them to
    ``[1, cap]``, then replaces exactly ``round(long_share * n)`` of them (at
    random positions, half rounded up) by integers uniform in
    ``[p99, long_tokens]``: the seed's "about 1 % very long outputs" that a load
    test must include on purpose.

    Example:
        >>> d = LengthDistribution(p50=80, p90=200, p99=450)
        >>> d.long_tokens, d.cap
        (1800, 1800)
    """

    p50: int = 80
    """Median length in tokens."""

    p90: int = 200
    """90th percentile in tokens (greater than ``p50``)."""

    p99: int = 450
    """99th percentile in tokens (greater than ``p90``)."""

    long_share: float = 0.01
    """Share of samples replaced by very long values, in ``[0, 1)``."""

    long_tokens: int | None = None
    """Upper end of the very long values (uniform in ``[p99, long_tokens]``);
    ``None``: ``min(4 * p99, cap)``."""

    cap: int | None = None
    """Largest value ever drawn (e.g. the sidecar's ``max_tokens_cap``);
    ``None``: ``long_tokens``, or ``4 * p99`` when that is unset too."""

    Z90: ClassVar[float] = 1.2816
    Z99: ClassVar[float] = 2.3263

    def __post_init__(self) -> None:
        for name in ("p50", "p90", "p99"):
            check_int(name, getattr(self, name), 1)
        if not self.p50 < self.p90 < self.p99:
            raise ValueError(f"percentiles must increase: {self.p50=}, {self.p90=}, {self.p99=}")
        if isinstance(self.long_share, bool) or not 0 <= self.long_share < 1:
            raise ValueError(f"{self.long_share=} must be in [0, 1)")
        if self.cap is None:
            self.cap = self.long_tokens if self.long_tokens is not None else 4 * self.p99
        check_int("cap", self.cap, self.p99)
        if self.long_tokens is None:
            self.long_tokens = min(4 * self.p99, self.cap)
        check_int("long_tokens", self.long_tokens, self.p99)
        if self.long_tokens > self.cap:
            raise ValueError(f"{self.long_tokens=} must not exceed {self.cap=}")

    def lognormal_params(self) -> tuple[float, float]:
        """``(mu, sigma)`` of the fitted log-normal body (see the class docstring)."""
        mu = math.log(self.p50)
        y90, y99 = math.log(self.p90 / self.p50), math.log(self.p99 / self.p50)
        sigma = (self.Z90 * y90 + self.Z99 * y99) / (self.Z90 ** 2 + self.Z99 ** 2)
        return mu, sigma

    def long_count(self, n: int) -> int:
        """How many of ``n`` samples :meth:`sample` makes very long."""
        return int(math.floor(self.long_share * n + 0.5))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw ``n`` integer lengths (``int64``), each in ``[1, cap]``.

        Args:
            rng: Source of randomness; the result is deterministic for its state.
            n: Number of lengths.

        Returns:
            Log-normal draws rounded and clipped to ``[1, cap]``, of which
            :meth:`long_count` ``(n)`` at random positions are uniform integers in
            ``[p99, long_tokens]``.

        Example:
            >>> d = LengthDistribution(p50=24, p90=48, p99=96, cap=128)
            >>> import numpy as np
            >>> int(d.sample(np.random.default_rng(0), 1000).max()) <= 128
            True
        """
        import numpy as np

        mu, sigma = self.lognormal_params()
        out = np.clip(np.rint(rng.lognormal(mu, sigma, size=n)), 1, self.cap).astype(np.int64)
        if k := self.long_count(n):
            where = rng.choice(n, size=k, replace=False)
            out[where] = rng.integers(self.p99, self.long_tokens, size=k, endpoint=True)
        return out

    def mean(self) -> float:
        """Expected value of :meth:`sample`, long share included (analytic).

        Body: ``E[clip(X, 1, cap)]`` for ``X ~ LogNormal(mu, sigma)``, i.e.
        ``P(X<1) + cap*P(X>cap) + exp(mu + sigma^2/2) * (Phi(b - sigma) - Phi(a - sigma))``
        with ``a = -mu/sigma``, ``b = (ln(cap) - mu)/sigma``; rounding is ignored.
        Long values have mean ``(p99 + long_tokens) / 2``. The result is
        ``(1 - long_share) * body + long_share * long``.
        """
        mu, sigma = self.lognormal_params()
        a, b = -mu / sigma, (math.log(self.cap) - mu) / sigma
        body = (normal_cdf(a) + self.cap * (1.0 - normal_cdf(b))
                + math.exp(mu + sigma ** 2 / 2) * (normal_cdf(b - sigma) - normal_cdf(a - sigma)))
        long = (self.p99 + self.long_tokens) / 2
        return (1.0 - self.long_share) * body + self.long_share * long


@dataclass
class ArrivalProcess:
    """When requests arrive: Poisson, or Poisson whose rate follows a square wave.

    ``bursty`` is a piecewise-constant-rate Poisson process. Each period of
    ``burst_period_s`` starts with a burst lasting ``burst_duty * burst_period_s``
    at ``burst_factor * rate_per_s``; the rest of the period runs at the off-burst
    rate ``rate_per_s * (1 - burst_duty*burst_factor) / (1 - burst_duty)``, chosen
    so that the long-run mean stays ``rate_per_s`` (which needs
    ``burst_duty * burst_factor <= 1``).

    Example:
        >>> a = ArrivalProcess("bursty", rate_per_s=100, burst_factor=4, burst_duty=0.1)
        >>> a.peak_rate_per_s, round(a.off_rate_per_s, 2)
        (400.0, 66.67)
    """

    kind: ArrivalKind = "poisson"
    """``poisson`` (constant rate) or ``bursty`` (on/off square wave of rate)."""

    rate_per_s: float = 1.0
    """Long-run mean arrivals per second."""

    burst_factor: float = 4.0
    """``bursty``: rate during a burst as a multiple of ``rate_per_s`` (>= 1)."""

    burst_duty: float = 0.1
    """``bursty``: share of each period spent in a burst, in ``(0, 1)``."""

    burst_period_s: float = 10.0
    """``bursty``: length of one burst-plus-calm cycle in seconds."""

    KINDS: ClassVar[tuple[str, ...]] = ("poisson", "bursty")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise ValueError(f"{self.kind=} must be one of {self.KINDS}")
        if not self.rate_per_s > 0:
            raise ValueError(f"{self.rate_per_s=} must be positive")
        if self.kind == "bursty":
            if not self.burst_factor >= 1:
                raise ValueError(f"{self.burst_factor=} must be >= 1")
            if not 0 < self.burst_duty < 1:
                raise ValueError(f"{self.burst_duty=} must be in (0, 1)")
            if not self.burst_period_s > 0:
                raise ValueError(f"{self.burst_period_s=} must be positive")
            if self.burst_duty * self.burst_factor > 1 + 1e-12:
                raise ValueError(
                    f"{self.burst_duty=} x {self.burst_factor=} must be <= 1, else the "
                    "off-burst rate would be negative to keep the mean at rate_per_s")

    @property
    def peak_rate_per_s(self) -> float:
        """Highest instantaneous rate: ``rate_per_s``, or the burst rate."""
        return float(self.rate_per_s * (self.burst_factor if self.kind == "bursty" else 1.0))

    @property
    def off_rate_per_s(self) -> float:
        """Rate outside bursts (``rate_per_s`` for ``poisson``)."""
        if self.kind == "poisson":
            return float(self.rate_per_s)
        off = self.rate_per_s * (1 - self.burst_duty * self.burst_factor) / (1 - self.burst_duty)
        return max(0.0, off)

    def in_burst(self, t: np.ndarray) -> np.ndarray:
        """Whether each time ``t`` (seconds from 0) falls in a burst (all ``False`` for poisson)."""
        import numpy as np

        t = np.asarray(t, dtype=float)
        if self.kind == "poisson":
            return np.zeros(t.shape, dtype=bool)
        return np.mod(t, self.burst_period_s) < self.burst_duty * self.burst_period_s

    def _segments(self, duration_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Starts, lengths and rates of the constant-rate pieces covering ``[0, duration_s)``."""
        import numpy as np

        if self.kind == "poisson":
            return np.array([0.0]), np.array([duration_s]), np.array([float(self.rate_per_s)])
        period, on = self.burst_period_s, self.burst_duty * self.burst_period_s
        cycles = np.arange(math.ceil(duration_s / period)) * period
        starts = np.stack([cycles, cycles + on], axis=1).ravel()
        ends = np.minimum(np.append(starts[1:], np.inf), duration_s)
        rates = np.tile([self.peak_rate_per_s, self.off_rate_per_s], len(cycles))
        keep = ends > starts
        return starts[keep], (ends - starts)[keep], rates[keep]

    def arrival_times(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        """Arrival times in ``[0, duration_s)``, seconds from 0, sorted.

        Each constant-rate piece of length ``L`` at rate ``r`` gets
        ``Poisson(r * L)`` arrivals placed uniformly in it (exact for a Poisson
        process).

        Example:
            >>> import numpy as np
            >>> t = ArrivalProcess(rate_per_s=50).arrival_times(np.random.default_rng(0), 10)
            >>> bool(np.all(np.diff(t) >= 0)) and 400 < len(t) < 600
            True
        """
        import numpy as np

        if not duration_s > 0:
            raise ValueError(f"{duration_s=} must be positive")
        starts, lengths, rates = self._segments(float(duration_s))
        counts = rng.poisson(rates * lengths)
        offsets = rng.random(int(counts.sum())) * np.repeat(lengths, counts)
        times = np.repeat(starts, counts) + offsets
        return np.sort(times)
