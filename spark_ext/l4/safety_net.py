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
