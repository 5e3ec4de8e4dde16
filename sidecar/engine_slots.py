"""What is inside the engine, as the scheduler counts it.

:class:`EngineSlots` holds the serving task of every request inside the engine, how
many sequences that is (late work included: it keeps its slot until on-time work needs
it), the late work itself, which running requests are being cancelled (for their
deadline or for a preemption) and the number of sequences integrated over time, from
which the mean batch a request decoded in is read.
"""

from __future__ import annotations

import asyncio
import time

from sidecar.request_state import SidecarRequest


class EngineSlots:
    """The scheduler's view of the engine's sequences (changed only by the scheduler)."""

    def __init__(self) -> None:
        self.tasks: dict[str, asyncio.Task[None]] = {}
        """The serving task of each request inside the engine, by ``request_id``."""
        self.count = 0
        """Sequences inside the engine, late work included."""
        self.late: dict[str, tuple[SidecarRequest, int]] = {}
        """Late work holding an engine slot: id -> (request, output tokens its terminal
        row reported)."""
        self.expiring: set[str] = set()
        """Running requests cancelled at their deadline (``abort`` pools) whose task has
        not ended yet."""
        self.preempting: set[str] = set()
        """Running requests cancelled for preemption whose task has not ended yet."""
        self._area = 0.0
        self._area_at = time.monotonic()

    def area(self, now: float | None = None) -> float:
        """Sequences in the engine integrated over time (sequence-seconds) up to ``now``
        (``time.monotonic()``, read here unless given); the mean batch a request decoded
        in is the growth of this over its decode time (:func:`mean_batch`). Read it
        whenever :attr:`count` changes."""
        if now is None:
            now = time.monotonic()
        self._area += self.count * (now - self._area_at)
        self._area_at = now
        return self._area

    def late_victims(self) -> list[SidecarRequest]:
        """Late work in the order it gives way: lowest priority first, then the most
        overdue."""
        return sorted((r for r, _ in self.late.values()),
                      key=lambda r: (-int(r.priority or 0), r.deadline_ts))


def mean_batch(area_from: float, area_to: float, seconds: float) -> float | None:
    """The mean number of sequences between two :meth:`EngineSlots.area` readings
    ``seconds`` apart (``None`` over no time)."""
    return (area_to - area_from) / seconds if seconds > 0.0 else None
