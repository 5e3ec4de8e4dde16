"""Replay events, on schedule, into a Spark file-source landing folder or a Kafka topic.

A background thread delivers the events that are due every ``tick_s``: to a folder as
one JSON-lines file (hidden temporary name, then rename, so Spark never reads half a
file, :class:`FolderSink`; every 200 ms, a file per tick), or to a Kafka topic as one
JSON record each, keyed by the event id (:class:`KafkaTopicSink`; every 50 ms, the
load generator's tick, the way an application produces each event as it happens). Each event's ``event_ts`` is its *scheduled* arrival
(epoch ms), so latency is measured from when the event was offered, however late the
writer or the reader runs. The demo replays the shipped tickets at a fixed rate; the
benchmarks replay generated traffic profiles.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sidecar import write_text_atomically
from sidecar.contract import now_ms

#: Spark schema of replayed events (``conf/pipeline.yaml``'s plus ``max_tokens``).
EVENT_SCHEMA = "event_id STRING, text STRING, priority STRING, event_ts LONG, max_tokens INT"


class FolderSink:
    """Due events as one JSON-lines file each time, into ``folder`` (created); files are
    named by the run's start too, so a second run into the same folder adds files,
    never replaces the first run's."""

    #: How often due events are written: a file per tick, so not too many files.
    tick_s = 0.2

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def __call__(self, start_ms: int, part: int, events: list[dict]) -> None:
        write_text_atomically(self.folder / f"part-{start_ms}-{part:06d}.json",
                              "".join(json.dumps(e) + "\n" for e in events))

    def close(self) -> None:
        pass


class KafkaTopicSink:
    """Due events as JSON records on ``topic``, keyed by ``key_field`` (idempotent
    producer; each delivery waits until the broker has the records)."""

    #: How often due events are produced: the load generator's tick (``send_on_schedule``),
    #: so an event waits on the topic's side no longer than on the sidecar's.
    tick_s = 0.05

    def __init__(self, bootstrap_servers: str, topic: str, *, key_field: str = "event_id",
                 producer: dict[str, str] | None = None) -> None:
        from confluent_kafka import Producer

        self.topic, self.key_field = topic, key_field
        self._producer = Producer({"bootstrap.servers": bootstrap_servers,
                                   "enable.idempotence": True, "linger.ms": 5,
                                   **(producer or {})})

    def __call__(self, start_ms: int, part: int, events: list[dict]) -> None:
        for e in events:
            key = e.get(self.key_field)
            self._producer.produce(self.topic, value=json.dumps(e).encode(),
                                   key=None if key is None else str(key).encode())
        self._producer.flush()

    def close(self) -> None:
        self._producer.flush()


class PacedClock:
    """A schedule's clock that runs at a changing pace: between two readings of the real
    clock it advances by the real time passed times the pace read then.

    Example:
        >>> c = PacedClock()
        >>> c.advance(2.0, 1.0); c.advance(4.0, 0.5); c.virtual_s
        3.0
        >>> c.real_s(2.5)  # scheduled at 2.5 s: reached 1 s into the half-speed part
        3.0
    """

    def __init__(self) -> None:
        self.virtual_s = 0.0
        self._real_s = 0.0
        self._pace = 1.0
        self._last_virtual = 0.0
        self._last_real = 0.0

    def advance(self, real_s: float, pace: float) -> None:
        """The real clock reads ``real_s`` (seconds since the start); ``pace`` in (0, 1]
        holds from the last reading to this one."""
        if not 0.0 < pace <= 1.0:
            raise ValueError(f"pace must be in (0, 1], not {pace}")
        self._last_virtual = self.virtual_s
        self._last_real = self._real_s
        self.virtual_s += (real_s - self._real_s) * pace
        self._real_s, self._pace = real_s, pace

    def real_s(self, virtual_s: float) -> float:
        """When the schedule's ``virtual_s`` was reached on the real clock (within the
        last advance; earlier times at the last pace)."""
        return self._last_real + max(virtual_s - self._last_virtual, 0.0) / self._pace


class EventReplayer(threading.Thread):
    """Delivers events to ``sink`` as they fall due.

    Args:
        sink: Where they go: a landing folder (a path, or a :class:`FolderSink`) or a
            :class:`KafkaTopicSink`.
        arrivals_s: Scheduled arrival of each event, seconds after the start, ascending.
        make_events: Called once at the start with the start time (epoch ms); returns
            the event rows, one per arrival, in the same order.
        tick_s: How often due events are written (default: the sink's ``tick_s``).
        pace: Called every tick: how fast the schedule runs now, in (0, 1] (1: as
            scheduled; 0.5: the rest of it half as fast). With it each event's
            ``event_ts`` is the time it is actually offered, and the replay ends after
            ``until_s`` seconds with whatever is due by then (see :class:`PacedClock`).
        until_s: With ``pace``: how long the replay runs at most (seconds).

    Attributes:
        start_ms: Epoch ms of arrival time 0 (set when the thread starts).
        offered: Events written so far.
    """

    def __init__(self, sink: Path | FolderSink | KafkaTopicSink, arrivals_s: Sequence[float],
                 make_events: Callable[[int], list[dict]], *, tick_s: float | None = None,
                 pace: Callable[[], float] | None = None, until_s: float | None = None
                 ) -> None:
        super().__init__(name="event-replayer", daemon=True)
        self.sink = sink if isinstance(sink, (FolderSink, KafkaTopicSink)) else FolderSink(sink)
        self.arrivals_s = list(arrivals_s)
        if self.arrivals_s != sorted(self.arrivals_s):
            raise ValueError("arrivals_s must be in ascending order")
        self.make_events = make_events
        self.tick_s = self.sink.tick_s if tick_s is None else tick_s
        self.pace = pace
        self.until_s = until_s
        self.start_ms = 0
        self.offered = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        # The schedule's time 0 is ``start_ms`` on both clocks, also while the events are
        # made (~0.1 s for 6,000 on a busy machine): an event due in that time is written
        # as soon as they are made, late, and its latency counts it.
        self.start_ms, start = now_ms(), time.monotonic()
        events = self.make_events(self.start_ms)
        if len(events) != len(self.arrivals_s):
            raise ValueError(f"{len(events)} events for {len(self.arrivals_s)} arrivals")
        clock = PacedClock() if self.pace is not None else None
        part = 0
        while self.offered < len(events) and not self._stop_event.is_set():
            elapsed = time.monotonic() - start
            if clock is not None:
                if self.until_s is not None and elapsed > self.until_s:
                    break
                clock.advance(elapsed, self.pace())  # type: ignore[misc]
            scheduled = elapsed if clock is None else clock.virtual_s
            due = self.offered
            while due < len(events) and self.arrivals_s[due] <= scheduled:
                due += 1
            if due > self.offered:
                batch = events[self.offered:due]
                if clock is not None:  # stamped with when each is offered, not planned
                    for e, at in zip(batch, self.arrivals_s[self.offered:due]):
                        e["event_ts"] = self.start_ms + round(clock.real_s(at) * 1000)
                self.sink(self.start_ms, part, batch)
                part += 1
                self.offered = due
            self._stop_event.wait(self.tick_s)
        self.sink.close()

    def stop(self) -> None:
        self._stop_event.set()
