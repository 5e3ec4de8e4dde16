"""Read the Parquet result channel outside Spark (load generator, CLI, tests)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.dataset as ds


def read_results(results_dir: str | Path) -> list[dict]:
    """All result rows written so far (visible files only, as Spark would read them)."""
    files = [str(p) for p in Path(results_dir).glob("*.parquet")]
    if not files:
        return []
    return ds.dataset(files, format="parquet").to_table().to_pylist()


def wait_for_results(results_dir: str | Path, request_ids: set[str], timeout_s: float = 60.0
                     ) -> dict[str, dict]:
    """Poll until every id has a result row; return them by id.

    Raises:
        AssertionError: an id has two result rows (exactly-once is broken).
        TimeoutError: some ids have no result after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        rows = [r for r in read_results(results_dir) if r["request_id"] in request_ids]
        by_id: dict[str, dict] = {}
        for row in rows:
            assert row["request_id"] not in by_id, f"{row['request_id']} has two results"
            by_id[row["request_id"]] = row
        if set(by_id) == request_ids:
            return by_id
        if time.monotonic() > deadline:
            missing = sorted(request_ids - set(by_id))
            raise TimeoutError(f"no result for {missing[:10]} after {timeout_s}s")
        time.sleep(0.1)
