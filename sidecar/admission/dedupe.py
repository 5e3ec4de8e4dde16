"""Admission step *dedupe*: the decision about each of the most recent request ids.

A replayed request (same ``request_id``, e.g. a re-run Spark micro-batch) is
answered with the first copy's decision and never generated or reported twice.
The window is bounded: the oldest ids are forgotten first.

Memory per id is small: the id string, one dict slot holding a small int (the
decision: refusal reason and priority; ints below 257 are shared objects) and one
slot of a fixed ring of ids for eviction. At the default 1M ids (32-character ids)
the window grew RSS by 129 MB, 158 MB after 2M ids passed through it
(``python -m benchmarks.dedupe_memory``; the former ``OrderedDict`` of acks: 291 MB).
A replay of a refused request repeats its reason and fallback text, not its detail.
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.acks import Ack
from sidecar.contract import Priority, RefusalReason

_PRIORITY_CODES = {None: 0, **{p: int(p) for p in Priority}}
_PRIORITY_BY_CODE = {code: p for p, code in _PRIORITY_CODES.items()}
_REASONS = {int(r): r for r in RefusalReason}


def _no_fallback(priority: Priority | None) -> str:
    return ""


class DedupeWindow:
    """The decisions about the last ``capacity`` request ids, oldest evicted first.

    Args:
        capacity: Most ids remembered.
        fallback_text: The fallback text of a priority's pool, repeated on the replay
            of a refused request.

    Example:
        >>> w = DedupeWindow(capacity=2)
        >>> for rid in ("a", "b", "c"):
        ...     _ = w.remember(Ack(rid, True))
        >>> "a" in w, "c" in w, len(w)
        (False, True, 2)
        >>> _ = w.remember(Ack("d", False, RefusalReason.QUEUE_FULL, "full"), Priority.LOW)
        >>> replay = w.replay("d", received_ts=5)
        >>> replay.accepted, replay.reason, replay.duplicate, replay.received_ts
        (False, <RefusalReason.QUEUE_FULL: 9>, True, 5)
    """

    def __init__(self, capacity: int,
                 fallback_text: Callable[[Priority | None], str] = _no_fallback) -> None:
        self.capacity = capacity
        self._fallback_text = fallback_text
        self._codes: dict[str, int] = {}
        self._ring: list[str | None] = []
        """Ids in arrival order, a ring of ``capacity`` slots once full."""
        self._next = 0

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._codes

    def __len__(self) -> int:
        return len(self._codes)

    def get(self, request_id: str) -> Ack | None:
        """The first decision about ``request_id``, if it is still in the window."""
        code = self._codes.get(request_id)
        return None if code is None else self._ack(request_id, code, 0, duplicate=False)

    def remember(self, ack: Ack, priority: Priority | None = None) -> Ack:
        """Record ``ack`` (about a request of ``priority``) as the decision for its id;
        return it."""
        rid = ack.request_id
        reason = 0 if ack.accepted or ack.reason is None else int(ack.reason)
        if rid not in self._codes:
            if len(self._ring) < self.capacity:
                self._ring.append(rid)
            else:
                old = self._ring[self._next]
                if old is not None:
                    self._codes.pop(old, None)
                self._ring[self._next] = rid
                self._next = (self._next + 1) % self.capacity
        self._codes[rid] = reason * 4 + _PRIORITY_CODES.get(priority, 0)
        return ack

    def replay(self, request_id: str, received_ts: int) -> Ack:
        """The ack of a repeated id: the first decision, marked ``duplicate``. An id
        that has left the window was admitted long ago, so it counts as accepted."""
        code = self._codes.get(request_id, 0)
        return self._ack(request_id, code, received_ts, duplicate=True)

    def _ack(self, request_id: str, code: int, received_ts: int, *, duplicate: bool) -> Ack:
        reason_value, priority_code = divmod(code, 4)
        if reason_value == 0:
            return Ack(request_id, True, duplicate=duplicate, received_ts=received_ts)
        reason = _REASONS[reason_value]
        priority = _PRIORITY_BY_CODE.get(priority_code)
        return Ack(request_id, False, reason, f"first submission was refused: {reason}",
                   duplicate=duplicate, received_ts=received_ts,
                   fallback_text=self._fallback_text(priority))
