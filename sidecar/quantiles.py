"""Percentiles, one definition for the sidecar, the demo, the benchmarks and the tests."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks
    (numpy's default); ``None`` for no values.

    Example:
        >>> percentile([1, 2, 3, 4], 50), percentile([5], 99), percentile([], 50)
        (2.5, 5.0, None)
    """
    data = sorted(float(v) for v in values)
    if not data:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"{q=} must be in [0, 100]")
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def percentiles(values: Iterable[float], qs: Sequence[float] = (50, 90, 99), *,
                digits: int | None = 1) -> dict[str, float | None]:
    """``{"p50": ..., "p90": ..., "p99": ...}`` of ``values`` (rounded to ``digits``).

    Example:
        >>> percentiles(range(101))
        {'p50': 50.0, 'p90': 90.0, 'p99': 99.0}
    """
    data = list(values)
    out: dict[str, float | None] = {}
    for q in qs:
        v = percentile(data, q)
        out[f"p{q:g}"] = round(v, digits) if v is not None and digits is not None else v
    return out
