"""The replayer's schedule: each event offered at its ``event_ts``, however long making
the events took."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

from sidecar.contract import now_ms
from sts_harness import replay
from sts_harness.replay import EventReplayer, FolderSink


class _Recorder(FolderSink):
    """A landing folder that also notes when each event was written (the replayer's
    clock)."""

    tick_s = 0.02

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.written_ms: dict[str, int] = {}

    def __call__(self, start_ms: int, part: int, events: list[dict]) -> None:
        super().__call__(start_ms, part, events)
        for e in events:
            self.written_ms[e["event_id"]] = replay.now_ms()


def test_events_are_offered_on_schedule_when_making_them_takes_time(tmp_path: Path,
                                                                    monkeypatch) -> None:
    """Making the events takes 5 s (the clocks jump while they are made): the event
    scheduled 5.3 s after ``start_ms`` is written 5.3 s after it, not 5 s later; the
    one due while they were made is written as soon as they are, late, never early.
    (Before: the schedule began after the events were made, so every event reached the
    pipeline that much after its ``event_ts``.)"""
    jump = SimpleNamespace(s=0.0)
    monkeypatch.setattr(replay, "time", SimpleNamespace(
        monotonic=lambda: time.monotonic() + jump.s))
    monkeypatch.setattr(replay, "now_ms", lambda: now_ms() + round(jump.s * 1000))
    arrivals = [0.0, 5.3]

    def make(start_ms: int) -> list[dict]:
        jump.s += 5.0
        return [{"event_id": str(i), "event_ts": start_ms + round(a * 1000)}
                for i, a in enumerate(arrivals)]

    sink = _Recorder(tmp_path)
    replayer = EventReplayer(sink, arrivals, make)
    replayer.start()
    replayer.join(timeout=30)
    assert not replayer.is_alive() and replayer.offered == 2
    offered = {e["event_id"]: e for f in tmp_path.glob("*.json")
               for e in map(json.loads, f.read_text().splitlines())}
    late = {i: sink.written_ms[i] - offered[i]["event_ts"] for i in offered}
    assert 0 <= late["1"] < 2500, late  # the old order: 5,000 ms
    assert 5000 <= late["0"] < 10_000, late
