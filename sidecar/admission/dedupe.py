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

Each id also keeps a 16-bit fingerprint of its request's prompt and ``max_tokens``
(:func:`fingerprint`): a repeat whose fingerprint differs is no replay but another
request under the same id (a client's key columns that are not unique), marked
``id_conflict`` on its ack. It still gets the first one's decision (one id, one answer);
1 in 65,536 such conflicts goes unnoticed. The fingerprint makes each id's decision an int
of its own (no longer a shared small int): 159 MB at 1M ids, 189 MB after 2M (the same
benchmark, fingerprints included; 129 MB without them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sidecar.acks import Ack
from sidecar.contract import Priority, RefusalReason

_PRIORITY_CODES = {None: 0, **{p: int(p) for p in Priority}}
#: A code: ``fingerprint * _DECISIONS + reason * 4 + priority``.
_DECISIONS = 4 * (max(int(r) for r in RefusalReason) + 1)
_PRIORITY_BY_CODE = {code: p for p, code in _PRIORITY_CODES.items()}
_REASONS = {int(r): r for r in RefusalReason}


class _Fingerprinted(Protocol):
    prompt: str
    max_tokens: int


def fingerprint(request: _Fingerprinted) -> int:
    """A 16-bit digest of what a replay repeats exactly: the prompt and ``max_tokens``
    (stable within one sidecar process, which is as long as its window lives)."""
    return hash((request.prompt, request.max_tokens)) & 0xFFFF


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
        >>> _ = w.remember(Ack("e", True), fingerprint=7)
        >>> w.replay("e", 6, fingerprint=7).id_conflict, w.replay("e", 6, fingerprint=8).id_conflict
        (False, True)
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

    def remember(self, ack: Ack, priority: Priority | None = None, *,
                 fingerprint: int = 0) -> Ack:
        """Record ``ack`` (about a request of ``priority`` whose :func:`fingerprint` is
        ``fingerprint``) as the decision for its id; return it."""
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
        self._codes[rid] = (fingerprint * _DECISIONS + reason * 4
                            + _PRIORITY_CODES.get(priority, 0))
        return ack

    def replay(self, request_id: str, received_ts: int, *,
               fingerprint: int | None = None) -> Ack:
        """The ack of a repeated id: the first decision, marked ``duplicate``, and
        ``id_conflict`` when ``fingerprint`` (this copy's) differs from the first copy's.
        An id that has left the window was admitted long ago, so it counts as accepted."""
        code = self._codes.get(request_id)
        conflict = (code is not None and fingerprint is not None
                    and code // _DECISIONS != fingerprint)
        ack = self._ack(request_id, code or 0, received_ts, duplicate=True)
        if conflict:
            ack.id_conflict = True
        return ack

    def _ack(self, request_id: str, code: int, received_ts: int, *, duplicate: bool) -> Ack:
        reason_value, priority_code = divmod(code % _DECISIONS, 4)
        if reason_value == 0:
            return Ack(request_id, True, duplicate=duplicate, received_ts=received_ts)
        reason = _REASONS[reason_value]
        priority = _PRIORITY_BY_CODE.get(priority_code)
        return Ack(request_id, False, reason, f"first submission was refused: {reason}",
                   duplicate=duplicate, received_ts=received_ts,
                   fallback_text=self._fallback_text(priority))
