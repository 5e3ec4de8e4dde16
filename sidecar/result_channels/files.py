"""The ``files`` result channel (the embedded default): Parquet files appended
atomically to a directory.

Each flush writes one file under a hidden temporary name and renames it into
place (:func:`sidecar.atomic_files.write_parquet_atomically`), so a reader (Spark's
file source, Auto Loader, pyarrow) never sees a partial file. Pending results are
flushed at least every ``flush_interval_s`` and as soon as ``max_rows_per_file``
are pending.

Files are named by :func:`sidecar.contract.result_file_name`: the writer's start
time (its incarnation), a sequence number that counts its files from 0 without
gaps, and the sidecar id. Files are written one at a time under a lock, so they
become visible strictly in sequence order, and a failed write is retried under
the same number.
"""

from __future__ import annotations

import asyncio
import logging
import operator
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from sidecar.atomic_files import write_parquet_atomically
from sidecar.config import ResultChannelConfig
from sidecar.contract import RESULT_SCHEMA, now_ms, result_file_name
from sidecar.request_state import ResultRecord
from sidecar.result_channels.base import ResultChannel, ResultChannelStats

logger = logging.getLogger(__name__)

_COLUMNS = [f.name for f in RESULT_SCHEMA]
_GETTERS = [operator.attrgetter(name) for name in _COLUMNS]
"""One getter per column: a column is one ``map`` over the rows, in C."""
_ATTRIBUTES = _COLUMNS.index("attributes")


class FilesResultChannel(ResultChannel):
    """Buffers :class:`ResultRecord` rows and writes them as Parquet files.

    Args:
        config: Directory, flush interval and file size.
        sidecar_id: Part of every file name, so several sidecars can share a directory
            (no ``/``).

    Inside the event loop: ``channel.start()``, then ``channel.emit(record)`` per
    result, and ``await channel.close()`` to write what is pending. Unbounded: rows
    wait in memory while a write fails (they are retried).
    """

    kind = "files"

    def __init__(self, config: ResultChannelConfig, sidecar_id: str) -> None:
        self.config = config
        self.sidecar_id = sidecar_id
        self.directory = Path(config.results_dir)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.incarnation_ms = now_ms()
        """Start of this writer (epoch ms): with ``sidecar_id``, its stream of files."""
        result_file_name(self.incarnation_ms, 0, sidecar_id)  # fail early on a bad id
        self._pending: list[ResultRecord] = []
        self._seq = 0
        """Sequence number of the next file (only advanced by a file that was written)."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self.rows_emitted = 0
        self.rows_written = 0
        self.files_written = 0
        self.failed_writes = 0
        self.on_written: Callable[[list[ResultRecord]], None] | None = None
        """Called with the rows of each file once it is visible (tracing)."""

    def start(self) -> None:
        """Start the background flush loop (call inside the event loop)."""
        if self._task is None:
            self._task = asyncio.create_task(self._flush_loop(), name="result-writer")

    def emit(self, record: ResultRecord) -> None:
        """Queue one result row; it is on disk within ``flush_interval_s``."""
        self._pending.append(record)
        self.rows_emitted += 1
        if len(self._pending) >= self.config.max_rows_per_file:
            self._wake.set()

    async def flush(self) -> None:
        """Write everything pending now. Rows emitted while it writes wait for the next
        flush: under steady load, writing until nothing is pending wrote file after
        small file back to back, and a file costs far more than its rows."""
        async with self._write_lock:
            todo = len(self._pending)
            while todo > 0 and self._pending:
                rows = self._pending[: min(todo, self.config.max_rows_per_file)]
                del self._pending[: len(rows)]
                todo -= len(rows)
                await asyncio.to_thread(self._write_file, rows)
                if self.on_written is not None:
                    self.on_written(rows)

    async def close(self, timeout_s: float | None = None) -> None:
        """Stop the loop and write what is pending (a local write: ``timeout_s`` does
        not apply). Idempotent.

        A write under way is finished first: cancelling the loop in it would stop only
        the wait (the thread writes on), and the next file, written under the same
        sequence number, would replace it."""
        if task := self._task:
            self._task = None
            async with self._write_lock:  # the loop waits for its timer or for this lock
                task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        while self._pending:
            await self.flush()

    async def _flush_loop(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can lose a cancel
            # that arrives while the event is being set, and close() then hangs.
            try:
                async with asyncio.timeout(self.config.flush_interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.flush()
            except Exception:  # keep flushing later; rows stay pending
                self.failed_writes += 1
                logger.exception("Writing results to %s failed; will retry.", self.directory)

    def _write_file(self, rows: list[ResultRecord]) -> None:
        """Write one file (called under ``_write_lock``, so one at a time, in seq order)."""
        columns = [list(map(get, rows)) for get in _GETTERS]  # rows to columns, in C
        columns[_ATTRIBUTES] = [list(a.items()) if a else [] for a in columns[_ATTRIBUTES]]
        table = pa.table(dict(zip(_COLUMNS, columns)), schema=RESULT_SCHEMA)
        name = result_file_name(self.incarnation_ms, self._seq, self.sidecar_id)
        try:
            write_parquet_atomically(table, self.directory, name)
        except BaseException:
            self._pending[:0] = rows  # put them back, in order; the seq is reused
            raise
        self._seq += 1
        self.rows_written += len(rows)
        self.files_written += 1

    def stats(self) -> ResultChannelStats:
        return ResultChannelStats(kind=self.kind, produced=self.rows_emitted,
                                  delivered=self.rows_written,
                                  delivery_errors=self.failed_writes,
                                  buffered=self.rows_emitted - self.rows_written, up=None)

    @property
    def destination(self) -> str:
        return str(self.directory)

    def summary(self) -> str:
        return f"{self.rows_written} results in {self.files_written} files"
