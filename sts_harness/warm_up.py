"""A few events through the whole pipeline before a measured replay, and how to tell their
rows apart afterwards.

A pipeline's first events pay for what is cold: the Python workers' first rows, the
first result read and answer written, the first append to each table in this driver
(Delta on Spark also compacts a table's partition on its first append in a driver: 1-3 s
of Spark jobs). On two cores that is a stall of one to three seconds of the
answers query, which a replay that starts at once measures as late answers. ``sts bench``
and ``sts demo`` send these events first, wait until every one is answered, then
replay; their rows stay in the tables (event ids starting with :data:`WARM_UP_PREFIX`)
and are left out of every figure.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sidecar import write_text_atomically

#: Event ids of warm-up events start with this.
WARM_UP_PREFIX = "warmup-"
#: Tables the pipeline writes on a schedule of its own (``output.records_interval_s``),
#: the warm-up events' records among the first.
RECORD_TABLES_WARMED = ("requests", "results")


def is_warm_up(row: dict[str, Any], key: str = "event_id") -> bool:
    """Whether an answers (or requests) row is a warm-up event's.

    Example:
        >>> is_warm_up({"event_id": "warmup-1733-0"}), is_warm_up({"event_id": "T0001-000001"})
        (True, False)
    """
    return str(row.get(key) or "").startswith(WARM_UP_PREFIX)


def warm_up_events(samples: Iterable[dict[str, Any]], now_ms: int) -> list[dict[str, Any]]:
    """``samples`` as warm-up events: their fields, an event id of :data:`WARM_UP_PREFIX`,
    the run's time and their position, and ``event_ts`` now.

    Example:
        >>> warm_up_events([{"text": "Where is my order?", "priority": "high"}], 1_000)
        [{'text': 'Where is my order?', 'priority': 'high', 'event_id': 'warmup-1000-0', \
'event_ts': 1000}]
    """
    return [{**s, "event_id": f"{WARM_UP_PREFIX}{now_ms}-{i}", "event_ts": now_ms}
            for i, s in enumerate(samples)]


def send_warm_up(target: Path | Callable[[list[dict]], None], events: list[dict]) -> None:
    """Write ``events`` as one JSON-lines file into a landing folder, or hand them to a
    function (onto a topic, say)."""
    if callable(target):
        target(events)
    else:
        write_text_atomically(target / "warmup.json",
                              "".join(json.dumps(e) + "\n" for e in events))


def wait_answered(answered: Callable[[], int], n: int, *, timeout_s: float,
                  check: Callable[[], None] = lambda: None) -> None:
    """Until ``answered()`` reaches ``n``, calling ``check`` (a pipeline's failure
    check, say) in between.

    Raises:
        TimeoutError: not answered within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while answered() < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"warm-up events not answered after {timeout_s:.0f} s")
        check()
        time.sleep(0.2)


def wait_first_writes(pipeline: Any, names: tuple[str, ...] = RECORD_TABLES_WARMED, *,
                      timeout_s: float = 60.0) -> None:
    """Until ``pipeline`` (a started :class:`~spark_ext.StsPipeline`) has written each
    table of ``names`` once: its first append in this driver is a cost of its start, not
    of the rate a run measures. The warm-up events' records reach the tables within one
    records interval (``output.records_interval_s``).

    Raises:
        TimeoutError: a table was not written within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while missing := [n for n in names if not pipeline.tables.exists(pipeline.spark, n)]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"warm-up: the pipeline did not write {missing} in "
                               f"{timeout_s:g} s")
        pipeline.check()
        time.sleep(0.5)
