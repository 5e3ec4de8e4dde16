"""Many deadlines behind one event-loop timer.

The scheduler keeps a deadline per queued request (its queue delay or its
``deadline_ts``) and per running request (its ``deadline_ts``). One asyncio
``TimerHandle`` each costs a handle object, a push onto the loop's heap and a
cancel when the request moves on, which is most of the time. :class:`DeadlineTimers`
keeps them in a heap of its own and arms a single loop timer for the earliest;
a cancelled entry is only marked and dropped when it reaches the top (or when
cancelled entries outnumber live ones). Due callbacks run in deadline order when
the loop timer fires, as their own ``call_at`` timers would have.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: Entry layout: [when (loop time), tie-breaker, callback or None once cancelled, args].
TimerEntry = list

_COMPACT_MIN = 256
"""Cancelled entries tolerated before the heap is rebuilt (when they are also the majority)."""


class DeadlineTimers:
    """A heap of ``(when, callback)`` entries served by one ``loop.call_at`` timer.

    It binds to the running event loop at its first :meth:`call_later`.

    Example:
        >>> async def demo():
        ...     timers, fired = DeadlineTimers(), []
        ...     timers.call_later(0.002, fired.append, "b")
        ...     timers.cancel(timers.call_later(0.001, fired.append, "x"))
        ...     timers.call_later(0.0, fired.append, "a")
        ...     await asyncio.sleep(0.01)
        ...     return fired
        >>> asyncio.run(demo())
        ['a', 'b']
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._heap: list[TimerEntry] = []
        self._seq = itertools.count()
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = float("inf")
        self._cancelled = 0
        self._slop = time.get_clock_info("monotonic").resolution

    def __len__(self) -> int:
        """Live (not cancelled) entries."""
        return len(self._heap) - self._cancelled

    def call_later(self, delay_s: float, callback: Callable[..., Any], *args: Any) -> TimerEntry:
        """Call ``callback(*args)`` in ``delay_s`` seconds (at once when not positive);
        returns the entry to :meth:`cancel`."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        when = self._loop.time() + delay_s
        entry = [when, next(self._seq), callback, args]
        heapq.heappush(self._heap, entry)
        if when < self._armed_at:
            self._arm(when)
        return entry

    def cancel(self, entry: TimerEntry) -> None:
        """Forget ``entry`` (a no-op when it already ran or was cancelled)."""
        if entry[2] is None:
            return
        entry[2] = None
        entry[3] = ()
        self._cancelled += 1
        if self._cancelled > _COMPACT_MIN and self._cancelled * 2 > len(self._heap):
            self._heap = [e for e in self._heap if e[2] is not None]
            heapq.heapify(self._heap)
            self._cancelled = 0

    def close(self) -> None:
        """Cancel everything (the loop timer too)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed_at = float("inf")
        for entry in self._heap:
            entry[2] = None
        self._heap.clear()
        self._cancelled = 0

    def _arm(self, when: float) -> None:
        assert self._loop is not None
        if self._handle is not None:
            self._handle.cancel()
        self._armed_at = when
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._armed_at = float("inf")
        assert self._loop is not None
        due = self._loop.time() + self._slop
        # self._heap, not a local: a callback's cancel() may rebuild the heap.
        while self._heap and self._heap[0][0] <= due:
            entry = heapq.heappop(self._heap)
            callback = entry[2]
            if callback is None:
                self._cancelled -= 1
                continue
            args = entry[3]
            entry[2], entry[3] = None, ()
            try:
                callback(*args)
            except Exception:  # one failing callback must not stop the others
                logger.exception("Deadline callback %r failed.", callback)
        while self._heap and self._heap[0][2] is None:
            heapq.heappop(self._heap)
            self._cancelled -= 1
        if self._heap and self._heap[0][0] < self._armed_at:
            self._arm(self._heap[0][0])
