"""The enumerations of the ``sts.v1`` contract, as Python enums.

Priorities, result statuses, refusal reasons, finish reasons and the limits on a
request's ``attributes``: what the sidecar writes and what the Spark side and the
benchmarks read. Numeric values
follow the wire enums of ``proto/sts/v1/inference.proto``; ``str()`` of each
member is the external string written into result rows and tables.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from sidecar.pb.sts.v1 import inference_pb2 as pb


class Priority(enum.IntEnum):
    """Scheduling class; lower value runs first (vLLM's polarity), as on the wire."""

    HIGH = pb.PRIORITY_HIGH
    NORMAL = pb.PRIORITY_NORMAL
    LOW = pb.PRIORITY_LOW

    def __str__(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: "str | int | Priority") -> "Priority":
        """Accept ``"high"``, ``1`` or ``Priority.HIGH``; raise ``ValueError`` otherwise.

        Example:
            >>> Priority.parse("High"), Priority.parse(3)
            (<Priority.HIGH: 1>, <Priority.LOW: 3>)
        """
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                raise ValueError(f"unknown priority {value!r}") from None
        return cls(int(value))


#: Priority names, highest first (``("high", "normal", "low")``).
PRIORITY_NAMES: tuple[str, ...] = tuple(str(p) for p in Priority)


class Status(enum.StrEnum):
    """The terminal ``status`` of a result row (wire: ``sts.v1.Status``)."""

    OK = "ok"
    TIMEOUT = "timeout"
    SHED = "shed"
    REJECTED = "rejected"
    ERROR = "error"

    @property
    def wire(self) -> int:
        """The ``sts.v1.Status`` enum value."""
        return _STATUS_WIRE[self]


_STATUS_WIRE = {Status.OK: pb.STATUS_OK, Status.TIMEOUT: pb.STATUS_TIMEOUT,
                Status.SHED: pb.STATUS_SHED, Status.REJECTED: pb.STATUS_REJECTED,
                Status.ERROR: pb.STATUS_ERROR}

#: External status strings, in the order of the wire enum.
STATUSES: tuple[str, ...] = tuple(str(s) for s in Status)


class FinishReason(enum.StrEnum):
    """Why generation ended (the result row's ``finish_reason``)."""

    STOP = "stop"
    """The model ended its answer."""
    LENGTH = "length"
    """``max_tokens`` reached."""
    TIMEOUT = "timeout"
    """The deadline passed (queued or generating)."""
    ABORT = "abort"
    """Aborted by shutdown or a caller that went away."""
    ERROR = "error"
    """The engine failed."""
    SHED = "shed"
    """Refused or dropped under load, without engine work."""
    REJECTED = "rejected"
    """Refused as invalid."""


class RefusalReason(enum.IntEnum):
    """Why admission refused a request (mirrors ``sts.v1.RefusalReason``)."""

    MISSING_REQUEST_ID = pb.REFUSAL_REASON_MISSING_REQUEST_ID
    EMPTY_PROMPT = pb.REFUSAL_REASON_EMPTY_PROMPT
    PROMPT_TOO_LONG = pb.REFUSAL_REASON_PROMPT_TOO_LONG
    MAX_TOKENS_OUT_OF_RANGE = pb.REFUSAL_REASON_MAX_TOKENS_OUT_OF_RANGE
    TEMPERATURE_OUT_OF_RANGE = pb.REFUSAL_REASON_TEMPERATURE_OUT_OF_RANGE
    UNKNOWN_PRIORITY = pb.REFUSAL_REASON_UNKNOWN_PRIORITY
    UNKNOWN_MODEL = pb.REFUSAL_REASON_UNKNOWN_MODEL
    DEADLINE_PASSED = pb.REFUSAL_REASON_DEADLINE_PASSED
    QUEUE_FULL = pb.REFUSAL_REASON_QUEUE_FULL
    DEADLINE_INFEASIBLE = pb.REFUSAL_REASON_DEADLINE_INFEASIBLE
    DRAINING = pb.REFUSAL_REASON_DRAINING
    OVERLOADED = pb.REFUSAL_REASON_OVERLOADED
    QUEUE_DELAY_EXCEEDED = pb.REFUSAL_REASON_QUEUE_DELAY_EXCEEDED
    ATTRIBUTES_TOO_LARGE = pb.REFUSAL_REASON_ATTRIBUTES_TOO_LARGE
    ENGINE_UNAVAILABLE = pb.REFUSAL_REASON_ENGINE_UNAVAILABLE
    """The engine failed; the sidecar is about to exit (status ``shed``)."""
    RESULTS_BACKLOG = pb.REFUSAL_REASON_RESULTS_BACKLOG
    """The result channel cannot take the request's result row now (status ``shed``)."""

    def __str__(self) -> str:
        return self.name.lower()

    @property
    def status(self) -> Status:
        """Invalid input is ``rejected``; refusals under load are ``shed``.

        Example:
            >>> str(RefusalReason.QUEUE_FULL.status), str(RefusalReason.EMPTY_PROMPT.status)
            ('shed', 'rejected')
        """
        return Status.SHED if self in _SHED_REASONS else Status.REJECTED


_SHED_REASONS = frozenset(
    {RefusalReason.QUEUE_FULL, RefusalReason.DEADLINE_INFEASIBLE, RefusalReason.DRAINING,
     RefusalReason.OVERLOADED, RefusalReason.QUEUE_DELAY_EXCEEDED,
     RefusalReason.ENGINE_UNAVAILABLE, RefusalReason.RESULTS_BACKLOG}
)


#: Most keys a request's ``attributes`` may have.
MAX_ATTRIBUTE_KEYS = 32
#: Most bytes a request's ``attributes`` may hold: UTF-8 keys plus values, summed.
MAX_ATTRIBUTE_BYTES = 1024


def attributes_problem(attributes: Mapping[str, str]) -> str | None:
    """Why ``attributes`` exceeds the contract's limits, or ``None`` when it fits.

    A request whose attributes do not fit is refused with
    :attr:`RefusalReason.ATTRIBUTES_TOO_LARGE` (status ``rejected``).

    Example:
        >>> attributes_problem({"ticket_id": "T-1", "customer": "c-9"}) is None
        True
        >>> attributes_problem({f"k{i}": "" for i in range(33)})
        'attributes has 33 keys; limit 32'
        >>> attributes_problem({"note": "x" * 1100})
        'attributes hold 1104 bytes (UTF-8 keys plus values); limit 1024'
    """
    if len(attributes) > MAX_ATTRIBUTE_KEYS:
        return f"attributes has {len(attributes)} keys; limit {MAX_ATTRIBUTE_KEYS}"
    size = sum(len(k.encode("utf-8")) + len(v.encode("utf-8")) for k, v in attributes.items())
    if size > MAX_ATTRIBUTE_BYTES:
        return (f"attributes hold {size} bytes (UTF-8 keys plus values); "
                f"limit {MAX_ATTRIBUTE_BYTES}")
    return None
