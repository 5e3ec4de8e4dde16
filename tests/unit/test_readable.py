"""When rows of a local Delta table became readable (sts_harness.readable), on real tables
written by delta-rs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from sts_harness.readable import LOG_DIR, commit_times


def _commit_file(table: Path, version: int) -> Path:
    return table / LOG_DIR / f"{version:020d}.json"


def _date(path: Path, epoch_ms: int) -> None:
    os.utime(path, ns=(epoch_ms * 1_000_000, epoch_ms * 1_000_000))


def test_each_row_takes_the_time_of_the_commit_that_added_it(tmp_path: Path) -> None:
    table = tmp_path / "answers"
    write_deltalake(table, pa.table({"request_id": ["a", "b"], "n": [1, 2]}))
    write_deltalake(table, pa.table({"request_id": ["c"], "n": [3]}), mode="append")
    _date(_commit_file(table, 0), 1_000)
    _date(_commit_file(table, 1), 2_500)

    assert commit_times(table) == {"a": 1_000, "b": 1_000, "c": 2_500}


def test_a_compaction_does_not_date_its_rows_again(tmp_path: Path) -> None:
    table = tmp_path / "answers"
    write_deltalake(table, pa.table({"request_id": ["a"]}))
    write_deltalake(table, pa.table({"request_id": ["b"]}), mode="append")
    DeltaTable(table).optimize.compact()  # rewrites both rows (dataChange false)
    for version, at in ((0, 1_000), (1, 2_000), (2, 9_000)):
        _date(_commit_file(table, version), at)

    assert commit_times(table) == {"a": 1_000, "b": 2_000}
    DeltaTable(table).vacuum(retention_hours=0, enforce_retention_duration=False,
                             dry_run=False)  # the files of the two appends go
    assert commit_times(table) == {}  # unknown, not the compaction's time


def test_files_gone_and_log_files_that_are_not_commits_are_skipped(tmp_path: Path) -> None:
    table = tmp_path / "answers"
    write_deltalake(table, pa.table({"request_id": ["a"]}))
    write_deltalake(table, pa.table({"request_id": ["b"]}), mode="append")
    first = DeltaTable(table, version=0).file_uris()[0]
    Path(first.removeprefix("file://")).unlink()  # as a vacuum would
    # a compacted range of commits: not a commit of its own
    (table / LOG_DIR / "00000000000000000000.00000000000000000001.compacted.json"
     ).write_text('{"add": {"path": "nowhere.parquet", "dataChange": true}}\n')

    assert set(commit_times(table)) == {"b"}


def test_a_file_that_is_not_parquet_is_skipped(tmp_path: Path) -> None:
    table = tmp_path / "answers"
    write_deltalake(table, pa.table({"request_id": ["a"]}))
    write_deltalake(table, pa.table({"request_id": ["b"]}), mode="append")
    Path(DeltaTable(table, version=0).file_uris()[0].removeprefix("file://")
         ).write_bytes(b"not parquet")

    assert set(commit_times(table)) == {"b"}


def test_a_commit_may_name_its_file_by_an_absolute_local_uri(tmp_path: Path) -> None:
    table = tmp_path / "answers"
    write_deltalake(table, pa.table({"request_id": ["a"]}))
    elsewhere = tmp_path / "elsewhere.parquet"
    pq.write_table(pa.table({"request_id": ["b"]}), elsewhere)
    commit = _commit_file(table, 1)  # as a shallow clone names its source's files
    commit.write_text(json.dumps({"add": {"path": elsewhere.as_uri(), "dataChange": True,
                                          "partitionValues": {}, "size": 1,
                                          "modificationTime": 0}}) + "\n")
    _date(commit, 7_000)

    assert commit_times(table)["b"] == 7_000


def test_a_table_by_file_uri_is_read_and_one_on_a_store_is_not(tmp_path: Path) -> None:
    table = tmp_path / "answers"
    write_deltalake(table, pa.table({"request_id": ["a"]}))
    assert set(commit_times(table.as_uri())) == {"a"}
    assert commit_times("s3://bucket/answers") == {}  # never read as a local path


def test_no_table_gives_nothing(tmp_path: Path) -> None:
    assert commit_times(tmp_path / "missing") == {}
