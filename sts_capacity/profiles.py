"""Traffic profiles for load tests and capacity planning.

A :class:`TrafficProfile` is what the seed's load-test method (section 6.2) asks
to collect from production: the P50/P90/P99 of input and output lengths, the
arrival rate and how bursty it is, plus the priority mix and SLAs of this
project. The length and arrival distributions live in
:mod:`sts_capacity.distributions`; the benchmarks of a source checkout
(``benchmarks/generate.py``) turn a profile into concrete requests.

Profiles live in ``conf/profiles/<name>.yaml``; :func:`load_profile` finds them.

Example:
    >>> profile = load_profile("cpu-small")
    >>> profile.name, profile.stable_prefix.startswith("You are a support assistant")
    ('cpu-small', True)
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sts_capacity.distributions import ArrivalProcess, LengthDistribution, check_int
from sidecar import as_dataclass, conf_dir, read_yaml
from sidecar.contract import PRIORITY_NAMES

PROFILES_DIR = conf_dir() / "profiles"
"""Where bare profile names resolve (``conf/profiles`` of the checkout, or the copy an
installed wheel carries)."""

DEFAULT_STABLE_PREFIX = (
    "You are a support assistant for an online shop. Read the customer's ticket below and "
    "reply in a short, polite message: answer the question if you can, otherwise say what "
    "happens next and when. Do not invent order numbers, dates or refunds.\n\n"
)


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
            check_int(f"sla_ms.{p}", v, 1)
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
        data = read_yaml(path) or {}
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
