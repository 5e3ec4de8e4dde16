"""Traffic profiles for load tests and capacity planning, and the requests they generate.

A :class:`TrafficProfile` is what the seed's load-test method (section 6.2) asks
to collect from production: the P50/P90/P99 of input and output lengths, the
arrival rate and how bursty it is, plus the priority mix and SLAs of this
project. :func:`generate` turns a profile into concrete requests; output
lengths are drawn from the real distribution, about 1 % of them deliberately
very long, and become each request's ``max_tokens`` (never one fixed value:
DESIGN.md pitfall 5). Prompts put a stable prefix first (pitfall 3).

Profiles live in ``conf/profiles/<name>.yaml``; :func:`load_profile` finds them.

Example:
    >>> import numpy as np
    >>> profile = load_profile("cpu-small")
    >>> reqs = generate(profile, duration_s=10, seed=1)
    >>> all(r.prompt.startswith(profile.stable_prefix) for r in reqs)
    True
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import yaml

from sidecar.config import as_dataclass

logger = logging.getLogger(__name__)

ArrivalKind = Literal["poisson", "bursty"]

PRIORITY_NAMES: tuple[str, ...] = ("high", "normal", "low")

PROFILES_DIR = Path(__file__).resolve().parents[1] / "conf" / "profiles"
"""Where bare profile names resolve (``<repo>/conf/profiles``)."""

DEFAULT_STABLE_PREFIX = (
    "You are a support assistant for an online shop. Read the customer's ticket below and "
    "reply in a short, polite message: answer the question if you can, otherwise say what "
    "happens next and when. Do not invent order numbers, dates or refunds.\n\n"
)

# Per-event filler; sentences are drawn at random to pad a ticket to its target length.
_TICKET_SENTENCES: tuple[str, ...] = (
    "My order has not arrived yet and the tracking page has not changed for four days.",
    "The headphones I bought last month stopped charging after a week.",
    "I was charged twice for the same order, please refund one of the payments.",
    "Someone changed the email address on my account without my permission.",
    "The parcel arrived damaged and two of the glasses inside are broken.",
    "Can I change the delivery address? I am moving at the end of the week.",
    "The discount code from your newsletter is rejected at checkout.",
    "I returned the jacket three weeks ago and still have not received my money.",
    "The size guide says medium but the shirt is far too small.",
    "Your app logs me out every time I open the order history.",
    "I would like to cancel my subscription before the next billing date.",
    "The invoice shows the wrong company name, I need a corrected copy.",
    "The courier left the package at a neighbour I do not know.",
    "Is the blue version of this backpack coming back in stock soon?",
    "I received someone else's order, what should I do with it?",
    "The warranty card is missing from the box of my coffee machine.",
)


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")


def _normal_cdf(x: float) -> float:
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
            _check_int(name, getattr(self, name), 1)
        if not self.p50 < self.p90 < self.p99:
            raise ValueError(f"percentiles must increase: {self.p50=}, {self.p90=}, {self.p99=}")
        if isinstance(self.long_share, bool) or not 0 <= self.long_share < 1:
            raise ValueError(f"{self.long_share=} must be in [0, 1)")
        if self.cap is None:
            self.cap = self.long_tokens if self.long_tokens is not None else 4 * self.p99
        _check_int("cap", self.cap, self.p99)
        if self.long_tokens is None:
            self.long_tokens = min(4 * self.p99, self.cap)
        _check_int("long_tokens", self.long_tokens, self.p99)
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
            >>> int(d.sample(np.random.default_rng(0), 1000).max()) <= 128
            True
        """
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
        body = (_normal_cdf(a) + self.cap * (1.0 - _normal_cdf(b))
                + math.exp(mu + sigma ** 2 / 2) * (_normal_cdf(b - sigma) - _normal_cdf(a - sigma)))
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
        t = np.asarray(t, dtype=float)
        if self.kind == "poisson":
            return np.zeros(t.shape, dtype=bool)
        return np.mod(t, self.burst_period_s) < self.burst_duty * self.burst_period_s

    def _segments(self, duration_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Starts, lengths and rates of the constant-rate pieces covering ``[0, duration_s)``."""
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
            >>> t = ArrivalProcess(rate_per_s=50).arrival_times(np.random.default_rng(0), 10)
            >>> bool(np.all(np.diff(t) >= 0)) and 400 < len(t) < 600
            True
        """
        if not duration_s > 0:
            raise ValueError(f"{duration_s=} must be positive")
        starts, lengths, rates = self._segments(float(duration_s))
        counts = rng.poisson(rates * lengths)
        offsets = rng.random(int(counts.sum())) * np.repeat(lengths, counts)
        times = np.repeat(starts, counts) + offsets
        return np.sort(times)


def _default_input_tokens() -> LengthDistribution:
    return LengthDistribution(p50=300, p90=700, p99=1500, long_share=0.0, cap=3000)


@dataclass
class TrafficProfile:
    """What production traffic looks like: arrivals, lengths, priorities and SLAs.

    Nested sections may be given as mappings (as read from YAML); unknown keys
    are errors. ``priority_mix`` is normalised to sum to 1.

    Example:
        >>> p = TrafficProfile.from_dict({"name": "x", "arrivals": {"rate_per_s": 5}})
        >>> p.effective_peak_qps, p.with_rate(10).arrivals.rate_per_s
        (5.0, 10)
    """

    name: str = "custom"
    """Short name (the YAML file's stem when loaded from a file without one)."""

    description: str = ""
    """What the profile models and where its numbers come from."""

    arrivals: ArrivalProcess = field(default_factory=ArrivalProcess)
    """Arrival process (:class:`ArrivalProcess`)."""

    input_tokens: LengthDistribution = field(default_factory=_default_input_tokens)
    """Prompt length in tokens, stable prefix included."""

    output_tokens: LengthDistribution = field(default_factory=LengthDistribution)
    """Output length in tokens; each sample becomes a request's ``max_tokens``."""

    priority_mix: dict[str, float] = field(
        default_factory=lambda: {"high": 0.2, "normal": 0.5, "low": 0.3})
    """Share of arrivals per priority (``high``/``normal``/``low``; normalised)."""

    sla_ms: dict[str, int] = field(
        default_factory=lambda: {"high": 3000, "normal": 8000, "low": 30_000})
    """Deadline after arrival per priority, in ms; every priority in the mix needs one."""

    peak_qps: float | None = None
    """Peak request rate used for planning; ``None``: the arrival process's peak rate."""

    chars_per_token: float = 4.0
    """Characters per token, to turn input token counts into prompt lengths."""

    stable_prefix: str = DEFAULT_STABLE_PREFIX
    """Fixed instruction block that starts every prompt (prefix-cache friendly)."""

    def __post_init__(self) -> None:
        self.arrivals = as_dataclass(ArrivalProcess, self.arrivals, "arrivals")
        self.input_tokens = as_dataclass(LengthDistribution, self.input_tokens, "input_tokens")
        self.output_tokens = as_dataclass(LengthDistribution, self.output_tokens,
                                           "output_tokens")
        mix = dict(self.priority_mix or {})
        if unknown := set(mix) - set(PRIORITY_NAMES):
            raise ValueError(f"unknown priorities in priority_mix: {sorted(unknown)}; "
                             f"priorities are {PRIORITY_NAMES}")
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0
               for v in mix.values()) or not sum(mix.values()) > 0:
            raise ValueError(f"priority_mix={mix!r} needs shares >= 0 with a positive sum")
        total = float(sum(mix.values()))
        self.priority_mix = {p: mix[p] / total for p in PRIORITY_NAMES if mix.get(p, 0) > 0}
        sla = dict(self.sla_ms or {})
        if unknown := set(sla) - set(PRIORITY_NAMES):
            raise ValueError(f"unknown priorities in sla_ms: {sorted(unknown)}")
        if missing := set(self.priority_mix) - set(sla):
            raise ValueError(f"sla_ms has no deadline for {sorted(missing)}")
        for p, v in sla.items():
            _check_int(f"sla_ms.{p}", v, 1)
        self.sla_ms = sla
        if self.peak_qps is not None and not self.peak_qps > 0:
            raise ValueError(f"{self.peak_qps=} must be positive (or null)")
        if not self.chars_per_token > 0:
            raise ValueError(f"{self.chars_per_token=} must be positive")
        if not isinstance(self.stable_prefix, str) or not self.stable_prefix:
            raise ValueError("stable_prefix must be a non-empty string")

    @property
    def effective_peak_qps(self) -> float:
        """``peak_qps`` if set, else the arrival process's peak rate."""
        return float(self.peak_qps if self.peak_qps is not None
                     else self.arrivals.peak_rate_per_s)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "TrafficProfile":
        """Build from a nested mapping (as read from YAML); unknown keys are errors."""
        return as_dataclass(cls, dict(data or {}), "traffic profile")

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> "TrafficProfile":
        """Read a YAML file such as ``conf/profiles/seed-200qps.yaml``."""
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a traffic profile must be a mapping")
        data.setdefault("name", Path(path).stem)
        return cls.from_dict(data)

    def with_rate(self, rate_per_s: float) -> "TrafficProfile":
        """A copy whose mean arrival rate is ``rate_per_s``; burst shape is kept and an
        explicit ``peak_qps`` is scaled by the same factor."""
        peak = None if self.peak_qps is None else \
            self.peak_qps * rate_per_s / self.arrivals.rate_per_s
        return dataclasses.replace(
            self, arrivals=dataclasses.replace(self.arrivals, rate_per_s=rate_per_s),
            peak_qps=peak)


@dataclass
class GeneratedRequest:
    """One request drawn from a profile."""

    index: int
    """Arrival order, from 0."""

    arrival_s: float
    """Seconds after the start of the run."""

    priority: str
    """``high``, ``normal`` or ``low``."""

    input_tokens: int
    """Target prompt length in tokens (the prompt has about ``input_tokens * chars_per_token``
    characters)."""

    max_tokens: int
    """Sampled output length, sent as ``max_tokens``."""

    sla_ms: int
    """Deadline after arrival, in ms."""

    prompt: str
    """``stable_prefix + content``: the full prompt."""

    content: str
    """The per-event part of the prompt (what a Spark event's ``text`` carries)."""


def _filler(rng: np.random.Generator, longest: int) -> tuple[str, np.ndarray]:
    """Random ticket sentences joined by spaces, at least ``longest`` characters past any of
    the returned start offsets (the first 256 sentence starts)."""
    shortest = min(len(s) for s in _TICKET_SENTENCES) + 1
    n = 256 + longest // shortest + 1
    picks = [_TICKET_SENTENCES[i] for i in rng.integers(0, len(_TICKET_SENTENCES), size=n)]
    starts = np.cumsum([0] + [len(s) + 1 for s in picks[:255]])
    return " ".join(picks), starts


def generate(profile: TrafficProfile, duration_s: float, seed: int = 0
             ) -> list[GeneratedRequest]:
    """Draw the requests that arrive in ``duration_s`` seconds of ``profile``'s traffic.

    Arrival times, priorities, input and output lengths and prompt text all come
    from one ``np.random.default_rng(seed)``, so a seed gives the same list
    every time. Each prompt is ``profile.stable_prefix`` followed by
    ``"(ref <index>) "`` and random ticket sentences, cut so the whole prompt
    has about ``input_tokens * chars_per_token`` characters (never less than
    the prefix plus the reference).

    Args:
        profile: The traffic profile.
        duration_s: Length of the run in seconds.
        seed: Random seed.

    Returns:
        Requests sorted by arrival.

    Example:
        >>> reqs = generate(load_profile("seed-200qps"), duration_s=1, seed=0)
        >>> len({r.max_tokens for r in reqs}) > 10
        True
    """
    rng = np.random.default_rng(seed)
    times = profile.arrivals.arrival_times(rng, duration_s)
    n = len(times)
    names = list(profile.priority_mix)
    prio = rng.choice(len(names), size=n, p=[profile.priority_mix[p] for p in names])
    inputs = profile.input_tokens.sample(rng, n)
    outputs = profile.output_tokens.sample(rng, n)
    targets = np.rint(inputs * profile.chars_per_token).astype(np.int64)
    filler, starts = _filler(rng, int(targets.max(initial=0)))
    offsets = starts[rng.integers(0, len(starts), size=n)]
    prefix = profile.stable_prefix
    out = []
    for i in range(n):
        ref = f"(ref {i:07d}) "
        body = max(0, int(targets[i]) - len(prefix) - len(ref))
        content = ref + filler[offsets[i]:offsets[i] + body]
        priority = names[prio[i]]
        out.append(GeneratedRequest(
            index=i, arrival_s=float(times[i]), priority=priority,
            input_tokens=int(inputs[i]), max_tokens=int(outputs[i]),
            sla_ms=profile.sla_ms[priority], prompt=prefix + content, content=content))
    logger.debug("Generated %s requests from profile %s (seed %s).", n, profile.name, seed)
    return out


def events_for_spark(requests: list[GeneratedRequest], start_epoch_ms: int, *,
                     id_prefix: str | None = None, include_prefix: bool = False
                     ) -> list[dict[str, Any]]:
    """Event rows for the Spark pipeline's JSON file source.

    Rows have the shape ``spark_ext/demo.py``'s ``EventReplayer`` writes
    (``event_id``, ``text``, ``priority``, ``event_ts``) plus ``max_tokens``.

    Args:
        requests: From :func:`generate`.
        start_epoch_ms: Wall-clock time of arrival 0; ``event_ts`` is
            ``start_epoch_ms + round(arrival_s * 1000)``.
        id_prefix: ``event_id`` is ``f"{id_prefix}-{index:07d}"``; default
            ``f"gen{start_epoch_ms}"``, so runs started at different times do not
            reuse ids (the pipeline derives ``request_id`` from ``event_id`` and the
            sidecar drops replayed ids).
        include_prefix: ``text`` is the whole prompt; by default it is only the
            per-event ``content``, because the pipeline's template adds its own
            stable prefix.

    Returns:
        One dict per request, in arrival order.

    Example:
        >>> reqs = generate(load_profile("cpu-small"), duration_s=5, seed=0)
        >>> sorted(events_for_spark(reqs, 0)[0])
        ['event_id', 'event_ts', 'max_tokens', 'priority', 'text']
    """
    prefix = f"gen{start_epoch_ms}" if id_prefix is None else id_prefix
    return [{"event_id": f"{prefix}-{r.index:07d}",
             "text": r.prompt if include_prefix else r.content,
             "priority": r.priority,
             "event_ts": int(start_epoch_ms) + int(round(r.arrival_s * 1000)),
             "max_tokens": r.max_tokens} for r in requests]


def available_profiles() -> list[str]:
    """Names of the profiles in :data:`PROFILES_DIR`."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name_or_path: str | os.PathLike[str]) -> TrafficProfile:
    """Load a profile by bare name (``"seed-200qps"`` -> ``conf/profiles/seed-200qps.yaml``
    next to this package) or by path (anything with a ``.yaml``/``.yml`` suffix or a
    directory part).

    Raises:
        FileNotFoundError: No such profile; the message lists the known names.
        ValueError: The file is not a valid profile.

    Example:
        >>> load_profile("bursty").arrivals.kind
        'bursty'
    """
    p = Path(name_or_path)
    is_name = p.suffix not in (".yaml", ".yml") and len(p.parts) == 1
    path = PROFILES_DIR / f"{p.name}.yaml" if is_name else p
    if not path.is_file():
        raise FileNotFoundError(f"no traffic profile {str(name_or_path)!r} (looked for {path}); "
                                f"known profiles: {available_profiles()}")
    return TrafficProfile.from_yaml(path)
