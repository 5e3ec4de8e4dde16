"""The Delta tables (``requests``, ``results``, ``answers``), written so that a
micro-batch's write costs the same at 10 thousand rows as at 10 million.

- **Appends, made idempotent by Delta app transactions.** Every write of a
  ``foreachBatch`` is an append stamped with ``(app_id, version)`` = (query,
  batch id), as PySpark's ``foreachBatch`` docs recommend; a re-run batch whose
  version is already committed is skipped. No MERGE scans the table per batch.
- **Which rows are new is the ledger's to say** (:mod:`spark_ext.l4.ledger`, in the
  answers query's state), not a table read; the store appends what it is given.
- **Backfill touches the files of its rows only.** Tables are partitioned by the
  UTC hour of ``enqueue_ts`` (``enqueue_hour``), and the backfill MERGE
  (:meth:`~spark_ext.l4.writers.deltalake.DeltalakeWriter.merge_answers`) names its
  rows' partitions and ``enqueue_ts`` range, so delta-rs skips every other file
  (appends are written in time order, so each file covers a narrow time range).
- **Maintenance on a schedule**: :meth:`AnswerStore.maintain` compacts the
  recent partitions and vacuums files older than the retention.

All writes of one store go through one lock, so the queries of a driver never
race on a commit.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from spark_ext.l4.answers import PARTITION, hour_of, hours_between
from spark_ext.l4.replays import HISTORY_LOOKBACK, append_marker, last_marked
from spark_ext.uris import is_local_uri, join_uri, local_path

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


@dataclass
class StoreStats:
    """What the store did since it started (for progress lines and tests)."""

    appends: int = 0
    skipped_replays: int = 0
    last_append_ms: float = 0.0
    compactions: int = 0
    vacuumed_files: int = 0


class AnswerStore:
    """The tables under ``out_dir``, read and written with delta-rs.

    Args:
        out_dir: Folder of the tables (``<out_dir>/{requests,results,answers,...}``).
        key_columns: The event's key columns, kept in ``answers`` as strings.
        storage_options: Passed to delta-rs (``s3://``, ``abfss://`` paths).

    Usage::

        store = AnswerStore("/data/sts/tables", key_columns=["event_id"])
        store.append("answers", rows, app_id="q1/answers", version=batch_id)
        store.read("answers").num_rows
    """

    def __init__(self, out_dir: str, *, key_columns: list[str],
                 storage_options: dict[str, str] | None = None) -> None:
        self.out_dir = out_dir
        self.key_columns = list(key_columns)
        self.storage_options = storage_options
        self.stats = StoreStats()
        self._lock = threading.RLock()
        self._tables: dict[str, DeltaTable] = {}
        self._marked: set[str] = set()
        """App ids whose replay markers (:mod:`spark_ext.l4.replays`) were looked up."""

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
                table = self._table(name)
                done = table.transaction_version(app_id)
                if app_id not in self._marked:  # a table Delta on Spark appended to
                    marked = last_marked([c.get("userMetadata") for c in
                                          table.history(HISTORY_LOOKBACK)], app_id)
                    done = max(d for d in (done, marked, -1) if d is not None)
                if done is not None and done >= version:
                    self.stats.skipped_replays += 1
                    self._marked.add(app_id)
                    return False
            start = time.perf_counter()
            target = self._tables.get(name)
            where = ({"table_or_uri": target} if target is not None else
                     {"table_or_uri": self.path(name), "storage_options": self.storage_options})
            write_deltalake(data=rows, mode="append", partition_by=[PARTITION],
                            schema_mode="merge", **where,
                            commit_properties=CommitProperties(
                                app_transactions=[Transaction(app_id, version)],
                                custom_metadata={"userMetadata": append_marker(app_id,
                                                                               version)}))
            self._marked.add(app_id)
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
            # One file as it is, without pyarrow's partition discovery from its folder:
            # Delta on Spark (4.4) also writes the partition column into each file, and
            # discovery's dictionary column then clashes with it. A file written before
            # a column was added lacks it (filled with nulls by the concatenation).
            data = pq.ParquetFile(local_path(f))
            names = data.schema_arrow.names
            t = _views_to_strings(data.read(
                columns=None if want is None else [c for c in want if c in names]))
            if columns is None or PARTITION in columns:
                hour = Path(local_path(f)).parent.name.partition("=")[2]
                if PARTITION not in t.column_names:
                    t = t.append_column(PARTITION, pa.array([hour] * t.num_rows, pa.string()))
            elif PARTITION in t.column_names:
                t = t.drop_columns([PARTITION])
            parts.append(t)
        table = pa.concat_tables(parts, promote_options="permissive")
        return table.filter(pq.filters_to_expression(filters)) if filters else table

    # ----------------------------------------------------------------- upkeep

    def maintain(self, *, vacuum_retention_hours: int | None, now_ms: int | None = None
                 ) -> None:
        """Compact the current and the previous hour's partitions of every table and
        vacuum files no longer referenced and older than the retention (``None``: no
        vacuum this time)."""
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
                if vacuum_retention_hours is None:
                    continue
                removed = dt.vacuum(retention_hours=vacuum_retention_hours, dry_run=False,
                                    enforce_retention_duration=False)
                self.stats.vacuumed_files += len(removed)
