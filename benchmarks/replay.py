"""Replay generated events into a Spark file-source landing directory, on schedule.

Each request of :func:`benchmarks.profiles.generate` has an arrival time; a
background thread writes the events that are due every ``tick_s`` as one JSON
file (hidden temporary name, then rename, so Spark never reads half a file).
``event_ts`` is the *scheduled* arrival (epoch ms), so latency is measured from
when the event was offered, however late the writer or the reader runs.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from benchmarks.profiles import GeneratedRequest, events_for_spark

#: Spark schema of replayed events (``conf/pipeline.yaml``'s plus ``max_tokens``).
EVENT_SCHEMA = "event_id STRING, text STRING, priority STRING, event_ts LONG, max_tokens INT"


class EventReplayer(threading.Thread):
    """Writes ``requests`` into ``folder`` as they fall due.

    Attributes:
        start_ms: Epoch ms of arrival time 0 (set when the thread starts).
        offered: Events written so far.
    """

    def __init__(self, folder: Path, requests: list[GeneratedRequest], *,
                 tick_s: float = 0.2) -> None:
        super().__init__(name="event-replayer", daemon=True)
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.requests = sorted(requests, key=lambda r: r.arrival_s)
        self.tick_s = tick_s
        self.start_ms = 0
        self.offered = 0
        self._stop_event = threading.Event()
        self._events: list[dict] = []

    def schedule(self) -> list[dict]:
        """The event rows with their scheduled ``event_ts`` (valid once started)."""
        return self._events

    def run(self) -> None:
        self.start_ms = time.time_ns() // 1_000_000
        self._events = events_for_spark(self.requests, self.start_ms)
        start = time.monotonic()
        n = 0
        part = 0
        while n < len(self._events) and not self._stop_event.is_set():
            elapsed = time.monotonic() - start
            due = n
            while due < len(self._events) and self.requests[due].arrival_s <= elapsed:
                due += 1
            if due > n:
                tmp = self.folder / f".part-{part:06d}.json.tmp"
                tmp.write_text("".join(json.dumps(e) + "\n" for e in self._events[n:due]),
                               encoding="utf-8")
                tmp.rename(self.folder / f"part-{part:06d}.json")
                part += 1
                n = due
                self.offered = n
            self._stop_event.wait(self.tick_s)

    def stop(self) -> None:
        self._stop_event.set()
