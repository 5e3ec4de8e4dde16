"""L3 spans of a traced request, written once its result row is on disk.

A request is traced when it carries a sampled ``traceparent`` attribute and tracing
is on (:func:`sidecar.otel.start_tracing`). The hot path only records times: the
servicer notes each batch's admission (:meth:`SidecarTracer.admitted`), the
scheduler each dispatch into the engine (:meth:`SidecarTracer.dispatched`). When
the result writer has made a row visible (:meth:`SidecarTracer.written`), the
request's spans are built with those times, children of the event's span::

    sts.l3.request           received .. result file visible
      sts.l3.admission       the SubmitBatch admission of its batch
      sts.l3.queue           admitted .. dispatched (or shed/expired in the queue)
      sts.l3.engine          dispatched .. finished; event ``first_token`` (TTFT)
      sts.l3.result_write    finished .. result file visible

A late ``ok`` row (``finish_and_backfill``) adds one ``sts.l3.late_result`` span.
With tracing off none of this exists: each hook is one ``is None`` check.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from sidecar.acks import Ack
from sidecar.contract import TRACEPARENT, parse_traceparent, traceparent_sampled
from sidecar.otel import Tracing, start_tracing
from sidecar.request_state import ResultRecord, SidecarRequest

logger = logging.getLogger(__name__)

_MS = 1_000_000


class SidecarTracer:
    """Times of traced requests in flight, turned into spans when their row lands.

    Args:
        tracing: The sidecar's tracer provider.
    """

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing
        self._admitted: dict[str, tuple[int, int, bool]] = {}
        """request id -> (admission start, end (epoch ns), accepted)."""
        self._dispatched: dict[str, int] = {}
        """request id -> last dispatch into the engine (epoch ns)."""

    def admitted(self, requests: Sequence[SidecarRequest], acks: Sequence[Ack],
                 start_ns: int, end_ns: int) -> None:
        """One ``SubmitBatch`` (slice) was admitted: remember its traced requests."""
        for req, ack in zip(requests, acks):
            if TRACEPARENT in req.attributes and req.request_id and not ack.duplicate:
                self._admitted[req.request_id] = (start_ns, end_ns, ack.accepted)

    def dispatched(self, req: SidecarRequest) -> None:
        """A request went into the engine (again, after a preemption)."""
        if TRACEPARENT in req.attributes:
            self._dispatched[req.request_id] = time.time_ns()

    def written(self, rows: Sequence[ResultRecord]) -> None:
        """Result rows are visible to readers: build the spans of the traced ones."""
        now = time.time_ns()
        for row in rows:
            traceparent = row.attributes.get(TRACEPARENT)
            parent = parse_traceparent(traceparent)
            if parent is None or not traceparent_sampled(traceparent):
                self._forget(row)
                continue
            try:
                if row.late:
                    self._late_span(row, parent, now)
                else:
                    self._request_spans(row, parent, now)
            except Exception:  # a span is never worth a result
                logger.debug("Could not trace %s.", row.request_id, exc_info=True)

    def _forget(self, row: ResultRecord) -> None:
        if not row.late:
            self._admitted.pop(row.request_id, None)
            self._dispatched.pop(row.request_id, None)

    def _request_spans(self, row: ResultRecord, parent: tuple[str, str], now: int) -> None:
        rid = row.request_id
        received = row.received_ts * _MS
        adm_start, adm_end, accepted = self._admitted.pop(rid, (received, received, True))
        dispatched = self._dispatched.pop(rid, None)
        finished = max(row.finish_ts * _MS, adm_end)
        span = self.tracing.span("sts.l3.request", parent=parent, start_ns=adm_start,
                                 attributes=_row_attributes(row))
        if row.status == "error":
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, row.error or "error"))
        t = self.tracing
        t.span("sts.l3.admission", parent=span, start_ns=adm_start,
               attributes={"sts.accepted": accepted}).end(end_time=adm_end)
        if accepted:
            queue_end = dispatched if dispatched is not None else finished
            t.span("sts.l3.queue", parent=span, start_ns=adm_end,
                   attributes={"sts.dispatched": dispatched is not None}
                   ).end(end_time=max(queue_end, adm_end))
        if dispatched is not None:
            engine = t.span("sts.l3.engine", parent=span, start_ns=dispatched,
                            attributes={"sts.output_tokens": row.output_tokens,
                                        "sts.cached_tokens": row.cached_tokens})
            if row.first_token_ts is not None:
                engine.add_event("first_token", {"sts.ttft_ms": row.ttft_ms or 0.0},
                                 timestamp=max(row.first_token_ts * _MS, dispatched))
            engine.end(end_time=max(finished, dispatched))
        t.span("sts.l3.result_write", parent=span, start_ns=finished).end(
            end_time=max(now, finished))
        span.end(end_time=max(now, finished))

    def _late_span(self, row: ResultRecord, parent: tuple[str, str], now: int) -> None:
        start = (row.first_token_ts or row.received_ts) * _MS
        self.tracing.span("sts.l3.late_result", parent=parent, start_ns=start,
                          attributes=_row_attributes(row)).end(end_time=max(now, start))

    def shutdown(self) -> None:
        """Export what is left (after the last result file)."""
        self.tracing.shutdown()


def _row_attributes(row: ResultRecord) -> dict[str, str | int | bool]:
    return {"sts.request_id": row.request_id, "sts.status": row.status,
            "sts.reason": row.reason, "sts.priority": row.priority,
            "sts.sidecar_id": row.sidecar_id, "sts.prompt_tokens": row.prompt_tokens,
            "sts.late": row.late}


def sidecar_tracer() -> SidecarTracer | None:
    """The sidecar's tracer when the ``OTEL_*`` variables switch tracing on, else ``None``."""
    tracing = start_tracing("sidecar", "sts-sidecar")
    return SidecarTracer(tracing) if tracing is not None else None
