"""The safety net: accepted requests whose result never comes still get an answer.

The sidecar writes one terminal row per accepted request by its deadline, so the
answers normally come from the result stream alone. When no row comes (the sidecar
was killed, a result file was lost), nothing in the stream would ever fire, and a
watermark-driven join waits for data that is not coming. So the net runs on
processing time: the submit query hands it every accepted request, and a driver
thread answers, ``grace_ms`` after the deadline, each one still unanswered with the
fallback (``status = timeout``, ``reason = no_result``). A result that arrives
later backfills that answer. After a restart the net is refilled from the
``requests`` table.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping

from sidecar.contract import now_ms
from spark_ext.l4.answer_store import AnswerStore
from spark_ext.l4.answers import answers_for_lost

logger = logging.getLogger(__name__)

#: What the net keeps of a request (the answer row needs these; ``kb_ids`` only with L2).
KEPT_COLUMNS = ("request_id", "trace_id", "priority", "enqueue_ts", "submit_ts", "deadline_ts",
                "kb_ids")


class SafetyNet:
    """Answers accepted requests that have no answer by ``deadline_ts + grace_ms``.

    Args:
        store: Where answers go (its ledger says what is answered).
        grace_ms: How long after the deadline a result may still come.
        fallback_text: The answer for lost requests.
        app_id: Delta app-transaction id of the net's writes.
    """

    def __init__(self, store: AnswerStore, *, grace_ms: int, fallback_text: str,
                 app_id: str) -> None:
        self.store = store
        self.grace_ms = grace_ms
        self.fallback_text = fallback_text
        self.app_id = app_id
        self.lost = 0
        self._heap: list[tuple[int, int, dict]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._version = now_ms()  # app-transaction versions only need to increase

    def watch(self, requests: Iterable[Mapping]) -> None:
        """Start watching accepted requests (rows with at least :data:`KEPT_COLUMNS`
        and the store's key columns)."""
        keep = (*KEPT_COLUMNS, *self.store.key_columns)
        with self._lock:
            for r in requests:
                due = int(r["deadline_ts"]) + self.grace_ms
                heapq.heappush(self._heap, (due, next(self._seq), {k: r.get(k) for k in keep}))

    @property
    def watching(self) -> int:
        return len(self._heap)

    def unanswered(self) -> int:
        """Watched requests that have no answer yet (the work still out)."""
        with self._lock:
            ids = [entry[2]["request_id"] for entry in self._heap]
        return sum(1 for rid in ids if self.store.answered(rid) is None)

    def sweep(self, now: int | None = None) -> int:
        """Answer every watched request that is due and still unanswered; return how many."""
        now = now if now is not None else now_ms()
        due: list[dict] = []
        with self._lock:
            while self._heap and self._heap[0][0] <= now:
                due.append(heapq.heappop(self._heap)[2])
        lost = [r for r in due if self.store.answered(r["request_id"]) is None]
        if not lost:
            return 0
        rows = answers_for_lost(lost, key_columns=self.store.key_columns,
                                fallback_text=self.fallback_text)
        self._version = max(self._version + 1, now)
        written = self.store.record_answers(rows, app_id=self.app_id, version=self._version)
        self.lost += written
        if written:
            logger.warning("Safety net: %d accepted requests had no result %d ms after their "
                           "deadline; answered with the fallback.", written, self.grace_ms)
        return written


class TableSafetyNet:
    """The safety net for Delta on Spark (``output.writer: spark``), run where the client
    runs (the driver; a Spark Connect client): every sweep asks the tables, with no state
    handed over by the queries (their ``foreachBatch`` may run in another process), for
    the accepted requests of the last ``lookback_ms`` whose deadline plus ``grace_ms`` has
    passed and that have no answer, and merges the fallback for them into ``answers``
    (an answer that came meanwhile wins: the MERGE inserts only what is missing, and a
    result that comes later backfills). Reads are pruned to the recent ``enqueue_hour``
    partitions and, by file statistics, to the recent ``deadline_ts`` values.

    Args:
        spark: The session (classic or Spark Connect).
        tables: Where the tables are.
        grace_ms: How long after the deadline a result may still come.
        fallback_text: The answer for lost requests.
        lookback_ms: How far back each sweep looks (the first sweep after a start looks
            back ``first_lookback_ms``, to answer what a stopped pipeline left).
    """

    def __init__(self, spark, tables, *, grace_ms: int, fallback_text: str, lookback_ms: int,
                 first_lookback_ms: int) -> None:
        self.spark, self.tables = spark, tables
        self.grace_ms, self.fallback_text = grace_ms, fallback_text
        self.lookback_ms, self.first_lookback_ms = lookback_ms, first_lookback_ms
        self.lost = 0
        self.backlog = 0
        self._swept = False

    def unanswered(self) -> int:
        """Accepted requests without an answer at the last sweep (the work still out)."""
        return self.backlog

    def sweep(self, now: int | None = None) -> int:
        """Answer every accepted request that is due and still unanswered; return how many."""
        from pyspark.sql import functions as F

        from spark_ext.l4.answers import PARTITION, build_answers, hours_between

        now = now if now is not None else now_ms()
        lookback = self.lookback_ms if self._swept else self.first_lookback_ms
        low, due_by = now - lookback, now - self.grace_ms
        if not self.tables.exists(self.spark, "requests"):
            self._swept = True
            return 0
        hours = hours_between(low - lookback, now)
        requests = (self.tables.read(self.spark, "requests")
                    .where(F.col(PARTITION).isin(hours) & F.col("accepted")
                           & (F.col("deadline_ts") >= low)))
        answered = (self.tables.read(self.spark, "answers")
                    .where(F.col(PARTITION).isin(hours)).select("request_id"))
        open_ = requests.join(answered, "request_id", "left_anti")
        keep = [c for c in dict.fromkeys((*KEPT_COLUMNS, *self.tables.key_columns))
                if c in requests.columns]
        lost = open_.where(F.col("deadline_ts") <= due_by).select(*keep).toArrow()
        self.backlog = open_.count()
        self._swept = True
        if lost.num_rows == 0:
            return 0
        keys = list(self.tables.key_columns)
        rows = answers_for_lost(lost.to_pylist(), key_columns=keys,
                                fallback_text=self.fallback_text)
        metrics = self.tables.merge_answers(
            self.spark.createDataFrame(build_answers(rows, keys, now)))
        written = int(metrics.get("num_inserted_rows") or 0)
        self.lost += written
        if written:
            logger.warning("Safety net: %d accepted requests had no result %d ms after their "
                           "deadline; answered with the fallback.", written, self.grace_ms)
        return written


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
