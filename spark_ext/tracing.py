"""L1 and L4 spans of the Spark side (OpenTelemetry; docs/metrics.md, "Tracing").

In the Spark task (:class:`SubmitSpans`, used by :mod:`spark_ext.submit.submission`), per
``SubmitBatch`` of a micro-batch::

    sts.l1.event          one per event: enqueue_ts .. ack; the event's span (its id
                          is derived from the request id), a root span or a child of
                          the event's own traceparent column
      sts.l1.submit       the SubmitBatch call, linked to the batch's span
    sts.l1.submit_batch   one per SubmitBatch, linked to its events' spans

The request carries the event span as its ``traceparent`` attribute, so the sidecar's
L3 spans and the driver's L4 spans (:class:`AnswerSpans`: ``sts.l4.answer``,
``sts.l4.fallback``, ``sts.l4.backfill``) are its children. With tracing on, the
request's ``trace_id`` is the W3C trace id (by default the ``request_id``, which is
one already).

The driver decides: when its ``OTEL_*`` variables switch tracing on, they travel
with the submit step to the Python workers (a variable a worker already has, e.g.
from ``spark.executorEnv.OTEL_*``, wins). Tasks flush their spans when they end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sidecar import Tracing, otel_environment, start_tracing, tracing_requested
from sidecar.contract import (
    TRACEPARENT,
    attributes_problem,
    event_span_id,
    format_traceparent,
    parse_traceparent,
    w3c_trace_id,
)

logger = logging.getLogger(__name__)

_MS = 1_000_000
#: Answer sources of events answered without the sidecar (L1 rules, L2 knowledge base).
_ANSWERED_AT_L1 = frozenset({"rule", "kb"})
_providers: dict[tuple[str, frozenset[tuple[str, str]]], Tracing | None] = {}


_worker_env: dict[str, str] | None = None
"""The Python worker's own ``OTEL_*`` variables (``spark.executorEnv``), as it started."""


def _tracing(component: str, env: Mapping[str, str] | None = None) -> Tracing | None:
    """This process's tracer provider for ``component`` built from the ``OTEL_*``
    variables ``env`` (default: this process's); one per setting."""
    env = otel_environment() if env is None else dict(env)
    key = (component, frozenset(env.items()))
    if key not in _providers:
        with _otel_environment(env):  # the SDK reads its settings from os.environ
            _providers[key] = start_tracing(component, "sts-spark")
    return _providers[key]


@contextlib.contextmanager
def _otel_environment(env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with exactly these ``OTEL_*`` variables, then as it was."""
    saved = otel_environment()
    for name in saved:
        del os.environ[name]
    os.environ.update(env)
    try:
        yield
    finally:
        for name in otel_environment():
            del os.environ[name]
        os.environ.update(saved)


def driver_otel_env() -> dict[str, str]:
    """The driver's ``OTEL_*`` variables when they switch tracing on, else ``{}``."""
    return otel_environment() if tracing_requested() else {}


def task_tracing(otel_env: Mapping[str, str]) -> Tracing | None:
    """The Spark task's tracer (``None``: tracing off). ``otel_env`` (the driver's
    variables) fills in what the worker's own environment lacks; the worker's
    environment is left as it is (a reused worker serves other jobs too)."""
    global _worker_env
    if _worker_env is None:
        _worker_env = otel_environment()
    env = {**otel_env, **_worker_env}
    if not tracing_requested(env):
        return None
    return _tracing("spark-task", env)


class SubmitSpans:
    """The L1 spans of one ``SubmitBatch``: call :meth:`prepare` on the request rows
    before sending them (it sets ``trace_id`` and the ``traceparent`` attribute), then
    :meth:`end` with the acks.

    Args:
        tracing: The task's tracer.
        traceparent_column: The events' traceparent column (``""``: none).
    """

    def __init__(self, tracing: Tracing, traceparent_column: str = "") -> None:
        self.tracing = tracing
        self.traceparent_column = traceparent_column
        self._events: list[Any] = []
        self.sent_ns = 0

    def prepare(self, rows: list[dict]) -> None:
        """Start each event's span; give each row its W3C ``trace_id`` and traceparent.
        A failure to trace is logged, never raised (the requests go out untraced)."""
        try:
            self._prepare(rows)
        except Exception:
            logger.warning("Tracing the submitted requests failed.", exc_info=True)

    def _prepare(self, rows: list[dict]) -> None:
        self.sent_ns = now = time.time_ns()
        for r in rows:
            rid = r.get("request_id") or ""
            incoming = (parse_traceparent(r.get(self.traceparent_column))
                        if self.traceparent_column else None)
            trace_id = incoming[0] if incoming else w3c_trace_id(r.get("trace_id"), rid)
            span_id = event_span_id(rid)
            r["trace_id"] = trace_id
            enqueue = r.get("enqueue_ts")
            start = min(enqueue * _MS, now) if isinstance(enqueue, int) and enqueue > 0 else now
            event = self.tracing.span("sts.l1.event", parent=incoming, trace_id=trace_id,
                                      span_id=span_id, start_ns=start,
                                      attributes=_event_attributes(r))
            self._events.append(event)
            sampled = event.get_span_context().trace_flags.sampled  # OTEL_TRACES_SAMPLER
            attributes = {**r["attributes"],
                          TRACEPARENT: format_traceparent(trace_id, span_id, sampled)}
            if attributes_problem(attributes) is None:  # never refused for its traceparent
                r["attributes"] = attributes

    def end(self, accepted: Sequence[bool], reasons: Sequence[str | None], endpoint: str
            ) -> None:
        """The acks came (or the sidecar could not be reached): end the spans."""
        try:
            self._end(accepted, reasons, endpoint)
        except Exception:
            logger.warning("Tracing the submitted requests failed.", exc_info=True)

    def _end(self, accepted: Sequence[bool], reasons: Sequence[str | None], endpoint: str
             ) -> None:
        done = time.time_ns()
        t = self.tracing
        batch = t.span("sts.l1.submit_batch", start_ns=self.sent_ns,
                       attributes={"sts.requests": len(self._events), "sts.endpoint": endpoint},
                       links=[t.link(e) for e in self._events[:128]])
        for event, ok, reason in zip(self._events, accepted, reasons):
            submit = t.span("sts.l1.submit", parent=event, start_ns=self.sent_ns,
                            attributes={"sts.accepted": ok, "sts.reason": reason or ""},
                            links=[t.link(batch)])
            submit.end(end_time=done)
            event.end(end_time=done)
        batch.end(end_time=done)
        self._events = []


def _event_attributes(r: Mapping[str, Any]) -> dict[str, Any]:
    attributes = {"sts.request_id": r.get("request_id") or "",
                  "sts.priority": r.get("priority") or ""}
    if r.get("route"):
        attributes["sts.route"] = r["route"]
    return attributes


class AnswerSpans:
    """L4 spans on the driver, children of each event's span: an answer row landed
    (``sts.l4.answer``: ``llm``, ``rule``, ``kb``), a fallback (``sts.l4.fallback``) or
    a backfill (``sts.l4.backfill``).

    Args:
        tracing: The driver's tracer.
    """

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    def answered(self, rows: Iterable[Mapping[str, Any]], answered_ms: int) -> None:
        """Answer rows were appended to the ``answers`` table (a failure to trace is
        logged, never raised)."""
        try:
            self._answered(rows, answered_ms)
        except Exception:
            logger.warning("Tracing the answers failed.", exc_info=True)

    def _answered(self, rows: Iterable[Mapping[str, Any]], answered_ms: int) -> None:
        end = answered_ms * _MS
        for r in rows:
            source = r.get("answer_source") or ""
            start = next((r[c] for c in ("finish_ts", "submit_ts", "enqueue_ts")
                          if isinstance(r.get(c), int) and r[c] > 0), answered_ms) * _MS
            self._span("sts.l4.fallback" if source == "fallback" else "sts.l4.answer", r,
                       min(start, end), end, {"sts.answer_source": source,
                                              "sts.status": r.get("status") or "",
                                              "sts.reason": r.get("reason") or ""},
                       is_event=source in _ANSWERED_AT_L1)

    def backfilled(self, results: pa.Table, request_ids: Iterable[str], answered_ms: int
                   ) -> None:
        """Fallback answers were upgraded with these ``ok`` result rows."""
        try:
            self._backfilled(results, request_ids, answered_ms)
        except Exception:
            logger.warning("Tracing the backfills failed.", exc_info=True)

    def _backfilled(self, results: pa.Table, request_ids: Iterable[str], answered_ms: int
                    ) -> None:
        ids = pa.array(list(request_ids), pa.string())
        rows = results.filter(pc.is_in(results.column("request_id"), ids)).select(
            ["request_id", "trace_id", "finish_ts"]).to_pylist()
        end = answered_ms * _MS
        for r in rows:
            start = min((r["finish_ts"] or answered_ms) * _MS, end)
            self._span("sts.l4.backfill", r, start, end, {"sts.answer_source": "backfill"})

    def _span(self, name: str, r: Mapping[str, Any], start: int, end: int,
              attributes: dict[str, Any], *, is_event: bool = False) -> None:
        rid = r.get("request_id") or ""
        ids = (w3c_trace_id(r.get("trace_id"), rid), event_span_id(rid))
        attributes = {"sts.request_id": rid, **attributes}
        if is_event:  # never submitted: the answer span is the event's own span
            span = self.tracing.span(name, trace_id=ids[0], span_id=ids[1], start_ns=start,
                                     attributes=attributes)
        else:
            span = self.tracing.span(name, parent=ids, start_ns=start, attributes=attributes)
        span.end(end_time=end)

    def flush(self) -> None:
        """Start exporting the spans written so far (pipeline stop; the SDK exports the
        rest when the process exits)."""
        self.tracing.flush_soon()


def answer_spans() -> AnswerSpans | None:
    """The driver's L4 tracer when the ``OTEL_*`` variables switch tracing on."""
    tracing = _tracing("spark-driver") if tracing_requested() else None
    return AnswerSpans(tracing) if tracing is not None else None
