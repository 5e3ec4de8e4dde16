"""Request lifecycle: a small enum state machine and the result record.

Every state after ``RUNNING`` is terminal, so :meth:`RequestStatus.is_finished`
is one comparison, and :data:`_FINISHED_STATUS_MAP` is the only mapping from a
terminal state to the external ``status`` string.

A request of a ``finish_and_backfill`` pool that is still generating at its
deadline becomes ``FINISHED_EXPIRED`` there (its terminal row) and is marked
:attr:`SidecarRequest.late` while generation goes on; if it completes, its one
late row comes from :meth:`ResultRecord.late_from_request`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sidecar.contract import FinishReason, Priority, RefusalReason, Status, now_ms


class RequestStatus(enum.IntEnum):
    """Where a request is. Anything after ``RUNNING`` is a finished status."""

    QUEUED = enum.auto()
    RUNNING = enum.auto()
    FINISHED_OK = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_EXPIRED = enum.auto()
    FINISHED_SHED = enum.auto()
    FINISHED_REJECTED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()

    def is_finished(self) -> bool:
        return self > RequestStatus.RUNNING

    @property
    def external(self) -> Status:
        """The ``status`` written to the result channel."""
        return _FINISHED_STATUS_MAP[self]

    @classmethod
    def refused(cls, reason: RefusalReason) -> "RequestStatus":
        """The terminal state of a request refused for ``reason``."""
        return cls.FINISHED_SHED if reason.status is Status.SHED else cls.FINISHED_REJECTED


_FINISHED_STATUS_MAP: dict[RequestStatus, Status] = {
    RequestStatus.FINISHED_OK: Status.OK,
    RequestStatus.FINISHED_LENGTH: Status.OK,
    RequestStatus.FINISHED_EXPIRED: Status.TIMEOUT,
    RequestStatus.FINISHED_SHED: Status.SHED,
    RequestStatus.FINISHED_REJECTED: Status.REJECTED,
    RequestStatus.FINISHED_ABORTED: Status.ERROR,
    RequestStatus.FINISHED_ERROR: Status.ERROR,
}

@dataclass(slots=True)
class SidecarRequest:
    """A request inside the sidecar, from admission to its terminal result."""

    request_id: str
    trace_id: str
    priority: Priority | None
    """``None`` when the wire value was not a known priority (refused at admission)."""
    enqueue_ts: int
    deadline_ts: int
    model: str
    prompt: str
    max_tokens: int
    temperature: float
    cache_key: str = ""
    callback_topic: str = ""
    seed: int | None = None
    attributes: dict[str, str] = field(default_factory=dict)
    """The event's key columns, echoed unchanged on every result row."""
    submit_ts: int = 0
    """When the Spark task sent the request (epoch ms; 0 = not set), echoed on results."""
    delivery_ms: int = 0
    """The caller's answer path (ms): its batch aims to finish this long before
    ``deadline_ts`` (:meth:`sidecar.load_control.LoadControl.delivery_ms`)."""
    received_ts: int = field(default_factory=now_ms)
    prompt_token_ids: list[int] = field(default_factory=list, repr=False)
    status: RequestStatus = RequestStatus.QUEUED
    first_token_ts: int | None = None
    finish_ts: int | None = None
    text: str = ""
    finish_reason: FinishReason | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    reason: RefusalReason | None = None
    """Why it was refused or shed, if it was."""
    fallback_text: str = ""
    """The pool's rule fallback answer, carried by a result that is not ``ok``."""
    late: bool = False
    """Its terminal ``timeout`` row is out and it is still generating for a late
    ``ok`` row (``finish_and_backfill``); it keeps its engine slot only while no
    on-time request needs one."""

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def token_footprint(self) -> int:
        """Prompt plus ``max_tokens``: what the request may occupy in the KV cache."""
        max_tokens = self.max_tokens
        return len(self.prompt_token_ids) + (max_tokens if max_tokens > 0 else 0)


@dataclass(slots=True)
class ResultRecord:
    """One row of the result channel (columns: :data:`sidecar.contract.RESULT_SCHEMA`).

    Treat it as immutable once emitted. Not ``frozen``: a frozen dataclass sets each of
    its 25 fields through ``object.__setattr__``, which doubles the cost of building the
    one record every request gets."""

    request_id: str
    trace_id: str
    status: str
    text: str
    finish_reason: str
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    enqueue_ts: int
    received_ts: int
    first_token_ts: int | None
    finish_ts: int
    ttft_ms: float | None
    tpot_ms: float | None
    error: str | None
    sidecar_id: str
    model: str
    priority: str
    deadline_ts: int
    callback_topic: str
    reason: str = ""
    fallback_text: str = ""
    attributes: dict[str, str] = field(default_factory=dict)
    submit_ts: int = 0
    late: bool = False
    """True only on the one ``ok`` row that follows a ``timeout`` row of the same
    request (``finish_and_backfill``); such a row is never terminal."""

    @classmethod
    def from_request(cls, req: SidecarRequest, sidecar_id: str) -> "ResultRecord":
        """Build the terminal row of a finished request, deriving TTFT and TPOT."""
        status = _FINISHED_STATUS_MAP.get(req.status)
        if status is None:
            raise ValueError(f"request {req.request_id!r} is not finished ({req.status.name})")
        return cls._build(req, sidecar_id, status, late=False)

    @classmethod
    def late_from_request(cls, req: SidecarRequest, sidecar_id: str) -> "ResultRecord":
        """Build the late ``ok`` row of a request whose generation finished after its
        terminal ``timeout`` row (``req.finish_ts`` and ``req.finish_reason`` are the
        generation's own)."""
        if not req.late:
            raise ValueError(f"request {req.request_id!r} is not late work")
        return cls._build(req, sidecar_id, Status.OK, late=True)

    @classmethod
    def _build(cls, req: SidecarRequest, sidecar_id: str, status: Status, *,
               late: bool) -> "ResultRecord":
        # Hot: one call per request. Enum names come from precomputed dicts (an enum's
        # ``.value``/``str()`` is a property lookup), and the fields go in positionally.
        finish_ts = req.finish_ts if req.finish_ts is not None else now_ms()
        ok = status is Status.OK
        ttft = tpot = None
        first = req.first_token_ts
        output_tokens = req.output_tokens
        if first is not None:
            ttft = float(first - req.received_ts)
            if output_tokens > 1:
                tpot = (finish_ts - first) / (output_tokens - 1)
        reason = req.reason
        finish_reason = req.finish_reason
        return cls(
            req.request_id,
            req.trace_id,
            _STATUS_TEXT[status],
            req.text if ok else "",
            _FINISH_TEXT[finish_reason] if finish_reason else "",
            len(req.prompt_token_ids),
            output_tokens,
            req.cached_tokens,
            req.enqueue_ts,
            req.received_ts,
            first,
            finish_ts,
            ttft,
            tpot,
            None if late else req.error,
            sidecar_id,
            req.model,
            _PRIORITY_TEXT.get(req.priority, ""),
            req.deadline_ts,
            req.callback_topic,
            _REASON_TEXT[reason] if reason is not None and not late else "",
            "" if ok else req.fallback_text,
            # Oversized attributes are the reason of the refusal; they are not echoed.
            # Not copied: a request's attributes are never changed after it arrives.
            {} if reason is RefusalReason.ATTRIBUTES_TOO_LARGE else req.attributes,
            req.submit_ts,
            late,
        )


_STATUS_TEXT: dict[Status, str] = {s: s.value for s in Status}
_FINISH_TEXT: dict[FinishReason, str] = {f: f.value for f in FinishReason}
_PRIORITY_TEXT: dict[Priority | None, str] = {p: str(p) for p in Priority}
_REASON_TEXT: dict[RefusalReason, str] = {r: str(r) for r in RefusalReason}
