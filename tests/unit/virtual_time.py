"""Virtual time for in-process scheduler tests: an event loop whose clock the test owns.

:func:`run_in_virtual_time` runs a coroutine on an asyncio loop whose selector never
sleeps: when nothing is ready, it moves the clock on to the next timer instead of
waiting for it. ``time.monotonic`` (the loop's, the scheduler's and the estimator's
clock) and ``time.time_ns`` (``now_ms``, the deadlines' clock) read that clock while the
coroutine runs. The simulated engine's decode steps, the scheduler's deadline timers and
a test's ``asyncio.sleep`` calls then take exactly their nominal time, and the CPU the
scheduler itself uses takes none: the outcome is the same on an idle machine and on a
loaded 2-core one, run after run.

Only for code that does no real I/O (the simulated engine, results appended to a list):
a loop that waited on a socket would find the clock racing past its timeouts.

Example:
    >>> import asyncio
    >>> async def nap():
    ...     before = time.monotonic()
    ...     await asyncio.sleep(3600)
    ...     return time.monotonic() - before
    >>> run_in_virtual_time(nap())
    3600.0
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["VirtualClock", "run_in_virtual_time"]


class VirtualClock:
    """Seconds that pass only when :class:`_VirtualSelector` says so; epoch time is the
    real epoch at creation plus the virtual seconds since."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._start = start
        self._epoch_ns = time.time_ns()

    def monotonic(self) -> float:
        return self.now

    def time_ns(self) -> int:
        return self._epoch_ns + round((self.now - self._start) * 1e9)


class _VirtualSelector(selectors.DefaultSelector):
    """Returns what is ready at once; when nothing is, advances the clock by the loop's
    timeout (to its next timer) instead of blocking."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("virtual time: nothing is ready and no timer is due "
                               "(the coroutine waits for something that never comes)")
        self._clock.now += timeout
        return []


def run_in_virtual_time(coro: Coroutine[Any, Any, T], clock: VirtualClock | None = None) -> T:
    """Run ``coro`` to its end on a loop in virtual time (see the module docstring);
    ``time.monotonic`` and ``time.time_ns`` are restored afterwards."""
    clock = clock or VirtualClock()
    saved = time.monotonic, time.time_ns
    time.monotonic, time.time_ns = clock.monotonic, clock.time_ns  # type: ignore[assignment]
    try:
        with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(
                _VirtualSelector(clock))) as runner:
            return runner.run(coro)
    finally:
        time.monotonic, time.time_ns = saved  # type: ignore[assignment]
