"""Past events for an offline run: a Delta table, Parquet (a file or a folder) or JSON
lines, read into Arrow with one clear error for a missing, empty or malformed input."""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spark_ext.exceptions import InputFileError
from spark_ext.sources.jsonl_input import read_jsonl

#: File suffixes read as JSON lines.
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


def _read_delta(path: Path) -> pa.Table:
    """The active files of a Delta table, with its (hive-style) partition values.

    Read file by file with ``pyarrow.parquet`` (see
    :meth:`spark_ext.l4.answer_store.AnswerStore.read` for why not ``to_pyarrow_table``)."""
    from deltalake import DeltaTable

    dt = DeltaTable(str(path))
    partitions = dt.metadata().partition_columns
    parts = []
    for uri in dt.file_uris():
        t = pq.read_table(uri)
        segments = dict(s.split("=", 1) for s in Path(urllib.parse.urlparse(uri).path).parts
                        if "=" in s)
        for col in partitions:
            if col not in t.column_names:
                value = urllib.parse.unquote(segments.get(col, "")) or None
                t = t.append_column(col, pa.array([value] * t.num_rows, pa.string()))
        parts.append(t)
    if not parts:
        return pa.table({})
    return pa.concat_tables(parts, promote_options="permissive")


def read_event_table(path: str | os.PathLike[str], *, limit: int | None = None) -> pa.Table:
    """All events of ``path`` (the first ``limit`` when given).

    Raises:
        InputFileError: ``path`` is missing, holds no events, or is not a Delta table,
            Parquet or JSON lines (one line naming the path).

    Example:
        >>> read_event_table("/no/such/events.parquet")
        Traceback (most recent call last):
        ...
        spark_ext.exceptions.InputFileError: /no/such/events.parquet: no such file or folder
    """
    p = Path(path)
    if not p.exists():
        raise InputFileError(f"{p}: no such file or folder")
    try:
        if p.is_dir() and (p / "_delta_log").is_dir():
            table = _read_delta(p)
        elif p.is_file() and p.suffix.lower() in JSONL_SUFFIXES:
            table = pa.Table.from_pylist(read_jsonl(p, required={}, what="events"))
        else:
            table = pq.read_table(p)
    except InputFileError:
        raise
    except Exception as e:  # pyarrow / delta-rs errors: the input is not what it claims
        detail = " ".join(str(e).split())[:200]
        raise InputFileError(f"{p}: not a Delta table, Parquet or JSON lines "
                             f"({type(e).__name__}: {detail})") from None
    if table.num_rows == 0 or not table.column_names:
        raise InputFileError(f"{p}: no events (the table is empty)")
    return table.slice(0, limit) if limit is not None else table
