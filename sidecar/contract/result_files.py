"""Names of the result channel's Parquet files, which a reader can use as offsets.

A result writer names its files ``part-{incarnation_ms:013d}-{seq:010d}-{sidecar_id}.parquet``:

* ``incarnation_ms``: when that writer instance started (epoch ms); fixed for its life,
  new after every restart of the sidecar;
* ``seq``: 0, 1, 2, ... one per file of that writer, without gaps; files of one writer
  become visible (are renamed into place) strictly in ``seq`` order;
* ``sidecar_id``: the sidecar's identity (may contain ``-``, ``.`` and ``_``, never ``/``).

So ``sidecar_id@incarnation_ms`` names one append-only stream of files and ``seq`` is
the offset within it: a reader that has consumed ``seq`` n of a stream has seen every
row of files 0..n, and a later file with the same stream and a seq past n + 1 means
the files between are not visible yet. Fixed-width numbers make the names of one
stream sort in ``seq`` order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r"part-(?P<inc>\d{13})-(?P<seq>\d{10})-(?P<sid>[^/]+)\.parquet")


@dataclass(frozen=True, order=True)
class ResultFileKey:
    """Where one result file sits: its writer's stream and its position in it."""

    stream: str
    """``f"{sidecar_id}@{incarnation_ms}"``: one writer instance of one sidecar."""

    seq: int
    """Position of the file in its stream: 0, 1, 2, ... without gaps."""


def result_file_name(incarnation_ms: int, seq: int, sidecar_id: str) -> str:
    """The name of file ``seq`` of the writer started at ``incarnation_ms``.

    Raises:
        ValueError: a number is negative or too wide for its field, or ``sidecar_id``
            is empty or contains ``/``.

    Example:
        >>> result_file_name(1_700_000_000_123, 7, "gpu-node.1_a-4242")
        'part-1700000000123-0000000007-gpu-node.1_a-4242.parquet'
    """
    if not 0 <= incarnation_ms < 10**13:
        raise ValueError(f"{incarnation_ms=} must be epoch ms with at most 13 digits")
    if not 0 <= seq < 10**10:
        raise ValueError(f"{seq=} must be in [0, 10**10)")
    if not sidecar_id or "/" in sidecar_id:
        raise ValueError(f"{sidecar_id=} must be non-empty and contain no '/'")
    return f"part-{incarnation_ms:013d}-{seq:010d}-{sidecar_id}.parquet"


def parse_result_file_name(name: str) -> ResultFileKey | None:
    """The :class:`ResultFileKey` of a result file name (a bare name or a path, local or
    URL), or ``None`` for anything else (hidden temporary files included).

    Example:
        >>> parse_result_file_name("part-1700000000123-0000000007-gpu-node.1_a-4242.parquet")
        ResultFileKey(stream='gpu-node.1_a-4242@1700000000123', seq=7)
        >>> parse_result_file_name("s3://bucket/results/part-1700000000123-0000000000-s0.parquet")
        ResultFileKey(stream='s0@1700000000123', seq=0)
        >>> parse_result_file_name(".part-1700000000123-0000000000-s0.parquet.1f2e.tmp") is None
        True
        >>> parse_result_file_name("heartbeat-1700000000123.parquet") is None
        True
    """
    match = _NAME.fullmatch(name.rpartition("/")[2])
    if match is None:
        return None
    return ResultFileKey(stream=f"{match['sid']}@{int(match['inc'])}", seq=int(match["seq"]))
