"""The Delta tables (``requests``, ``results``, ``answers``), written so that a
micro-batch's write costs the same at 10 thousand rows as at 10 million.

- **Appends, made idempotent by Delta app transactions.** Every write of a
  ``foreachBatch`` is an append stamped with ``(app_id, version)`` = (query,
  batch id), as PySpark's ``foreachBatch`` docs recommend; a re-run batch whose
  version is already committed is skipped. No MERGE scans the table per batch.
- **One answer per request without reading the table.** An in-memory ledger of
  the ids answered in the last ``ledger_horizon_s`` decides whether a row is new
  (append), an upgrade of a fallback (backfill) or a repeat (dropped). It is
  rebuilt from the recent partitions when the pipeline starts.
- **Backfill touches the files of its rows only.** Tables are partitioned by the
  UTC hour of ``enqueue_ts`` (``enqueue_hour``), and the backfill MERGE names its
  rows' partitions and ``enqueue_ts`` range, so delta-rs skips every other file
  (appends are written in time order, so each file covers a narrow time range).
- **Maintenance on a schedule**: :meth:`AnswerStore.maintain` compacts the
  recent partitions and vacuums files older than the retention.

All writes of one store go through one lock, so the queries of a driver never
race on a commit.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from spark_ext.l4.answers import PARTITION, answer_schema, build_answers, hour_of, hours_between
from spark_ext.uris import is_local_uri, join_uri

if TYPE_CHECKING:
    from spark_ext.tracing import AnswerSpans

logger = logging.getLogger(__name__)

TABLES = ("requests", "results", "answers", "review_queue", "shadow_answers", "dead_letters")
#: Table properties of ``answers`` (both writers): the change data feed, which the
#: answers topic reads.
ANSWER_TABLE_CONFIGURATION = {"delta.enableChangeDataFeed": "true"}


def _views_to_strings(table: pa.Table) -> pa.Table:
    schema = pa.schema([f.with_type(pa.string()) if f.type == pa.string_view() else f
                        for f in table.schema])
    return table if schema == table.schema else table.cast(schema)


def with_partition(table: pa.Table) -> pa.Table:
    """``table`` with its ``enqueue_hour`` column (from ``enqueue_ts``) set."""
    hours = pa.array([hour_of(v) for v in table.column("enqueue_ts").to_pylist()], pa.string())
    if PARTITION in table.column_names:
        return table.set_column(table.schema.get_field_index(PARTITION), PARTITION, hours)
    return table.append_column(PARTITION, hours)


class AnswerLedger:
    """The ids answered in the last ``horizon_s`` seconds and how each was answered.

    Kept as flat dicts of strings and floats plus one list of ids per call, so a
    million remembered ids cost the garbage collector almost nothing (a tuple per id
    would be a million tracked objects, walked by every full collection).

    Example:
        >>> ledger = AnswerLedger(horizon_s=60)
        >>> ledger.remember_all(["a", "b"], ["llm", "fallback"], now=0.0)
        >>> ledger.remember_all(["b"], ["backfill"], now=50.0)
        >>> ledger.get("b"), len(ledger)
        ('backfill', 2)
        >>> ledger.remember_all([], [], now=100.0)  # "a" is older than the horizon
        >>> ledger.get("a"), ledger.get("b")
        (None, 'backfill')
    """

    def __init__(self, horizon_s: float) -> None:
        self.horizon_s = horizon_s
        self._source: dict[str, str] = {}
        self._at: dict[str, float] = {}
        self._batches: collections.deque[tuple[float, list[str]]] = collections.deque()

    def __len__(self) -> int:
        return len(self._source)

    def get(self, request_id: str) -> str | None:
        return self._source.get(request_id)

    def remember_all(self, request_ids: list[str], sources: list[str], *,
                     now: float | None = None) -> None:
        """Record how each id was answered, and forget ids older than the horizon."""
        now = time.monotonic() if now is None else now
        for rid, source in zip(request_ids, sources):
            self._source[rid] = sys.intern(source)
            self._at[rid] = now
        if request_ids:
            self._batches.append((now, list(request_ids)))
        cutoff = now - self.horizon_s
        while self._batches and self._batches[0][0] < cutoff:
            _, ids = self._batches.popleft()
            for rid in ids:
                if self._at.get(rid, now) < cutoff:  # not remembered again since
                    del self._at[rid]
                    del self._source[rid]


@dataclass
class StoreStats:
    """What the store did since it started (for progress lines and tests)."""

    appends: int = 0
    skipped_replays: int = 0
    answers_written: int = 0
    duplicates_dropped: int = 0
    backfilled: int = 0
    last_append_ms: float = 0.0
    compactions: int = 0
    vacuumed_files: int = 0
    by_source: collections.Counter = field(default_factory=collections.Counter)
    by_source_status: collections.Counter = field(default_factory=collections.Counter)
    """Answer rows by ``(answer_source, status)``; a backfill counts as ``(backfill, ok)``."""


class AnswerStore:
    """The three tables under ``out_dir`` and the ledger of recent answers.

    Args:
        out_dir: Folder of the tables (``<out_dir>/{requests,results,answers}``).
        key_columns: The event's key columns, kept in ``answers`` as strings.
        ledger_horizon_s: How long answered ids are remembered (de-duplication and
            backfill window; also how far back a restart looks).
        storage_options: Passed to delta-rs (``s3://``, ``abfss://`` paths).

    Usage::

        store = AnswerStore("/data/sts/tables", key_columns=["event_id"])
        store.load_ledger()
        store.record_answers(rows, app_id="q1/answers", version=batch_id)
    """

    def __init__(self, out_dir: str, *, key_columns: list[str], ledger_horizon_s: float = 3600.0,
                 storage_options: dict[str, str] | None = None) -> None:
        self.out_dir = out_dir
        self.key_columns = list(key_columns)
        self.ledger_horizon_s = ledger_horizon_s
        self.storage_options = storage_options
        self.stats = StoreStats()
        self._lock = threading.RLock()
        self._ledger = AnswerLedger(ledger_horizon_s)
        self._tables: dict[str, DeltaTable] = {}
        self.tracer: AnswerSpans | None = None
        """Writes the L4 spans of the answers (``None``: tracing off)."""

    # ----------------------------------------------------------------- tables

    def path(self, name: str) -> str:
        """Table ``name``'s location under ``out_dir`` (a path or a URI, joined as a
        string: ``s3://b/sts`` -> ``s3://b/sts/answers``)."""
        return join_uri(self.out_dir, name)

    def exists(self, name: str) -> bool:
        return DeltaTable.is_deltatable(self.path(name), storage_options=self.storage_options)

    def _table(self, name: str) -> DeltaTable:
        """The table at its latest version (loaded once, then updated incrementally, so
        the cost does not grow with the table's history)."""
        dt = self._tables.get(name)
        if dt is None:
            dt = self._tables[name] = DeltaTable(self.path(name),
                                                 storage_options=self.storage_options)
        else:
            dt.update_incremental()
        return dt

    def create_answers_table(self) -> None:
        """Create ``answers`` (empty, its documented columns, partitioned, the change
        data feed on: the answers topic reads it) unless it exists."""
        if self.exists("answers"):
            return
        schema = answer_schema(self.key_columns)
        write_deltalake(self.path("answers"), schema.empty_table(), mode="append",
                        partition_by=[PARTITION], storage_options=self.storage_options,
                        configuration=dict(ANSWER_TABLE_CONFIGURATION))

    def append(self, name: str, rows: pa.Table, *, app_id: str, version: int) -> bool:
        """Append ``rows`` to table ``name`` once per ``(app_id, version)``.

        Returns:
            ``False`` when that version was committed before (a replayed batch).
        """
        if rows.num_rows == 0:
            return True
        rows = with_partition(_views_to_strings(rows))
        with self._lock:
            if name in self._tables or self.exists(name):
                done = self._table(name).transaction_version(app_id)
                if done is not None and done >= version:
                    self.stats.skipped_replays += 1
                    return False
            start = time.perf_counter()
            target = self._tables.get(name)
            where = ({"table_or_uri": target} if target is not None else
                     {"table_or_uri": self.path(name), "storage_options": self.storage_options})
            write_deltalake(data=rows, mode="append", partition_by=[PARTITION],
                            schema_mode="merge", **where,
                            commit_properties=CommitProperties(
                                app_transactions=[Transaction(app_id, version)]))
            self.stats.last_append_ms = (time.perf_counter() - start) * 1000
            self.stats.appends += 1
        return True

    def read(self, name: str, columns: list[str] | None = None, *,
             filters: list | None = None, hours: list[str] | None = None) -> pa.Table:
        """Table ``name`` as Arrow (only ``hours`` partitions when given).

        Reads the active files with ``pyarrow.parquet``: ``DeltaTable.to_pyarrow_table``
        leaves scanner threads alive and the process aborts at exit (delta-io/delta-rs#2184).
        The tables are written by appends and MERGE (no deletion vectors), so the
        active files are the table.
        """
        if not self.exists(name):
            return pa.table({})
        dt = self._table(name)
        if not is_local_uri(self.out_dir):  # delta-rs's own file system, with the options
            dataset = dt.to_pyarrow_dataset(
                partitions=[(PARTITION, "in", hours)] if hours else None)
            table = _views_to_strings(dataset.to_table(columns=columns))
            return table.filter(pq.filters_to_expression(filters)) if filters else table
        files = (dt.file_uris(file_pruning_predicate=[(PARTITION, "in", hours)]) if hours
                 else dt.file_uris())
        if not files:  # the table's columns, no rows
            empty = pa.schema(dt.schema().to_arrow()).empty_table()
            return empty.select([c for c in columns if c in empty.column_names]) \
                if columns is not None else empty
        want = None if columns is None else [c for c in columns if c != PARTITION]
        parts = []
        for f in files:
            t = _views_to_strings(pq.read_table(f, columns=want))
            if columns is None or PARTITION in columns:
                hour = Path(f).parent.name.partition("=")[2]
                if PARTITION not in t.column_names:
                    t = t.append_column(PARTITION, pa.array([hour] * t.num_rows, pa.string()))
            parts.append(t)
        table = pa.concat_tables(parts, promote_options="permissive")
        return table.filter(pq.filters_to_expression(filters)) if filters else table

    # ----------------------------------------------------------------- ledger

    def load_ledger(self, now_ms: int | None = None) -> int:
        """Remember the answers of the last ``ledger_horizon_s`` (after a restart)."""
        now_ms = now_ms or int(time.time() * 1000)
        hours = hours_between(now_ms - int(self.ledger_horizon_s * 1000), now_ms)
        table = self.read("answers", ["request_id", "answer_source"], hours=hours)
        with self._lock:
            if table.num_rows:
                self._ledger.remember_all(table.column("request_id").to_pylist(),
                                          table.column("answer_source").to_pylist())
        logger.info("Answer ledger: %d answers of the last %.0f s.", len(self._ledger),
                    self.ledger_horizon_s)
        return len(self._ledger)

    def answered(self, request_id: str) -> str | None:
        """The ``answer_source`` of ``request_id`` if it was answered recently."""
        return self._ledger.get(request_id)

    # ----------------------------------------------------------------- answers

    def record_answers(self, rows: list[dict], *, app_id: str, version: int,
                       now_ms: int | None = None) -> int:
        """Append the rows whose request has no answer yet; return how many were written.

        Rows for ids already answered (or repeated in ``rows``) are dropped: every
        request ends with exactly one answer row.
        """
        with self._lock:
            fresh: dict[str, dict] = {}
            for row in rows:
                rid = row["request_id"]
                if rid in fresh or self.answered(rid) is not None:
                    self.stats.duplicates_dropped += 1
                    continue
                fresh[rid] = row
            if not fresh:
                return 0
            table = build_answers(list(fresh.values()), self.key_columns,
                                  now_ms or int(time.time() * 1000))
            if not self.append("answers", table, app_id=app_id, version=version):
                return 0
            self._ledger.remember_all(list(fresh), [r["answer_source"] for r in fresh.values()])
            if self.tracer is not None:
                self.tracer.answered(fresh.values(), table.column("answered_ts")[0].as_py())
            for row in fresh.values():
                self.stats.by_source[row["answer_source"]] += 1
                self.stats.by_source_status[(row["answer_source"], row.get("status") or "")] += 1
            self.stats.answers_written += len(fresh)
            return len(fresh)

    def backfill(self, results: pa.Table, now_ms: int | None = None) -> int:
        """Upgrade fallback answers with the model's text from ``ok`` result rows.

        Only ids the ledger holds as ``fallback`` are merged, and the MERGE names
        their partitions, so it reads the recent part of the table only. Returns how
        many answers were upgraded.
        """
        if results.num_rows == 0:
            return 0
        ok = results.filter(pc.equal(results.column("status"), "ok"))
        with self._lock:
            rows = {}
            for r in ok.select(["request_id", "text", "finish_ts", "received_ts",
                                "enqueue_ts"]).to_pylist():
                if self.answered(r["request_id"]) == "fallback":
                    rows.setdefault(r["request_id"], r)
            if not rows:
                return 0
            stamp = now_ms or int(time.time() * 1000)
            source = with_partition(pa.Table.from_pylist(list(rows.values())))
            hours = sorted(set(source.column(PARTITION).to_pylist()))
            in_hours = ", ".join(f"'{h}'" for h in hours)
            # Literal bounds let delta-rs skip every file outside the rows' partitions
            # and, by the files' min/max statistics, outside their enqueue times.
            first, last = (pc.min(source.column("enqueue_ts")).as_py(),
                           pc.max(source.column("enqueue_ts")).as_py())
            (self._table("answers")
             .merge(source, predicate=(f"t.{PARTITION} IN ({in_hours}) AND "
                                       f"t.enqueue_ts >= {int(first)} AND "
                                       f"t.enqueue_ts <= {int(last)} AND "
                                       f"t.{PARTITION} = s.{PARTITION} AND "
                                       "t.request_id = s.request_id"),
                    source_alias="s", target_alias="t")
             .when_matched_update(
                 updates={
                     "answer": "s.text",
                     "answer_source": "'backfill'",
                     "status": "'ok'",
                     "finish_ts": "s.finish_ts",
                     "received_ts": "s.received_ts",
                     "backfilled_at": str(stamp),
                 },
                 predicate="t.answer_source = 'fallback'")
             .execute())
            self._ledger.remember_all(list(rows), ["backfill"] * len(rows))
            if self.tracer is not None:
                self.tracer.backfilled(ok, rows, stamp)
            self.stats.backfilled += len(rows)
            self.stats.by_source["backfill"] += len(rows)
            self.stats.by_source_status[("backfill", "ok")] += len(rows)
            return len(rows)

    def unanswered_requests(self, now_ms: int | None = None) -> list[dict]:
        """Accepted requests of the ledger horizon without an answer (safety net restart)."""
        now_ms = now_ms or int(time.time() * 1000)
        hours = hours_between(now_ms - int(self.ledger_horizon_s * 1000), now_ms)
        table = self.read("requests", hours=hours)
        if table.num_rows == 0 or "accepted" not in table.column_names:
            return []
        accepted = table.filter(pc.fill_null(table.column("accepted"), False))
        return [r for r in accepted.to_pylist() if self.answered(r["request_id"]) is None]

    # ----------------------------------------------------------------- upkeep

    def maintain(self, *, vacuum_retention_hours: int, now_ms: int | None = None) -> None:
        """Compact the current and the previous hour's partitions of every table and
        vacuum files no longer referenced and older than the retention."""
        now_ms = now_ms or int(time.time() * 1000)
        hours = hours_between(now_ms - 3_600_000, now_ms)
        for name in TABLES:
            if not self.exists(name):
                continue
            with self._lock:
                dt = self._table(name)
                for hour in hours:
                    metrics = dt.optimize.compact(partition_filters=[(PARTITION, "=", hour)])
                    if metrics.get("numFilesRemoved"):
                        self.stats.compactions += 1
                removed = dt.vacuum(retention_hours=vacuum_retention_hours, dry_run=False,
                                    enforce_retention_duration=False)
                self.stats.vacuumed_files += len(removed)
