"""Answers, the Delta answer store and the delta-rs writer's merge, and the results
source's reader, in process on real Delta tables and real Parquet files (no Spark)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sidecar.contract import RESULT_SCHEMA, result_file_name
from spark_ext.l4.answer_store import AnswerStore
from spark_ext.l4.answers import answers_from_refusals, answers_from_results, build_answers
from spark_ext.sources.result_files import ResultsStreamReader, conform, schema_problem

KEYS = ["event_id"]
NOW = 1_800_000_000_000


def _result(rid: str, status: str = "ok", *, late: bool = False, text: str = "model says hi",
            enqueue_ts: int = NOW - 500) -> dict:
    return {"request_id": rid, "trace_id": rid, "status": status,
            "text": text if status == "ok" else "", "priority": "normal",
            "enqueue_ts": enqueue_ts, "submit_ts": enqueue_ts + 5,
            "received_ts": enqueue_ts + 7, "finish_ts": enqueue_ts + 300,
            "deadline_ts": enqueue_ts + 3000, "reason": "" if status == "ok" else "overloaded",
            "fallback_text": "" if status == "ok" else "pool rule text",
            "attributes": [("event_id", f"e-{rid}")], "late": late}


def _results(*rows: dict) -> pa.Table:
    schema = pa.schema([RESULT_SCHEMA.field(k).with_nullable(True) for k in rows[0]])
    return conform(pa.Table.from_pylist(list(rows), schema=schema))


def _store(tmp_path: Path) -> AnswerStore:
    return AnswerStore(str(tmp_path / "tables"), key_columns=KEYS)


def test_results_become_answers_with_their_keys() -> None:
    rows = answers_from_results(_results(_result("a"), _result("b", "shed")),
                                key_columns=KEYS, fallback_text="generic")
    a, b = rows
    assert (a["answer_source"], a["answer"], a["event_id"]) == ("llm", "model says hi", "e-a")
    assert (b["answer_source"], b["answer"], b["status"], b["reason"]) == (
        "fallback", "pool rule text", "shed", "overloaded")


def test_refused_acks_become_fallbacks_by_cause() -> None:
    acks = pa.table({"request_id": ["x", "y", "z"], "accepted": [True, False, False],
                     "reason": [None, "queue_full", None], "event_id": ["1", "2", "3"],
                     "sidecar_fallback_text": [None, "rule", None],
                     "priority": ["high"] * 3, "enqueue_ts": [NOW] * 3,
                     "deadline_ts": [NOW + 1] * 3, "submit_ts": [NOW] * 3})
    rows = answers_from_refusals(acks, key_columns=KEYS, fallback_text="generic")
    assert [(r["request_id"], r["status"], r["reason"], r["answer"]) for r in rows] == [
        ("y", "shed", "queue_full", "rule"), ("z", "unavailable", "unavailable", "generic")]


def test_every_shed_reason_of_the_contract_is_a_shed_answer() -> None:
    """The answer's status follows the contract's split (``results_backlog``, added with
    the Kafka channel, is load, not invalid input)."""
    from sidecar.contract import RefusalReason, Status

    shed = sorted(str(r) for r in RefusalReason if r.status is Status.SHED)
    acks = pa.table({"request_id": shed, "accepted": [False] * len(shed), "reason": shed,
                     "event_id": shed, "priority": ["low"] * len(shed)})
    rows = answers_from_refusals(acks, key_columns=KEYS, fallback_text="generic")
    assert "results_backlog" in shed
    assert {r["reason"]: r["status"] for r in rows} == dict.fromkeys(shed, "shed")


def test_append_is_idempotent_per_app_transaction(tmp_path: Path) -> None:
    store = _store(tmp_path)
    table = pa.table({"request_id": ["r1"], "enqueue_ts": [NOW]})
    assert store.append("requests", table, app_id="submit/requests", version=7)
    assert not store.append("requests", table, app_id="submit/requests", version=7)
    assert not store.append("requests", table, app_id="submit/requests", version=3)
    assert store.append("requests", table, app_id="other/requests", version=0)
    assert store.read("requests").num_rows == 2


def _writer(tmp_path: Path):
    from spark_ext.config import OutputConfig
    from spark_ext.l4.writers.deltalake import DeltalakeWriter

    writer = DeltalakeWriter(OutputConfig(out_dir=str(tmp_path / "tables"), writer="deltalake"),
                             tuple(KEYS))
    writer.create_tables(None)
    return writer


def test_the_merge_upgrades_only_fallbacks_and_inserts_what_is_missing(tmp_path: Path) -> None:
    """A backfill (or a candidate the ledger no longer remembers) is a MERGE: a model's
    answer upgrades a fallback, never an answer of the model, and a request with no row
    gets one; merging again changes nothing."""
    writer = _writer(tmp_path)
    first = build_answers(answers_from_results(_results(_result("a", "timeout"), _result("b")),
                                               key_columns=KEYS, fallback_text="f"), KEYS, NOW)
    writer.append("answers", first, app_id="q/answers", version=0)
    late = build_answers(answers_from_results(
        _results(_result("a", late=True, text="late but good"),
                 _result("b", late=True, text="must not replace an llm answer"),
                 _result("c", text="never answered before")),
        key_columns=KEYS, fallback_text="f"), KEYS, NOW + 10)
    assert writer.merge_answers("answers", late, backfill=True) == {"inserted": 1, "updated": 1}
    assert writer.merge_answers("answers", late, backfill=True) == {"inserted": 0, "updated": 0}
    by_id = {r["request_id"]: r for r in writer.read(None, "answers").to_pylist()}
    assert (by_id["a"]["answer_source"], by_id["a"]["answer"], by_id["a"]["status"]) == (
        "backfill", "late but good", "ok")
    assert by_id["a"]["fallback_text"] == "pool rule text" and by_id["a"]["backfilled_at"]
    assert (by_id["b"]["answer_source"], by_id["b"]["answer"]) == ("llm", "model says hi")
    assert (by_id["c"]["answer_source"], len(by_id)) == ("llm", 3)


def test_maintenance_compacts_partitions(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for v in range(5):
        store.append("results", pa.table({"request_id": [f"r{v}"], "enqueue_ts": [NOW]}),
                     app_id="a/results", version=v)
    store.maintain(vacuum_retention_hours=0, now_ms=NOW)
    assert store.stats.compactions >= 1
    assert len(store._table("results").file_uris()) == 1
    assert store.read("results").num_rows == 5


# ------------------------------------------------------------------ results source


def _write(folder: Path, name: str, table: pa.Table) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / name)
    return folder / name


def _reader(folder: Path, **options: str) -> ResultsStreamReader:
    return ResultsStreamReader({"path": str(folder), **options})


def test_schema_check_names_the_problem() -> None:
    assert schema_problem(RESULT_SCHEMA) is None
    assert schema_problem(pa.schema([("status", pa.string())])) == "column request_id is missing"
    old = pa.schema([f for f in RESULT_SCHEMA if f.name not in ("attributes", "late")])
    assert schema_problem(old) is None  # an older sidecar's files are read, filled with nulls


def test_reader_offsets_per_writer_stream(tmp_path: Path) -> None:
    results = tmp_path / "results"
    one = _results(_result("a"))
    _write(results, result_file_name(NOW, 0, "sc-1"), one)
    _write(results, result_file_name(NOW, 1, "sc-1"), one)
    reader = _reader(results)
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    assert end == {"streams": {f"sc-1@{NOW}": 1}}
    # another sidecar's file lands late with an older timestamp: it is still read
    _write(results, result_file_name(NOW - 10_000, 0, "sc-2"), one)
    later = reader.latestOffset(end, None)
    assert later["streams"] == {f"sc-1@{NOW}": 1, f"sc-2@{NOW - 10000}": 0}
    parts = reader.partitions(end, later)
    rows = [b for p in parts for b in reader.read(p)]
    assert sum(b.num_rows for b in rows) == 1


def test_reader_quarantines_bad_files_and_cleans_read_ones(tmp_path: Path) -> None:
    results = tmp_path / "results"
    good = _write(results, result_file_name(NOW, 0, "sc"), _results(_result("a")))
    (results / result_file_name(NOW, 1, "sc")).write_bytes(b"PAR1 garbage")
    _write(results, result_file_name(NOW, 2, "sc"),
           pa.table({"request_id": [1], "status": ["ok"]}))
    reader = _reader(results, retentionseconds="0")  # Spark lower-cases option keys
    end = reader.latestOffset(reader.initialOffset(), None)
    assert end == {"streams": {f"sc@{NOW}": 0}}
    quarantined = sorted(p.name for p in (results / "quarantine").iterdir())
    assert len([q for q in quarantined if q.endswith(".parquet")]) == 2
    assert len([q for q in quarantined if q.endswith(".reason")]) == 2
    old = time.time() - 10
    os.utime(good, (old, old))
    reader.commit(end)
    assert not good.exists()


@pytest.mark.parametrize("retention", ["3600"])
def test_reader_keeps_read_files_within_retention(tmp_path: Path, retention: str) -> None:
    results = tmp_path / "results"
    good = _write(results, result_file_name(NOW, 0, "sc"), _results(_result("a")))
    reader = _reader(results, retentionSeconds=retention)
    reader.commit(reader.latestOffset(reader.initialOffset(), None))
    assert good.exists()


def test_simple_reader_reads_on_the_driver_and_replays_a_range(tmp_path: Path) -> None:
    from spark_ext.sources.result_files import ResultsSimpleStreamReader

    results = tmp_path / "results"
    _write(results, result_file_name(NOW, 0, "sc"), _results(_result("a"), _result("b")))
    reader = ResultsSimpleStreamReader({"path": str(results)})
    rows, end = reader.read(reader.initialOffset())
    rows = list(rows)
    assert end == {"streams": {f"sc@{NOW}": 0}}
    assert [r[0] for r in rows] == ["a", "b"]
    attrs = RESULT_SCHEMA.names.index("attributes")
    assert rows[0][attrs] == {"event_id": "e-a"}  # Spark wants maps as dicts
    again = list(reader.readBetweenOffsets(reader.initialOffset(), end))
    assert again == rows
    empty, same = reader.read(end)
    assert list(empty) == [] and same == end


def test_listing_parses_each_name_once_and_forgets_removed_files(tmp_path: Path) -> None:
    from spark_ext.sources.result_files import list_result_files

    results = tmp_path / "results"
    first = _write(results, result_file_name(NOW, 0, "sc"), _results(_result("a")))
    (results / "notes.txt").write_text("not a result file")
    known: dict = {}
    assert [f.seq for f in list_result_files(results, known)] == [0]
    assert set(known) == {first.name, "notes.txt"} and known["notes.txt"] is None
    known[first.name] = known[first.name].__class__(str(first), "cached", 0)  # reused, not re-parsed
    second = _write(results, result_file_name(NOW, 1, "sc"), _results(_result("b")))
    assert [(f.stream, f.seq) for f in list_result_files(results, known)] == \
        [("cached", 0), (f"sc@{NOW}", 1)]
    first.unlink()
    assert [(f.stream, f.seq) for f in list_result_files(results, known)] == [(f"sc@{NOW}", 1)]
    assert set(known) == {second.name, "notes.txt"}
