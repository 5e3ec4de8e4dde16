"""Whether the sidecar takes work: the engine's health and the drain.

:class:`Lifecycle` keeps why the engine can no longer serve (set once, by the
scheduler's :meth:`~sidecar.scheduler.Scheduler.engine_failed`), the event the server
waits on to turn ``NOT_SERVING``, whether the sidecar drains for shutdown, and the
watchdog task that asks the engine every ``engine_check_interval_s``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sidecar.engines import Engine


class Lifecycle:
    """The sidecar's serving state, as admission's gate and the server read it."""

    def __init__(self) -> None:
        self.engine_error: str | None = None
        """Why the engine can no longer serve (``None`` while it is healthy)."""
        self.engine_dead = asyncio.Event()
        """Set once the engine failed: the server turns ``NOT_SERVING`` and exits."""
        self.draining = False
        """Set when the sidecar drains for shutdown: new requests are refused."""
        self._watchdog: asyncio.Task[None] | None = None

    def check(self, engine: Engine, failed: Callable[[str], None]) -> None:
        """Ask ``engine`` now; ``failed(why)`` when it no longer serves (once)."""
        if self.engine_error is None and (why := engine.failure()) is not None:
            failed(why)

    def watch(self, engine: Engine, interval_s: float, failed: Callable[[str], None]) -> None:
        """Ask ``engine`` every ``interval_s`` until it fails (inside the event loop)."""
        if self._watchdog is None:
            self._watchdog = asyncio.create_task(self._watch(engine, interval_s, failed),
                                                 name="engine-watchdog")

    async def _watch(self, engine: Engine, interval_s: float,
                     failed: Callable[[str], None]) -> None:
        while self.engine_error is None:
            await asyncio.sleep(interval_s)
            self.check(engine, failed)

    async def stop_watching(self) -> None:
        """Cancel the watchdog and wait for it."""
        if (task := self._watchdog) is not None:
            self._watchdog = None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
