"""``sts validate``'s bad input: one line, exit code 2, nothing started or written."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.cli import main as sts_main


def _fails(argv: list[str], capsys) -> str:
    assert sts_main(["validate", "--engine", "simulated", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("sts: ") and err.endswith("(sts validate)"), err
    return err


@pytest.mark.parametrize("content, expected", [
    (None, "no such file or folder"),
    ("", "no events"),
    ('{"ticket_id": "T1", "text": "hi"}\nnot json\n', "line 2: not a JSON object"),
])
def test_missing_empty_or_malformed_jsonl(tmp_path: Path, capsys, content, expected) -> None:
    path = tmp_path / "events.jsonl"
    if content is not None:
        path.write_text(content)
    err = _fails(["--input", str(path), "--out", str(tmp_path / "out")], capsys)
    assert expected in err and str(path) in err
    assert not (tmp_path / "out").exists()


def test_not_a_table(tmp_path: Path, capsys) -> None:
    path = tmp_path / "events.parquet"
    path.write_bytes(b"not parquet")
    assert "not a Delta table, Parquet or JSON lines" in _fails(
        ["--input", str(path), "--out", str(tmp_path / "out")], capsys)


def test_missing_key_column(tmp_path: Path, capsys) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"id": "a", "text": "hi", "priority": "low"}\n')
    err = _fails(["--input", str(path), "--out", str(tmp_path / "out")], capsys)
    assert "event_id" in err and "--key-columns" in err


def test_out_that_it_did_not_create_is_refused(tmp_path: Path, capsys) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert "not written by sts validate" in _fails(["--limit", "2", "--out", str(out)], capsys)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_bad_numbers(tmp_path: Path, capsys) -> None:
    assert "--limit 0" in _fails(["--limit", "0", "--out", str(tmp_path / "o")], capsys)


def test_parquet_and_partitioned_delta_events_are_read(tmp_path: Path) -> None:
    """Past events as a Parquet file, a Parquet folder or a partitioned Delta table."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    from spark_ext.sources.event_tables import read_event_table

    events = pa.table({"ticket_id": ["T1", "T2", "T3"], "text": ["a", "b", "c"],
                       "priority": ["high", "low", "low"]})
    pq.write_table(events, tmp_path / "events.parquet")
    (tmp_path / "folder").mkdir()
    pq.write_table(events, tmp_path / "folder" / "part-0.parquet")
    write_deltalake(str(tmp_path / "delta"), events, partition_by=["priority"])
    for source in ("events.parquet", "folder", "delta"):
        table = read_event_table(tmp_path / source)
        rows = sorted(table.select(["ticket_id", "text", "priority"]).to_pylist(),
                      key=lambda r: r["ticket_id"])
        assert rows == events.to_pylist(), source
    assert read_event_table(tmp_path / "delta", limit=2).num_rows == 2
