"""The soak benchmark's readings: live tables (with time travel), the answer lag, the
plot's series and ``--replot`` (the run itself is a benchmark command, not a test)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from benchmarks.soak import (SoakSampler, _series, answer_lag, lag_windows, live_tables,
                             main)
from sidecar.contract import now_ms
from spark_ext.l4.counts import PipelineCounts


def _answers(ts: list[int]) -> pa.Table:
    return pa.table({"request_id": [f"r{t}" for t in ts], "answered_ts": ts,
                     "latency_ms": [100 * (i + 1) for i in range(len(ts))],
                     "enqueue_ts": [0] * len(ts),
                     "submit_ts": [7 * (i + 1) for i in range(len(ts))],
                     "received_ts": [10] * len(ts), "finish_ts": [50] * len(ts),
                     "answer_source": ["llm"] * len(ts)})


def test_live_tables_counts_what_the_latest_version_reads_not_what_compaction_replaced(
        tmp_path: Path):
    answers = tmp_path / "answers"
    for t in (1, 2, 3):
        write_deltalake(str(answers), _answers([t]), mode="append")
    before = live_tables(str(tmp_path))
    assert before["files"] == 3 and before["mb"] >= 0

    DeltaTable(str(answers)).optimize.compact()
    after = live_tables(str(tmp_path))
    assert after["files"] == 1                          # the three small files, replaced
    assert len(list(answers.glob("*.parquet"))) == 4    # still on disk until vacuumed


def test_live_tables_travels_to_a_time_before_a_table_existed(tmp_path: Path):
    early = now_ms() - 60_000
    write_deltalake(str(tmp_path / "requests"), _answers([1]), mode="append")
    assert live_tables(str(tmp_path), at_ms=early) == {"files": 0, "mb": 0.0}
    assert live_tables(str(tmp_path), at_ms=now_ms() + 1000)["files"] == 1


def test_answer_lag_takes_the_percentiles_of_the_recent_answers_only(tmp_path: Path):
    table = tmp_path / "answers"
    write_deltalake(str(table), _answers([10, 20, 30, 40]), mode="append")
    lag = answer_lag(str(table), since_ms=30)
    assert lag["answers"] == 4
    assert lag["p50"] in (300.0, 350.0, 400.0) and lag["p99"] <= 400.0
    assert lag["submit_p50"] in (21.0, 24.0, 25.0, 28.0)   # of the recent two: 21 and 28 ms


def test_lag_windows_split_the_answers_by_event_time(tmp_path: Path):
    table = tmp_path / "answers"
    rows = pa.table({"enqueue_ts": [0, 1000, 600_000, 600_500],
                     "submit_ts": [100, 1100, 600_300, 600_900],
                     "received_ts": [110, 1110, 600_310, 600_910],
                     "finish_ts": [500, 1500, 601_310, 601_910],
                     "latency_ms": [600, 700, 1500, 1600],
                     "answer_source": ["llm", "fallback", "llm", "llm"]})
    write_deltalake(str(table), rows, mode="append")
    first, second = lag_windows(str(table), minutes=10)
    assert (first["from_minute"], first["answers"], first["fallback_pct"]) == (0, 2, 50.0)
    assert first["event_to_submitted_ms"]["p50"] == 100.0
    assert (second["from_minute"], second["answers"], second["fallback_pct"]) == (10, 2, 0.0)
    assert second["event_to_submitted_ms"]["p50"] in (300.0, 350.0, 400.0)
    assert second["received_to_finished_ms"]["p99"] <= 1000.0


def test_series_leave_out_what_no_sample_has():
    rows = [{"driver": {"rss_mb": 1.0}, "broker": {"rss_mb": None}},
            {"driver": {"rss_mb": 2.0}, "broker": {"rss_mb": None}}]
    series = _series(rows, {"driver": ("driver", "rss_mb"), "broker": ("broker", "rss_mb"),
                            "absent": ("nothing", "at_all")})
    assert series == {"driver": [1.0, 2.0]}


def test_replot_fills_in_the_live_tables_of_an_older_run(tmp_path: Path):
    write_deltalake(str(tmp_path / "work" / "tables" / "answers"), _answers([1]),
                    mode="append")
    proc = {"rss_mb": 1.0, "open_files": 3}
    sample = {"minute": 1.0, "driver": proc, "driver_jvm": proc, "sidecar": proc,
              "broker": {"rss_mb": None, "open_files": None}, "events_mb": 0.1,
              "event_files": 2, "results_mb": 0.1, "result_files": 1, "tables_mb": 0.1,
              "table_data_files": 1, "table_log_files": 1, "checkpoints_mb": 0.1,
              "checkpoint_files": 5, "lag_ms": {"answers": 1, "p50": 10.0, "p99": 20.0}}
    (tmp_path / "soak.json").write_text(json.dumps(
        {"start_ms": now_ms(), "samples": [sample]}), encoding="utf-8")

    assert main(["--replot", "--out", str(tmp_path)]) == 0

    row = json.loads((tmp_path / "soak.json").read_text(encoding="utf-8"))["samples"][0]
    assert row["tables_live"]["files"] == 1 and "ts_ms" in row
    assert doc_windows(tmp_path)[0]["answers"] == 1
    assert (tmp_path / "soak.png").stat().st_size > 0


def doc_windows(out: Path) -> list[dict]:
    return json.loads((out / "soak.json").read_text(encoding="utf-8"))["windows"]


class _Pipeline:
    """What the sampler reads of a pipeline: its queries, counters, lag and backlog."""

    def __init__(self, counts: PipelineCounts) -> None:
        self.queries, self.counts, self.open_requests = [], counts, 0

    def kafka_lag(self) -> dict:
        return {}


def test_the_write_cost_per_sample_is_the_intervals_median_not_the_last_micro_batch(
        tmp_path: Path):
    counts = PipelineCounts()
    now = now_ms()
    counts.add_batch({"ledger": 900.0, "answers": 900.0}, ended_ms=now - 120_000)  # earlier
    for ledger, answers in ((300.0, 200.0), (400.0, 250.0), (350.0, 1_000.0)):
        counts.add_batch({"ledger": ledger, "answers": answers}, ended_ms=now - 1_000)
    sampler = SoakSampler(tmp_path, every_s=60.0)
    sampler.pipeline = _Pipeline(counts)
    facts = sampler._pipeline_facts()
    assert facts["answers_write_ms"] == {"ledger": 350.0, "answers": 250.0}
    assert facts["conflicts_retried"] == 0 and facts["kafka_lag"] == 0
