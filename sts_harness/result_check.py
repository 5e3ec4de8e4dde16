"""Read the Parquet result channel outside Spark, and check exactly-once delivery."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.dataset as ds


class DuplicateResultError(AssertionError):
    """A request id has two result rows: exactly-once delivery is broken."""


def read_results(results_dir: str | Path) -> list[dict]:
    """All result rows written so far (visible files only, as Spark would read them)."""
    files = [str(p) for p in Path(results_dir).glob("*.parquet")]
    if not files:
        return []
    return ds.dataset(files, format="parquet").to_table().to_pylist()


def results_by_id(rows: list[dict], request_ids: set[str] | None = None) -> dict[str, dict]:
    """Terminal rows keyed by ``request_id`` (only ``request_ids`` when given).

    A ``late`` row (the ``finish_and_backfill`` policy's model answer after the
    terminal row) is not terminal and is left out; at most one per id is allowed.

    Raises:
        DuplicateResultError: an id has two terminal rows, or two late ones.
    """
    by_id: dict[str, dict] = {}
    late: set[str] = set()
    for row in rows:
        rid = row["request_id"]
        if request_ids is not None and rid not in request_ids:
            continue
        if row.get("late"):
            if rid in late:
                raise DuplicateResultError(f"{rid} has two late results")
            late.add(rid)
            continue
        if rid in by_id:
            raise DuplicateResultError(f"{rid} has two results")
        by_id[rid] = row
    return by_id


def wait_for_results(results_dir: str | Path, request_ids: set[str], timeout_s: float = 60.0
                     ) -> dict[str, dict]:
    """Poll until every id has a result row; return them by id.

    Raises:
        DuplicateResultError: an id has two result rows.
        TimeoutError: some ids have no result after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        by_id = results_by_id(read_results(results_dir), request_ids)
        if set(by_id) == request_ids:
            return by_id
        if time.monotonic() > deadline:
            missing = sorted(request_ids - set(by_id))
            raise TimeoutError(f"no result for {missing[:10]} after {timeout_s}s")
        time.sleep(0.1)
