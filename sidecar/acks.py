"""What admission answers: an :class:`Ack` per request, and the :class:`Refusal` behind a
refused one. Below :mod:`sidecar.admission`: the load model and tracing use them too."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.contract import RefusalReason


@dataclass(slots=True)
class Ack:
    """The admission answer for one request (treat it as immutable; not ``frozen``, which
    makes building one per request slower)."""

    request_id: str
    accepted: bool
    reason: RefusalReason | None = None
    detail: str = ""
    duplicate: bool = False
    received_ts: int = 0
    fallback_text: str = ""
    id_conflict: bool = False
    """A duplicate whose content differs from the first submission's: two requests
    share the id (not a replay); it gets the first one's decision and answer."""


@dataclass(frozen=True)
class Refusal:
    """A refused request: machine-readable reason plus a sentence for people."""

    reason: RefusalReason
    detail: str
    row: bool = True
    """Whether the refusal gets its result row (``shed``/``rejected``). ``False`` only
    when the result channel has no room left even for refusal rows: the ack alone
    answers the request then (as for a request without ``request_id``)."""
