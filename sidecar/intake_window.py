"""How many sequences the engine may hold when lower-priority work starts (AIMD).

A request that starts in the engine is prefilled between the decode steps of every
request already running there: on a busy engine, the prompts of ``normal`` and ``low``
work that keep starting slow the decode of the ``high`` requests beside them, however
small the batch. Under prefill-heavy traffic (long prompts, short answers: a coding
assistant's) ``high`` then misses its deadline in the engine although the dispatcher
always starts it first. The sidecar cannot see the engine's steps, but it sees each
request's own speed: when a running request falls behind its deadline at its speed but
would meet it at the speed the warm-up measured (:meth:`LoadControl.slowed_by_others
<sidecar.load_control.LoadControl.slowed_by_others>`), the window of every lower
priority is halved (at most once per :data:`DECREASE_EVERY_S`: the starts already
made need that long to show their effect); each request of a higher priority that
finishes in time widens it again by a sixteenth. A lower request starts only while the
engine holds fewer sequences than its window, so fewer prompts start beside ``high``
while it is slowed, and the engine fills again as soon as ``high`` keeps its deadlines
(TCP's congestion window, with a request's deadline as its loss signal).

On an engine that keeps up, no request falls behind and every window stays at
``max_in_flight``. Off by default: under the seed profile's mixed load the windows
narrow too far (see ``PreemptionConfig.hold_lower``).
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.contract import Priority

#: A window is halved at most once per this many seconds.
DECREASE_EVERY_S = 1.0


class IntakeWindows:
    """The window of each priority (``preemption.hold_lower``).

    Args:
        full: The widest window (the scheduler's ``max_in_flight``).
        clock: Seconds, monotonic (the estimator's clock, virtual in tests).

    Example:
        >>> t = [0.0]
        >>> w = IntakeWindows(64, clock=lambda: t[0])
        >>> w.slowed(Priority.HIGH); w.limit(Priority.NORMAL), w.limit(Priority.HIGH)
        (32, 64)
        >>> w.slowed(Priority.HIGH); w.limit(Priority.LOW)  # within DECREASE_EVERY_S
        32
        >>> w.on_time(Priority.HIGH); w.limit(Priority.LOW)
        34
    """

    def __init__(self, full: int, *, clock: Callable[[], float]) -> None:
        self.full = full
        self._clock = clock
        self._limits = dict.fromkeys(Priority, full)
        self._decreased_at = dict.fromkeys(Priority, float("-inf"))
        self.decreases = 0
        """Times a window was halved."""

    def limit(self, priority: Priority) -> int:
        """Most sequences in the engine when a ``priority`` request starts."""
        return self._limits[priority]

    def narrowed(self) -> bool:
        """Whether any window is below ``full``."""
        return any(v < self.full for v in self._limits.values())

    def slowed(self, priority: Priority) -> None:
        """A running ``priority`` request is slowed by the work starting beside it:
        halve the windows below it (at most once per :data:`DECREASE_EVERY_S` each)."""
        now = self._clock()
        for lower in Priority:
            if lower > priority and now - self._decreased_at[lower] >= DECREASE_EVERY_S:
                self._limits[lower] = max(1, self._limits[lower] // 2)
                self._decreased_at[lower] = now
                self.decreases += 1

    def on_time(self, priority: Priority) -> None:
        """A ``priority`` request finished in time: widen the windows below it by a
        sixteenth (at least one sequence), so a halved window is whole again after
        about a dozen on-time finishes, whatever the engine's size."""
        for lower in Priority:
            if lower > priority and (limit := self._limits[lower]) < self.full:
                self._limits[lower] = min(self.full, limit + max(1, limit // 16))
