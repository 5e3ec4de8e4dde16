"""The de-duplication window: the admission decision of the most recent request ids.

A replayed request (same ``request_id``, e.g. a re-run Spark micro-batch) is
answered with the first copy's decision and never generated or reported twice.
The window is bounded: the oldest ids are forgotten first.
"""

from __future__ import annotations

import collections

from sidecar.admission import Ack


class DedupeWindow:
    """The last ``capacity`` acks by request id, oldest evicted first.

    Example:
        >>> w = DedupeWindow(capacity=2)
        >>> for rid in ("a", "b", "c"):
        ...     _ = w.remember(Ack(rid, True))
        >>> "a" in w, "c" in w, len(w)
        (False, True, 2)
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._acks: collections.OrderedDict[str, Ack] = collections.OrderedDict()

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._acks

    def __len__(self) -> int:
        return len(self._acks)

    def get(self, request_id: str) -> Ack | None:
        """The first decision about ``request_id``, if it is still in the window."""
        return self._acks.get(request_id)

    def remember(self, ack: Ack) -> Ack:
        """Record ``ack`` as the decision for its id; return it."""
        self._acks[ack.request_id] = ack
        while len(self._acks) > self.capacity:
            self._acks.popitem(last=False)
        return ack

    def replay(self, request_id: str, received_ts: int) -> Ack:
        """The ack of a repeated id: the first decision, marked ``duplicate``. An id
        that has left the window was admitted long ago, so it counts as accepted."""
        first = self._acks.get(request_id) or Ack(request_id, True)
        return Ack(request_id, first.accepted, first.reason, first.detail, duplicate=True,
                   received_ts=received_ts, fallback_text=first.fallback_text)
