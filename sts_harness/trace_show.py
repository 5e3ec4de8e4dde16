"""One trace from a spans file as an indented tree with durations (``sts trace show``)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: Span attributes printed next to a span's name, when set.
SHOWN_ATTRIBUTES = ("sts.request_id", "sts.priority", "sts.status", "sts.reason",
                    "sts.answer_source", "sts.accepted", "sts.requests")


def read_spans(path: str | Path) -> list[dict[str, Any]]:
    """The spans of a JSON-lines file written by ``sts trace receive``.

    Raises:
        ValueError: a line is not a span (names the line).
    """
    spans = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                span = json.loads(line)
                if not isinstance(span, dict) or not {"trace_id", "span_id", "name"} <= set(span):
                    raise ValueError("not a span")
            except ValueError as e:
                raise ValueError(f"line {n} is not a span ({e})") from None
            spans.append(span)
    return spans


def pick_trace(spans: list[dict[str, Any]], trace_id: str | None = None) -> str | None:
    """``trace_id`` if the file has it, else the trace with the most spans (the last
    such), or ``None``."""
    counts: dict[str, int] = defaultdict(int)
    for s in spans:
        counts[s["trace_id"]] += 1
    if trace_id is not None:
        return trace_id.lower() if trace_id.lower() in counts else None
    return max(counts, key=lambda t: counts[t]) if counts else None


def _label(span: dict[str, Any]) -> str:
    attributes = span.get("attributes") or {}
    shown = " ".join(f"{k.removeprefix('sts.')}={attributes[k]}" for k in SHOWN_ATTRIBUTES
                     if attributes.get(k) not in (None, ""))
    where = span.get("component") or span.get("service") or ""
    return f"{span['name']} [{where}]" + (f" {shown}" if shown else "")


def render_trace(spans: Iterable[dict[str, Any]], trace_id: str) -> list[str]:
    """The lines of one trace: each span indented under its parent, with its start
    (ms after the trace's first span), duration and main attributes; span events
    (``first_token``) under their span. A span whose parent is not in the file is
    shown at the top level, marked ``(parent not received)``.

    Example:
        >>> spans = [
        ...     {"trace_id": "t", "span_id": "a", "parent_span_id": "", "name": "root",
        ...      "start_ns": 0, "end_ns": 5_000_000},
        ...     {"trace_id": "t", "span_id": "b", "parent_span_id": "a", "name": "child",
        ...      "start_ns": 1_000_000, "end_ns": 3_500_000,
        ...      "events": [{"name": "first_token", "time_ns": 2_000_000}]}]
        >>> print("\\n".join(render_trace(spans, "t")))
        root []  +0.0 ms  5.0 ms
          child []  +1.0 ms  2.5 ms
            * first_token  +2.0 ms
    """
    mine = sorted((s for s in spans if s["trace_id"] == trace_id),
                  key=lambda s: (s.get("start_ns", 0), s.get("end_ns", 0)))
    if not mine:
        return []
    ids = {s["span_id"] for s in mine}
    children: dict[str, list[dict[str, Any]]] = defaultdict(list)
    roots = []
    for s in mine:
        parent = s.get("parent_span_id") or ""
        if parent and parent in ids:
            children[parent].append(s)
        else:
            roots.append(s)
    t0 = mine[0].get("start_ns", 0)
    lines: list[str] = []

    def walk(span: dict[str, Any], depth: int) -> None:
        pad = "  " * depth
        start, end = span.get("start_ns", 0), span.get("end_ns", 0)
        orphan = " (parent not received)" if depth == 0 and span.get("parent_span_id") else ""
        lines.append(f"{pad}{_label(span)}  +{(start - t0) / 1e6:.1f} ms  "
                     f"{(end - start) / 1e6:.1f} ms{orphan}")
        for e in span.get("events") or []:
            lines.append(f"{pad}  * {e['name']}  +{(e['time_ns'] - t0) / 1e6:.1f} ms")
        for child in children[span["span_id"]]:
            walk(child, depth + 1)

    for root in roots:
        walk(root, 0)
    return lines
