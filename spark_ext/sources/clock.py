"""A clock for the answers query: a micro-batch exactly when a fallback falls due.

The ledger (:mod:`spark_ext.l4.ledger`) gives an accepted request its fallback when no
answer came by ``deadline + grace``; it can only do so in a micro-batch, and with
nothing arriving (the sidecar is down, the traffic stopped) Spark runs none. Spark's
own processing-time timers would run a micro-batch after every micro-batch forever
(``transformWithState`` in processing time), which on a small machine is a core spent
idling. This source ticks only when needed: the answers query's writer leaves the
next due time of every ledger bucket in a small hint file (:func:`write_hint`), and
the source offers one tick row per bucket once that time has passed, or once at
start when there is no hint yet. With nothing watched it never ticks.

Usage::

    register_clock_source(spark)
    ticks = (spark.readStream.format("sts_clock").option("hintPath", "/tmp/hint.json")
             .option("bucketIds", "2,0").load())
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from spark_ext.sources.runner_exit import quiet_runner_shutdown

#: Name to use in ``spark.readStream.format(...)``.
SOURCE_NAME = "sts_clock"
#: Rows of a tick: one per ledger bucket.
SCHEMA = "bucket INT, tick_ms BIGINT"


def read_hint(path: str) -> dict[str, int | None] | None:
    """Bucket -> its next due time (epoch ms; ``None``: nothing watched), or ``None``
    when there is no readable hint."""
    try:
        return {str(k): v for k, v in json.loads(Path(path).read_text("utf-8")).items()}
    except (OSError, ValueError, AttributeError):
        return None


def write_hint(path: str, due: dict[int, int | None]) -> None:
    """Merge ``due`` (bucket -> next due time) into the hint at ``path`` (buckets not
    named keep theirs), written whole by a rename.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "hint.json")
        >>> write_hint(p, {0: 5, 1: None}); write_hint(p, {1: 7})
        >>> read_hint(p)
        {'0': 5, '1': 7}
    """
    merged = read_hint(path) or {}
    merged.update({str(k): v for k, v in due.items()})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    temp = f"{path}.{os.getpid()}.tmp"
    Path(temp).write_text(json.dumps(merged), "utf-8")
    os.replace(temp, path)


def next_tick(hint: dict[str, int | None] | None, *, now_ms: int, ticked: bool) -> bool:
    """Whether the clock ticks now: some bucket's fallback is due, or there is no hint
    and this source has not ticked yet (a restart: the ledger may hold due requests).

    Example:
        >>> next_tick({"0": 100, "1": None}, now_ms=150, ticked=True)
        True
        >>> next_tick({"0": 200, "1": None}, now_ms=150, ticked=True)
        False
        >>> next_tick(None, now_ms=150, ticked=False), next_tick(None, now_ms=150, ticked=True)
        (True, False)
    """
    if hint is None:
        return not ticked
    return any(due is not None and due <= now_ms for due in hint.values())


class ClockStreamReader(SimpleDataSourceStreamReader):
    """Offsets: ``{"tick": <epoch ms of the last tick>}``; read on the driver."""

    def __init__(self, options: dict[str, str]) -> None:
        options = {k.lower(): v for k, v in options.items()}
        self.hint_path = options["hintpath"]
        self.buckets = [int(b) for b in options.get("bucketids", "0").split(",")]
        self.min_gap_ms = int(options.get("mingapms", "250"))
        self.every_ms = int(options.get("everyms", "0"))
        self._ticked = False
        self._last = 0

    def initialOffset(self) -> dict:
        return {"tick": 0}

    def _rows(self, tick: int) -> Iterator[tuple]:
        return iter([(b, tick) for b in self.buckets])

    def read(self, start: dict) -> tuple[Iterator[tuple], dict]:
        now = int(time.time() * 1000)
        periodic = self.every_ms > 0 and now - self._last >= self.every_ms
        if now - self._last >= self.min_gap_ms and (periodic or next_tick(
                read_hint(self.hint_path), now_ms=now, ticked=self._ticked)):
            self._ticked, self._last = True, now
            return self._rows(now), {"tick": now}
        return iter([]), start

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple]:
        return self._rows(end["tick"]) if end["tick"] > start["tick"] else iter([])

    def commit(self, end: dict) -> None:
        pass


class ClockDataSource(DataSource):
    """``spark.readStream.format("sts_clock")``: options ``hintPath`` (required),
    ``bucketIds`` (the ledger's bucket keys, comma-separated: one row per key and
    tick; default ``0``), ``minGapMs`` (the least time between two ticks, default
    250) and ``everyMs`` (also tick at least this often, hint or not: for an answers
    query whose sink writes no hint, e.g. a user's own Kafka or ``foreachBatch`` sink;
    default 0, off)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA

    def simpleStreamReader(self, schema: object) -> SimpleDataSourceStreamReader:
        quiet_runner_shutdown()
        if not self.options.get("hintPath") and not self.options.get("hintpath"):
            raise ValueError("the sts_clock source needs option('hintPath', <file>)")
        return ClockStreamReader(dict(self.options))


def register_clock_source(spark: object) -> None:
    """Make ``format("sts_clock")`` available on ``spark`` (idempotent)."""
    spark.dataSource.register(ClockDataSource)  # type: ignore[attr-defined]
