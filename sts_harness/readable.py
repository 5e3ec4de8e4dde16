"""When each row of a local Delta table became readable: the time of the commit that
added its file.

A row's own timestamps are written before its commit: ``answered_ts`` in ``answers`` is
the time the answers micro-batch that decided the row began (every row of a micro-batch
gets the same time, so a replayed micro-batch decides the same), and the row is readable
only once that micro-batch's append commits. Benchmarks and the demo read the commit
times from the table's log to say how long that takes (*answer landed -> readable*) and
which answers could be read by their deadline.

A commit's time here is when its log file (``_delta_log/<version>.json``) was written:
Delta makes a version visible by creating that file, and readers list it. Local tables
only (what ``sts bench`` and ``sts demo`` write); an object store's listing times are
its own.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spark_ext.uris import is_local_uri, local_path, scheme

#: The log folder of a Delta table.
LOG_DIR = "_delta_log"
#: A commit's file in it (not a checkpoint, a checksum or a compacted range of commits).
COMMIT_FILE = re.compile(r"\d{20}\.json")


def commit_times(table: str | os.PathLike, column: str = "request_id") -> dict[str, int]:
    """``column``'s value -> when the first commit whose files hold it was written
    (epoch ms), for every data file a commit of the local table at ``table`` (a path or
    a ``file:`` URI) added (files a compaction rewrote are not new rows: ``dataChange``
    false), by a path relative to the table or an absolute ``file:`` one. A file that is
    gone (vacuumed), not local or unreadable is skipped; no table there, or a table that is not
    local (``s3://...``), gives ``{}``.

    Example:
        >>> import tempfile, pyarrow as pa
        >>> from deltalake import write_deltalake
        >>> folder = tempfile.mkdtemp()
        >>> write_deltalake(folder, pa.table({"request_id": ["a", "b"]}))
        >>> write_deltalake(folder, pa.table({"request_id": ["c"]}), mode="append")
        >>> times = commit_times(folder)
        >>> sorted(times), times["a"] == times["b"] <= times["c"]
        (['a', 'b', 'c'], True)
    """
    uri = os.fspath(table)
    if not is_local_uri(uri):
        return {}
    table_dir = local_path(uri)
    log = table_dir / LOG_DIR
    if not log.is_dir():
        return {}
    readable: dict[str, int] = {}
    for commit in sorted(p for p in log.iterdir() if COMMIT_FILE.fullmatch(p.name)):
        written_ms = commit.stat().st_mtime_ns // 1_000_000
        for path in _added_files(commit):
            if scheme(path) is not None and not is_local_uri(path):
                continue  # a file elsewhere (a shallow clone's source on a store)
            file = local_path(path) if scheme(path) else table_dir / path
            try:
                values = pq.ParquetFile(file).read(columns=[column])
            except (OSError, KeyError, pa.ArrowInvalid):  # vacuumed, no such column, or
                continue  # not Parquet: unknown, and the summary still comes
            for value in values.column(column).to_pylist():
                if value is not None:
                    readable.setdefault(value, written_ms)
    return readable


def add_readable_times(rows: list[dict], table: str) -> None:
    """Set each answer row's ``readable_ts`` (by its ``request_id``) from the commits of
    the table at ``table`` (:func:`commit_times`; ``None`` where not known, as for any
    row of a table that is not local).

    Example:
        >>> rows = [{"request_id": "a"}]
        >>> add_readable_times(rows, "s3://bucket/answers"); rows
        [{'request_id': 'a', 'readable_ts': None}]
    """
    readable = commit_times(table)
    for row in rows:
        row["readable_ts"] = readable.get(row["request_id"])


def readable_by_deadline(row: dict) -> bool | None:
    """Whether answer ``row`` was readable by its deadline (``None``: not known).

    Example:
        >>> readable_by_deadline({"readable_ts": 900, "deadline_ts": 1_000})
        True
        >>> readable_by_deadline({"deadline_ts": 1_000}) is None
        True
    """
    if row.get("readable_ts") is None or row.get("deadline_ts") is None:
        return None
    return row["readable_ts"] <= row["deadline_ts"]


def _added_files(commit: Path) -> list[str]:
    """Relative paths of the data files commit file ``commit`` added as new data."""
    from urllib.parse import unquote

    files = []
    with commit.open(encoding="utf-8") as f:
        for line in f:
            action = json.loads(line)
            add = action.get("add")
            if add and add.get("dataChange", True):
                files.append(unquote(add["path"]))
    return files
