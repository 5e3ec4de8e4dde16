"""The answers query's micro-batch: the ledger's output (:mod:`spark_ext.l4.ledger`) to
the tables, through whichever writer the pipeline runs (:mod:`spark_ext.l4.writers`).

In this order: the new answers (an append: what readers wait for), the backfills and
other merges, the shadow answers, then the records (``requests``, ``results``,
``dead_letters``, ``review_queue``). Each append carries the query's run and the batch
id as its Delta app transaction, so a replayed micro-batch (which the ledger decides
the same) writes nothing twice. This one query is the only writer of every table.

The object holds configuration and counters only, so it pickles to Spark Connect's
server, where it runs (and counts) in the server's Python process.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import pyarrow as pa

from sidecar.contract import now_ms
from spark_ext.l2.fast_path import FastPathStats
from spark_ext.l4.candidates import EVENTS, UNREADABLE
from spark_ext.l4.counts import PipelineCounts
from spark_ext.l4.ledger import ANSWERS, APPEND, MERGE, RECORD, SHADOW_ANSWERS, STATS
from spark_ext.l4.writers.base import TableWriter

logger = logging.getLogger(__name__)

#: Tables written from records, in order.
RECORD_TABLES = ("requests", "results", "dead_letters", "review_queue")


class _Timer:
    """Milliseconds per step of one micro-batch."""

    def __init__(self) -> None:
        import time

        self._clock = time.perf_counter
        self._last = self._clock()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = self._clock()
        self.laps[name] = round((now - self._last) * 1000, 1)
        self._last = now


@dataclass
class AnswersBatch:
    """``foreachBatch`` of ``sts-answers``.

    Args:
        writer: Who writes the tables.
        app_id: Prefix of the Delta app transaction ids (the query's run).
        record_schemas: Table -> the Spark schema of its records.
        hint_path: Where the next due times go (:mod:`spark_ext.sources.clock`).
        counts: What was written (counted where this runs).
        fast_path_stats: L1/L2's routes and retrieval hits (``None``: not counted).
    """

    writer: TableWriter
    app_id: str
    record_schemas: dict
    hint_path: str
    counts: PipelineCounts = field(default_factory=PipelineCounts)
    fast_path_stats: FastPathStats | None = None

    def __call__(self, batch, batch_id: int) -> None:
        from spark_ext.java_errors import short_java_errors

        with short_java_errors():  # a stop mid-batch: no Java stack for Spark to parse
            self._write(batch, batch_id)

    def _write(self, batch, batch_id: int) -> None:
        writer = self.writer
        timer = _Timer()
        frames = writer.frames(batch)
        try:
            summary = frames.summary()
            timer.lap("ledger")
            present = {(r["_kind"], r["_table"]) for r in summary if r.get("n")}
            merged = {}
            for table, backfill in ((ANSWERS, True), (SHADOW_ANSWERS, False)):
                if (APPEND, table) in present:
                    writer.append(table, frames.answers(table, APPEND),
                                  app_id=f"{self.app_id}/{table}", version=batch_id)
                    timer.lap(table)
                if (MERGE, table) in present:
                    merged[table] = writer.merge_answers(table, frames.answers(table, MERGE),
                                                         backfill=backfill)
                    timer.lap(f"{table}_merge")
            # One after the other: measured on 2 cores beside the other queries, commits
            # side by side took longer in all than in turn.
            for table in RECORD_TABLES:
                if (RECORD, table) in present:
                    writer.append(table, frames.records(table, self.record_schemas[table]),
                                  app_id=f"{self.app_id}/{table}", version=batch_id)
                    timer.lap(table)
            self._count(summary, merged.get(ANSWERS, {}))
        finally:
            frames.release()
        timer.lap("release")
        self.counts.conflicts_retried = writer.conflicts_retried
        timer.laps["total"] = round(sum(timer.laps.values()), 1)
        self.counts.add_batch(timer.laps, ended_ms=now_ms())
        logger.debug("Answers batch %d: %s ms.", batch_id, timer.laps)

    def _count(self, summary: list[dict], merged: dict[str, int]) -> None:
        from spark_ext.sources.clock import write_hint

        counts = self.counts
        due: dict[int, int | None] = {}
        for row in summary:
            kind, table = row["_kind"], row["_table"]
            if "payloads" in row:
                if kind == STATS:
                    for p in row["payloads"]:
                        s = json.loads(p)
                        counts.open_by_bucket[s["bucket"]] = s["open"]
                        due[s["bucket"]] = s["next_due_ts"]
                elif table == EVENTS and self.fast_path_stats is not None:
                    self.fast_path_stats.add(pa.Table.from_pylist(
                        [json.loads(p) for p in row["payloads"]]))
                elif table == UNREADABLE:
                    counts.unreadable_results += len(row["payloads"])
                    logger.warning("Skipped %d result record(s) that do not parse; their "
                                   "requests get the fallback at their deadline.",
                                   len(row["payloads"]))
                continue
            n = row["n"]
            if kind == RECORD:
                if table == "requests":
                    counts.submitted += n
                elif table == "dead_letters":
                    counts.dead_letters += n
                    logger.warning("Dead letters: %d record(s) of this micro-batch are not "
                                   "events (the dead_letters table).", n)
                continue
            if table != ANSWERS or kind not in (APPEND, MERGE):
                continue
            source, status = row["answer_source"], row["status"] or ""
            counts.by_source[source] += n
            counts.by_source_status[(source, status)] += n
            if kind == APPEND:
                counts.answers_written += n
            if status == "invalid" and row.get("reason"):
                counts.validation_failures[row["reason"]] += n
            if row.get("reason") == "no_result":
                counts.no_result_fallbacks += n
        counts.answers_written += merged.get("inserted", 0)
        counts.backfilled += merged.get("updated", 0)
        if due:
            try:
                write_hint(self.hint_path, due)
            except OSError as e:  # the clock then ticks only when data comes
                logger.warning("Cannot write the clock hint %s: %s", self.hint_path, e)
