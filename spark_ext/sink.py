"""Delta tables written with ``deltalake`` (delta-rs) from ``foreachBatch`` via Arrow.

Every write is a MERGE on ``request_id`` that only inserts rows whose id is not
in the table yet, so a replayed micro-batch writes nothing twice. The backfill
MERGE turns a ``fallback`` answer into ``backfill`` when the model's ``ok``
result arrives after the request's window. Queries of one driver write the same
table under one lock, so their commits never race.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from sidecar.contract import now_ms

logger = logging.getLogger(__name__)

_LOCKS: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
_LOCKS_GUARD = threading.Lock()


def _lock(path: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS[str(Path(path).resolve())]


def _views_to_strings(table: pa.Table) -> pa.Table:
    schema = pa.schema([f.with_type(pa.string()) if f.type == pa.string_view() else f
                        for f in table.schema])
    return table if schema == table.schema else table.cast(schema)


def first_per_key(table: pa.Table, key: str = "request_id") -> pa.Table:
    """Keep the first row of each key (a MERGE source must not repeat a key)."""
    seen: set[str] = set()
    keep = []
    for i, value in enumerate(table.column(key).to_pylist()):
        if value not in seen:
            seen.add(value)
            keep.append(i)
    return table if len(keep) == table.num_rows else table.take(keep)


class DeltaSink:
    """One Delta table keyed by ``request_id``.

    Usage::

        sink = DeltaSink("/tmp/out/answers")
        sink.insert_new(arrow_table)
    """

    def __init__(self, path: str, *, key: str = "request_id") -> None:
        self.path = path
        self.key = key

    def exists(self) -> bool:
        return DeltaTable.is_deltatable(self.path)

    def insert_new(self, rows: pa.Table) -> None:
        """Insert rows whose key is not in the table yet (creates the table)."""
        if rows.num_rows == 0:
            return
        rows = first_per_key(rows, self.key)
        with _lock(self.path):
            if not self.exists():
                write_deltalake(self.path, rows, mode="append")
                return
            (DeltaTable(self.path)
             .merge(rows, predicate=f"t.{self.key} = s.{self.key}", source_alias="s",
                    target_alias="t")
             .when_not_matched_insert_all()
             .execute())

    def read(self, columns: list[str] | None = None, *, filters: list | None = None
             ) -> pa.Table:
        """The table as Arrow, optionally only some columns and rows (pyarrow
        ``filters``, e.g. ``[("request_id", "in", ids)]``).

        Reads the active files with ``pyarrow.parquet``: ``DeltaTable.to_pyarrow_table``
        leaves scanner threads alive and the process aborts at exit ("terminate
        called without an active exception", delta-io/delta-rs#2184; measured here:
        10 of 10 runs). Our tables are written by delta-rs MERGE, which rewrites
        files and writes no deletion vectors, so the active files are the table.
        """
        if not self.exists():
            return pa.table({})
        files = DeltaTable(self.path).file_uris()
        if not files:
            return pa.table({})
        # delta-rs MERGE writes string_view columns (plain writes: string), and
        # pyarrow's compute kernels do not take string_view: normalise per file.
        parts = [_views_to_strings(pq.read_table(f, columns=columns)) for f in files]
        table = pa.concat_tables(parts, promote_options="permissive")
        return table.filter(pq.filters_to_expression(filters)) if filters else table


def backfill_answers(answers: DeltaSink, results: pa.Table) -> None:
    """Merge ``ok`` results into answers that were given the fallback.

    Sets ``answer`` to the model text, ``answer_source = 'backfill'``, keeps
    ``fallback_text``, and stamps ``backfilled_at``. Answers already ``llm`` or
    ``backfill`` are left alone, so running it twice changes nothing.
    """
    ok = results.filter(pc.equal(results.column("status"), "ok"))
    if ok.num_rows == 0 or not answers.exists():
        return
    ok = first_per_key(ok.select(["request_id", "text", "finish_ts"]))
    stamp = now_ms()
    with _lock(answers.path):
        (DeltaTable(answers.path)
         .merge(ok, predicate="t.request_id = s.request_id", source_alias="s", target_alias="t")
         .when_matched_update(
             updates={
                 "answer": "s.text",
                 "answer_source": "'backfill'",
                 "status": "'ok'",
                 "backfilled_at": str(stamp),
                 "answered_ts": str(stamp),
                 "latency_ms": f"{stamp} - t.enqueue_ts",
                 "deadline_met": "false",
             },
             predicate="t.answer_source = 'fallback'")
         .execute())
