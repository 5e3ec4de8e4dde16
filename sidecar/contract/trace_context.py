"""The trace context a request carries: W3C ``traceparent`` helpers, no SDK.

An event's trace context travels in the request attribute :data:`TRACEPARENT`
(W3C ``traceparent``) and comes back on its result row. Its trace id is the
request's ``trace_id`` (:func:`w3c_trace_id`), and the span id of the event's L1
span is derived from the ``request_id`` (:func:`event_span_id`), so every layer (the
Spark task, the sidecar, the answer writer and the safety net) can name the event's
span from the row alone. Setting up the OpenTelemetry SDK is :mod:`sidecar.otel`.
"""

from __future__ import annotations

import hashlib
import re

#: Request attribute carrying the event's W3C trace context (echoed on the result row).
TRACEPARENT = "traceparent"

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """``(trace_id, parent_span_id)`` of a valid W3C ``traceparent``, else ``None``.

    Example:
        >>> parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        ('4bf92f3577b34da6a3ce929d0e0e4736', '00f067aa0ba902b7')
        >>> parse_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01") is None
        True
    """
    m = _TRACEPARENT.match((value or "").strip())
    if m is None or m.group(1) == "ff" or (m.group(1) == "00" and m.group(5)):
        return None
    trace_id, span_id = m.group(2), m.group(3)
    if not int(trace_id, 16) or not int(span_id, 16):
        return None
    return trace_id, span_id


def format_traceparent(trace_id: str, span_id: str, sampled: bool = True) -> str:
    """A W3C ``traceparent`` (version ``00``).

    Example:
        >>> format_traceparent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
        '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
    """
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def traceparent_sampled(value: str) -> bool:
    """Whether a (valid) ``traceparent`` has its ``sampled`` flag set.

    Example:
        >>> traceparent_sampled("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
        False
    """
    return bool(int(value.strip()[53:55] or "0", 16) & 1)


def w3c_trace_id(trace_id: str | None, request_id: str = "") -> str:
    """The W3C trace id of a request: its ``trace_id`` when that is one already (the
    default ``trace_id`` is the ``request_id``, 32 hex digits), else a SHA-256 of it.

    Example:
        >>> w3c_trace_id("4bf92f3577b34da6a3ce929d0e0e4736")
        '4bf92f3577b34da6a3ce929d0e0e4736'
        >>> len(w3c_trace_id("ticket-7"))
        32
    """
    value = trace_id or request_id
    if _HEX32.match(value) and int(value, 16):
        return value
    return hashlib.sha256(value.encode()).hexdigest()[:32]


def event_span_id(request_id: str) -> str:
    """The span id of a request's L1 event span: derived from its ``request_id``.

    Example:
        >>> event_span_id("r1") == event_span_id("r1") != event_span_id("r2")
        True
    """
    digest = hashlib.sha256(b"sts.event:" + request_id.encode()).hexdigest()
    return digest[:16] if int(digest[:16], 16) else "0000000000000001"


def event_traceparent(trace_id: str | None, request_id: str) -> str:
    """The ``traceparent`` naming a request's L1 event span."""
    return format_traceparent(w3c_trace_id(trace_id, request_id), event_span_id(request_id))
