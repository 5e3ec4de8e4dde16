"""A driver thread that calls a function on a fixed interval (maintenance, the health
check)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class Ticker(threading.Thread):
    """Calls ``tick()`` every ``interval_s`` until stopped; an exception is kept in
    ``error`` and ends the thread (the pipeline then stops with it)."""

    def __init__(self, name: str, interval_s: float, tick: Callable[[], object]) -> None:
        super().__init__(name=name, daemon=True)
        self.interval_s = interval_s
        self.tick = tick
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            try:
                self.tick()
            except BaseException as e:  # reported by the pipeline's health check
                logger.exception("%s failed.", self.name)
                self.error = e
                return

    def stop(self) -> None:
        self._stop_event.set()
