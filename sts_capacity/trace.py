"""Production traffic from a trace file: each request's arrival time and token counts.

A trace is what the seed's load-test method asks to collect from production (section
6.2): not a P50/P90/P99 to sample from, but the requests as they came, with their
bursts. Two formats are read:

- **CSV** with a header naming ``TIMESTAMP`` (``YYYY-MM-DD HH:MM:SS[.fffffff]``, UTC),
  ``ContextTokens`` and ``GeneratedTokens``: the Azure LLM inference trace's columns;
- **JSONL**, one object per line: ``arrival_s`` (seconds from any origin) or
  ``timestamp`` (ISO 8601), ``input_tokens``, ``output_tokens``, and optionally
  ``priority`` (``high``, ``normal`` or ``low``) and ``max_tokens``.

A malformed row is a :class:`ValueError` of one line naming the file and the line. Arrival
times are kept as they are, relative to the first request; :meth:`Trace.scaled` compresses
or stretches them to a target mean rate (the bursts scale with it), :meth:`Trace.window`
cuts a stretch of it, :meth:`Trace.figures` gives what capacity planning reads from it.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "t.csv"
    >>> _ = path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\\n"
    ...                     "2023-11-16 18:17:03.50,100,10\\n2023-11-16 18:17:05.50,300,30\\n")
    >>> trace = read_trace(path)
    >>> [(r.arrival_s, r.input_tokens, r.output_tokens) for r in trace.requests]
    [(0.0, 100, 10), (2.0, 300, 30)]
    >>> [r.arrival_s for r in trace.scaled(speedup=4).requests]
    [0.0, 0.5]
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sidecar.contract import PRIORITY_NAMES

#: The CSV trace's columns: arrival time, prompt tokens, output tokens.
CSV_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
#: Seconds over which :attr:`TraceFigures.peak_rate` averages arrivals (the sidecar's scale
#: signal looks at its last 60 s too).
PEAK_WINDOW_S = 60


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace."""

    arrival_s: float
    """Seconds after the trace's first request."""
    input_tokens: int
    output_tokens: int
    priority: str | None = None
    """The trace's own priority, when it has one (JSONL)."""
    max_tokens: int | None = None
    """The trace's own output budget, when it has one (JSONL)."""


@dataclass(frozen=True)
class TraceFigures:
    """What a trace says about its traffic (percentiles: linear interpolation)."""

    requests: int
    duration_s: float
    mean_rate: float
    """Requests per second over the trace."""
    peak_rate: float
    """The highest mean rate over :data:`PEAK_WINDOW_S` consecutive seconds."""
    max_per_second: int
    """The most arrivals within one second."""
    p99_per_second: float
    """The 99th percentile of arrivals per second (the seconds with none included)."""
    input_tokens: dict[str, float]
    """``p50``, ``p90``, ``p99``, ``mean`` and ``max`` of the prompt lengths."""
    output_tokens: dict[str, float]
    """The same of the output lengths."""


@dataclass(frozen=True)
class Trace:
    """The requests of a trace file, in arrival order."""

    name: str
    requests: tuple[TraceRequest, ...]

    @property
    def duration_s(self) -> float:
        """Seconds from the first arrival to the last."""
        return self.requests[-1].arrival_s - self.requests[0].arrival_s if self.requests else 0.0

    @property
    def mean_rate(self) -> float:
        """Requests per second: the gaps over the span (0 for fewer than two requests)."""
        n = len(self.requests)
        return (n - 1) / self.duration_s if n > 1 and self.duration_s > 0 else 0.0

    def scaled(self, *, speedup: float | None = None, rate: float | None = None) -> "Trace":
        """The same requests with their gaps divided by ``speedup``, or by what makes the
        mean rate ``rate`` (requests/s): the bursts keep their shape.

        Raises:
            ValueError: neither or both given, or not positive.
        """
        if (speedup is None) == (rate is None):
            raise ValueError("give one of speedup or rate")
        factor = speedup if speedup is not None else (rate or 0) / (self.mean_rate or 1)
        if not factor or factor <= 0 or not math.isfinite(factor):
            raise ValueError(f"the speed-up must be positive, got {factor!r}")
        return Trace(self.name, tuple(dataclasses.replace(r, arrival_s=r.arrival_s / factor)
                                      for r in self.requests))

    def window(self, start_s: float = 0.0, seconds: float | None = None) -> "Trace":
        """The requests arriving in ``[start_s, start_s + seconds)``, their arrival times
        made relative to ``start_s``."""
        end = math.inf if seconds is None else start_s + seconds
        return Trace(self.name, tuple(dataclasses.replace(r, arrival_s=r.arrival_s - start_s)
                                      for r in self.requests if start_s <= r.arrival_s < end))

    def figures(self) -> TraceFigures:
        """Rates, bursts and length percentiles (see :class:`TraceFigures`)."""
        if not self.requests:
            raise ValueError(f"trace {self.name} has no requests")
        per_second = Counter(int(r.arrival_s) for r in self.requests)
        seconds = [per_second.get(s, 0) for s in range(int(self.requests[-1].arrival_s) + 1)]
        window = min(PEAK_WINDOW_S, len(seconds))
        sums = [sum(seconds[:window])]
        for i in range(window, len(seconds)):
            sums.append(sums[-1] + seconds[i] - seconds[i - window])
        return TraceFigures(
            requests=len(self.requests), duration_s=round(self.duration_s, 3),
            mean_rate=self.mean_rate, peak_rate=max(sums) / window,
            max_per_second=max(seconds), p99_per_second=_percentile(sorted(seconds), 0.99),
            input_tokens=_summary([r.input_tokens for r in self.requests]),
            output_tokens=_summary([r.output_tokens for r in self.requests]))


def read_trace(path: str | Path) -> Trace:
    """Read a ``.csv`` or ``.jsonl`` trace (see the module doc).

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown suffix, a missing column, or a malformed row: one line,
            ``<file>:<line>: <what>``.
    """
    path = Path(path)
    if path.suffix == ".csv":
        rows = _csv_rows(path)
    elif path.suffix in (".jsonl", ".json"):
        rows = _jsonl_rows(path)
    else:
        raise ValueError(f"{path}: a trace is a .csv or a .jsonl file")
    parsed = list(rows)
    if not parsed:
        raise ValueError(f"{path}: the trace has no requests")
    parsed.sort(key=lambda r: r.arrival_s)  # stable: equal times keep the file's order
    first = parsed[0].arrival_s
    return Trace(path.stem, tuple(dataclasses.replace(r, arrival_s=round(r.arrival_s - first, 6))
                                  for r in parsed))


def _csv_rows(path: Path) -> Iterator[TraceRequest]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}:1: the header lacks {', '.join(missing)} "
                             f"(a CSV trace has {', '.join(CSV_COLUMNS)})")
        for row in reader:
            line = reader.line_num
            yield TraceRequest(_epoch_s(row["TIMESTAMP"], path, line),
                               _tokens(row["ContextTokens"], "ContextTokens", path, line),
                               _tokens(row["GeneratedTokens"], "GeneratedTokens", path, line))


def _jsonl_rows(path: Path) -> Iterator[TraceRequest]:
    with path.open(encoding="utf-8") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line}: not JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line}: a row is a JSON object")
            yield _json_request(row, path, line)


def _json_request(row: dict[str, Any], path: Path, line: int) -> TraceRequest:
    if "arrival_s" in row:
        arrival = row["arrival_s"]
        if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) \
                or not math.isfinite(arrival):
            raise ValueError(f"{path}:{line}: arrival_s must be a number, got {arrival!r}")
    elif "timestamp" in row:
        arrival = _epoch_s(row["timestamp"], path, line)
    else:
        raise ValueError(f"{path}:{line}: a row needs arrival_s or timestamp")
    priority = row.get("priority")
    if priority is not None and priority not in PRIORITY_NAMES:
        raise ValueError(f"{path}:{line}: priority must be one of {', '.join(PRIORITY_NAMES)}, "
                         f"got {priority!r}")
    max_tokens = row.get("max_tokens")
    return TraceRequest(
        float(arrival), _tokens(row.get("input_tokens"), "input_tokens", path, line),
        _tokens(row.get("output_tokens"), "output_tokens", path, line), priority,
        None if max_tokens is None else _tokens(max_tokens, "max_tokens", path, line,
                                                minimum=1))


def _epoch_s(text: Any, path: Path, line: int) -> float:
    """Seconds since the epoch of a ``YYYY-MM-DD HH:MM:SS[.f...]`` time (UTC unless it
    names its zone); more than six fractional digits are cut to six."""
    value = str(text).strip()
    head, dot, fraction = value.partition(".")
    if dot:
        digits = fraction.rstrip("Z")
        zone = fraction[len(digits):]
        value = f"{head}.{digits[:6]}{zone}"
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{path}:{line}: not a time: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _tokens(value: Any, name: str, path: Path, line: int, *, minimum: int = 0) -> int:
    try:
        n = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        n = None
    if n is None or n < minimum:
        raise ValueError(f"{path}:{line}: {name} must be an integer >= {minimum}, got {value!r}")
    return n


def _percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted ``values`` by linear interpolation (numpy's default)."""
    k = (len(values) - 1) * q
    low = math.floor(k)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (k - low)


def _summary(values: list[int]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": _percentile(ordered, 0.5), "p90": _percentile(ordered, 0.9),
            "p99": _percentile(ordered, 0.99), "mean": sum(ordered) / len(ordered),
            "max": ordered[-1]}


def format_figures(trace: Trace, figures: TraceFigures) -> str:
    """Two lines about a trace's traffic, as ``sts plan --trace`` prints them.

    Example:
        >>> t = Trace("t", tuple(TraceRequest(i / 2, 100, 10) for i in range(5)))
        >>> print(format_figures(t, t.figures()))  # doctest: +NORMALIZE_WHITESPACE
        Trace t: 5 requests over 2 s, mean 2 requests/s, peak 1.67 over 60 s
          (max 2 in one second)
        Input tokens P50/P90/P99 100/100/100 (mean 100); output tokens P50/P90/P99
          10/10/10 (mean 10, max 10)
    """
    i, o = figures.input_tokens, figures.output_tokens
    return "\n".join([
        f"Trace {trace.name}: {figures.requests:,} requests over {figures.duration_s:,.0f} s, "
        f"mean {figures.mean_rate:,.3g} requests/s, peak {figures.peak_rate:,.3g} over "
        f"{PEAK_WINDOW_S} s (max {figures.max_per_second} in one second)",
        f"Input tokens P50/P90/P99 {i['p50']:,.0f}/{i['p90']:,.0f}/{i['p99']:,.0f} "
        f"(mean {i['mean']:,.0f}); output tokens P50/P90/P99 "
        f"{o['p50']:,.0f}/{o['p90']:,.0f}/{o['p99']:,.0f} (mean {o['mean']:,.0f}, "
        f"max {o['max']:,.0f})"])
