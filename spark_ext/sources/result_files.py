"""The results stream: the sidecar's Parquet landing folder as a Spark streaming source.

A Python data source (``format("sts_results")``) instead of Spark's file source,
because the landing folder must stay bounded and one bad file must not stop the
answers:

- **Offsets are per writer.** Every sidecar writer names its files
  ``part-{incarnation}-{seq}-{sidecar_id}.parquet`` and renames them into place in
  ``seq`` order (:func:`sidecar.contract.parse_result_file_name`), so the offset is
  the highest ``seq`` read per writer stream: no listing of every file ever seen
  in the checkpoint, and a file that lands late from another sidecar is never
  skipped.
- **Bad files are quarantined.** A new file whose footer does not parse, or whose
  columns have the wrong types (say ``request_id`` as INT64), is moved to the
  quarantine folder with a ``.reason`` note and a log line, and the query goes on.
- **Read files are removed.** When Spark commits a batch, files at or below the
  committed offset and older than ``retention_s`` are deleted (this source is the
  folder's only reader).

Usage::

    register_results_source(spark)
    results = (spark.readStream.format("sts_results")
               .option("path", "/data/sts/results").load())
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)

from sidecar.contract import RESULT_SCHEMA, parse_result_file_name
from spark_ext.sources.runner_exit import quiet_runner_shutdown
from spark_ext.worker_gc import freeze_loaded

logger = logging.getLogger(__name__)

#: Name to use in ``spark.readStream.format(...)``.
SOURCE_NAME = "sts_results"
#: Columns a result file must have; the others may be missing (older sidecars).
REQUIRED_COLUMNS = ("request_id", "status")
#: Subfolder of the results folder that receives files that cannot be read.
QUARANTINE_DIR = "quarantine"
#: What ``read`` yields: the result columns, all nullable (as Spark's schema has them).
READ_SCHEMA = pa.schema([f.with_nullable(True) for f in RESULT_SCHEMA])


def _normalised(t: pa.DataType) -> pa.DataType:
    if t in (pa.string_view(), pa.large_string()):
        return pa.string()
    return t


def schema_problem(schema: pa.Schema, expected: pa.Schema = RESULT_SCHEMA,
                   required: tuple[str, ...] = REQUIRED_COLUMNS) -> str | None:
    """Why a file with ``schema`` cannot be read as ``expected`` (default: a result
    file), or ``None`` when it can.

    Example:
        >>> schema_problem(pa.schema([("request_id", pa.int64()), ("status", pa.string())]))
        'column request_id is int64, expected string'
        >>> schema_problem(RESULT_SCHEMA) is None
        True
    """
    names = set(schema.names)
    for name in required:
        if name not in names:
            return f"column {name} is missing"
    for field in expected:
        if field.name in names:
            got = _normalised(schema.field(field.name).type)
            if got != field.type:
                return f"column {field.name} is {got}, expected {field.type}"
    return None


def conform(table: pa.Table, expected: pa.Schema = RESULT_SCHEMA) -> pa.Table:
    """``table`` with exactly ``expected``'s columns (default :data:`READ_SCHEMA`):
    extra ones dropped, missing ones null (booleans false), string views cast to
    strings, every column nullable."""
    n = table.num_rows
    columns = []
    for f in expected:
        if f.name in table.column_names:
            columns.append(table.column(f.name).cast(f.type))
        elif f.type == pa.bool_():
            columns.append(pa.array([False] * n, pa.bool_()))
        else:
            columns.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(columns, schema=pa.schema([f.with_nullable(True)
                                                           for f in expected]))


@dataclass(frozen=True)
class ResultFile:
    """One visible result file and its place in its writer's stream."""

    path: str
    stream: str
    seq: int


def list_result_files(folder: str | os.PathLike[str],
                      known: dict[str, ResultFile | None] | None = None) -> list[ResultFile]:
    """Visible result files of ``folder``, ordered by stream and ``seq`` (others ignored).

    ``known`` caches what each name parsed to between calls (updated in place, names
    gone from the folder dropped): a folder that keeps the retention's worth of files
    costs one ``scandir`` per listing, not a name parse per file.
    """
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        if known is not None:
            known.clear()
        return []
    cache = known if known is not None else {}
    seen: dict[str, ResultFile | None] = {}
    for entry in entries:
        name = entry.name
        if name in cache:
            seen[name] = cache[name]
            continue
        key = parse_result_file_name(name) if entry.is_file() else None
        seen[name] = ResultFile(entry.path, key.stream, key.seq) if key is not None else None
    if known is not None:
        known.clear()
        known.update(seen)
    return sorted((f for f in seen.values() if f is not None), key=lambda f: (f.stream, f.seq))


class _CachedListing:
    """:func:`list_result_files` of a folder, listed again only when the folder changed.

    Spark asks for the latest offset at every trigger (every few milliseconds while
    idle); a folder that keeps an hour of result files would otherwise be scanned and
    every name parsed each time. A file landing, being renamed in or removed changes the
    folder's mtime. Timestamps are coarse (a clock tick), so a listing taken in the tick
    the folder last changed is not trusted: the next call lists again.
    """

    #: A listing this long after the folder's mtime saw every change up to that mtime.
    _SETTLED_NS = 20_000_000

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._mtime_ns: int | None = None
        self._settled = False
        self._files: list[ResultFile] = []
        self._known: dict[str, ResultFile | None] = {}

    def files(self) -> list[ResultFile]:
        try:
            mtime = os.stat(self.folder).st_mtime_ns
        except FileNotFoundError:
            self._mtime_ns = None
            return []
        if not (self._settled and mtime == self._mtime_ns):
            listed_at = time.time_ns()
            self._files = list_result_files(self.folder, self._known)
            self._mtime_ns = mtime
            self._settled = listed_at - mtime > self._SETTLED_NS
        return self._files


def quarantine(path: str, reason: str, quarantine_dir: str) -> Path:
    """Move ``path`` into ``quarantine_dir`` with a ``.reason`` note; return the new path."""
    target_dir = Path(quarantine_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / Path(path).name
    os.replace(path, target)
    target.with_name(target.name + ".reason").write_text(reason + "\n", encoding="utf-8")
    logger.error("Quarantined result file %s: %s", target, reason)
    return target


class _FilesPartition(InputPartition):
    def __init__(self, paths: list[str]) -> None:
        super().__init__(paths)
        self.paths = paths


class ResultsStreamReader(DataSourceStreamReader):
    """Offsets: ``{"streams": {"<sidecar_id>@<incarnation>": <last seq read>}}``."""

    def __init__(self, options: dict[str, str], expected: pa.Schema = RESULT_SCHEMA) -> None:
        # Spark hands data-source options over with lower-cased keys.
        options = {k.lower(): v for k, v in options.items()}
        self.expected = expected
        self.required = REQUIRED_COLUMNS if expected is RESULT_SCHEMA else ()
        self.path = options["path"]
        self.quarantine_dir = options.get("quarantinedir") or str(Path(self.path) / QUARANTINE_DIR)
        self.retention_s = float(options.get("retentionseconds", "600"))
        self.files_per_partition = int(options.get("filesperpartition", "64"))
        self._checked: set[str] = set()
        self._listing = _CachedListing(self.path)
        # Cleanup walks every file: at most every quarter of the retention (30 s cap).
        self._cleanup_every_s = min(30.0, self.retention_s / 4)
        self._cleaned_at = float("-inf")

    def initialOffset(self) -> dict:
        return {"streams": {}}

    def _new_files(self, start: dict) -> list[ResultFile]:
        done = start.get("streams", {})
        return [f for f in self._listing.files() if f.seq > done.get(f.stream, -1)]

    def _readable(self, f: ResultFile) -> bool:
        if f.path in self._checked:
            return True
        try:
            problem = schema_problem(pq.read_schema(f.path), self.expected, self.required)
        except FileNotFoundError:
            return False
        except Exception as e:  # a corrupt footer, a truncated file
            if not os.path.exists(f.path):  # removed meanwhile: nothing to quarantine
                return False
            problem = f"cannot read the Parquet footer: {type(e).__name__}: {e}"
        if problem is None:
            self._checked.add(f.path)
            return True
        try:
            quarantine(f.path, problem, self.quarantine_dir)
        except FileNotFoundError:
            pass
        return False

    def latestOffset(self, start: dict, limit: object) -> dict:
        streams = dict(start.get("streams", {}))
        for f in self._new_files(start):
            if self._readable(f):
                streams[f.stream] = max(f.seq, streams.get(f.stream, -1))
        return {"streams": streams}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        until = end.get("streams", {})
        paths = [f.path for f in self._new_files(start) if f.seq <= until.get(f.stream, -1)]
        step = self.files_per_partition
        return [_FilesPartition(paths[i:i + step]) for i in range(0, len(paths), step)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        freeze_loaded("results_source")  # its imports: out of the per-task GC
        for path in partition.paths:  # type: ignore[attr-defined]
            try:
                table = conform(pq.read_table(path), self.expected)
            except FileNotFoundError:
                # Removed after it was planned (by hand): its rows are gone; the
                # safety net answers their requests with the fallback.
                logger.error("Result file %s vanished before it was read.", path)
                continue
            except Exception as e:  # a footer that parsed over data that does not
                quarantine(path, f"cannot read the data: {type(e).__name__}: {e}",
                           self.quarantine_dir)
                continue
            yield from table.to_batches()

    def commit(self, end: dict) -> None:
        now = time.monotonic()
        if now - self._cleaned_at < self._cleanup_every_s:
            return
        self._cleaned_at = now
        until = end.get("streams", {})
        cutoff = time.time() - self.retention_s
        for f in self._listing.files():
            if f.seq <= until.get(f.stream, -1):
                try:
                    if os.stat(f.path).st_mtime < cutoff:
                        os.unlink(f.path)
                        self._checked.discard(f.path)
                except FileNotFoundError:
                    pass


class ResultsSimpleStreamReader(SimpleDataSourceStreamReader):
    """The same offsets, quarantine and cleanup, reading on the driver in one step
    (Spark's simple reader: no Python task per micro-batch, so less latency per batch;
    meant for the modest row rates of one pipeline's results)."""

    def __init__(self, options: dict[str, str], expected: pa.Schema = RESULT_SCHEMA) -> None:
        self._files = ResultsStreamReader(options, expected)
        self._maps = [i for i, f in enumerate(expected) if pa.types.is_map(f.type)]

    def initialOffset(self) -> dict:
        return self._files.initialOffset()

    def _rows(self, start: dict, end: dict) -> Iterator[tuple]:
        for partition in self._files.partitions(start, end):
            for batch in self._files.read(partition):
                for row in zip(*(c.to_pylist() for c in batch.columns)):
                    if self._maps:  # Arrow maps come as (key, value) pairs
                        row = list(row)
                        for i in self._maps:
                            row[i] = dict(row[i] or ())
                    yield tuple(row)

    def read(self, start: dict) -> tuple[Iterator[tuple], dict]:
        end = self._files.latestOffset(start, None)
        return iter(list(self._rows(start, end))), end

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple]:
        return iter(list(self._rows(start, end)))

    def commit(self, end: dict) -> None:
        self._files.commit(end)


class ResultsDataSource(DataSource):
    """``spark.readStream.format("sts_results").option("path", dir)``.

    Options: ``path`` (the results folder, required), ``quarantineDir`` (default
    ``<path>/quarantine``), ``retentionSeconds`` (keep read files this long, default
    600), ``reader`` (``simple``, the default: read on the driver, least latency per
    micro-batch; ``partitioned``: one Spark task per ``filesPerPartition`` files, for
    high result rates), ``filesPerPartition`` (default 64).
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> object:
        from spark_ext.schemas import spark_schema

        return spark_schema(RESULT_SCHEMA)

    def _options(self) -> dict[str, str]:
        if not self.options.get("path"):
            raise ValueError("the sts_results source needs option('path', <results folder>)")
        reader = self.options.get("reader", "simple")
        if reader not in ("simple", "partitioned"):
            raise ValueError(f"sts_results option reader={reader!r}: simple or partitioned")
        return dict(self.options)

    def _expected(self, schema: object) -> pa.Schema:
        """The file schema to read: the results', or the one given with ``.schema()``
        (then only the names and types are checked; the ack files)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        from spark_ext.schemas import spark_schema

        if schema is None or schema == spark_schema(RESULT_SCHEMA):
            return RESULT_SCHEMA
        return to_arrow_schema(schema)

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        quiet_runner_shutdown()
        options = self._options()
        if options.get("reader", "simple") == "simple":
            # Spark then asks for simpleStreamReader.
            raise PySparkNotImplementedError(errorClass="NOT_IMPLEMENTED",
                                             messageParameters={"feature": "streamReader"})
        return ResultsStreamReader(options, self._expected(schema))

    def simpleStreamReader(self, schema: object) -> SimpleDataSourceStreamReader:
        quiet_runner_shutdown()
        return ResultsSimpleStreamReader(self._options(), self._expected(schema))


def register_results_source(spark: object) -> None:
    """Make ``format("sts_results")`` available on ``spark`` (idempotent)."""
    spark.dataSource.register(ResultsDataSource)  # type: ignore[attr-defined]
