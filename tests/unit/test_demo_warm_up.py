"""The demo's warm-up (:func:`sts_harness.demo.warm_up_pipeline`): what it sends, what it
waits for before the replay, and what it leaves out of the summary's counts."""

from __future__ import annotations

import collections
from types import SimpleNamespace

import pyarrow as pa
import pytest

from spark_ext.l2.fast_path import FastPathStats
from sts_harness.demo import load_samples, warm_up_pipeline, warm_up_samples
from sts_harness.warm_up import is_warm_up


class _Pipeline:
    """A pipeline that answers the events a sink hands it one per ``check()``, each by the
    model or from the knowledge base (the caller's behaviour is what is tested: what it
    sends, what it waits for). Its record tables appear at the ``check()`` after their
    first rows."""

    def __init__(self, *, writes_with_spark: bool, answers_them: bool = True) -> None:
        self.answers_them = answers_them
        self.pending: list[dict] = []
        self.rows: list[dict] = []
        self.written: set[str] = set()
        self.spark = None
        self.store = SimpleNamespace(stats=SimpleNamespace(
            answers_written=0, by_source=collections.Counter()), read=self._read)
        self.tables = SimpleNamespace(writes_with_spark=writes_with_spark,
                                      exists=lambda _spark, name: name in self.written)
        self.fast_path_stats = FastPathStats()
        self.fast_path_stats.add(pa.table({"route": ["llm"]}))
        self.waited_for: list[str] = []

    def sink(self, start_ms: int, part: int, events: list[dict]) -> None:
        self.pending += events

    def _read(self, name: str, columns: list[str]) -> pa.Table:
        return pa.Table.from_pylist([{c: r[c] for c in columns} for r in self.rows])

    def check(self) -> None:
        if self.rows:
            self.written |= {"requests"} | (
                {"results"} if any(r["answer_source"] == "llm" for r in self.rows) else set())
        if self.pending and self.answers_them:
            e = self.pending.pop(0)
            source = "kb" if "password" in e["text"].lower() else "llm"
            self.rows.append({"event_id": e["event_id"], "answer_source": source})
            self.store.stats.answers_written += 1
            self.store.stats.by_source[source] += 1


def test_the_warm_up_tickets_are_the_last_high_and_normal_ones_and_none_is_replayed() -> None:
    samples = load_samples()
    picked = warm_up_samples(samples, 6)
    assert len(picked) == 6 and {s["priority"] for s in picked} <= {"high", "normal"}
    assert all("ticket_id" not in s and s["text"] and s["customer_id"] for s in picked)
    # a default run replays ~5.5 events/s for 40 s: the first ~220 of the 300 tickets
    last = [s for s in samples if s["priority"] in ("high", "normal")][-6:]
    assert samples.index(last[0]) > 250


def test_the_replay_waits_until_every_warm_up_event_is_answered() -> None:
    pipeline = _Pipeline(writes_with_spark=False)
    samples = warm_up_samples(load_samples(), 4)
    warm_up_pipeline(pipeline, pipeline.sink, samples, timeout_s=10)
    assert len(pipeline.rows) == 4 and all(is_warm_up(r) for r in pipeline.rows)
    assert pipeline.fast_path_stats.events == 0  # L1/L2's counts are the replay's alone


def test_with_delta_on_spark_the_record_tables_first_append_is_part_of_the_warm_up() -> None:
    pipeline = _Pipeline(writes_with_spark=True)
    warm_up_pipeline(pipeline, pipeline.sink, [{"text": "Order #1 is late", "priority": "high"}],
                     timeout_s=10)
    assert pipeline.written == {"requests", "results"}
    # answered from the knowledge base only: no result record to wait for
    kb_only = _Pipeline(writes_with_spark=True)
    warm_up_pipeline(kb_only, kb_only.sink, [{"text": "Password reset?", "priority": "high"}],
                     timeout_s=10)
    assert kb_only.written == {"requests"}


def test_a_warm_up_never_answered_stops_the_demo_with_a_timeout() -> None:
    pipeline = _Pipeline(writes_with_spark=False, answers_them=False)
    with pytest.raises(TimeoutError, match="warm-up events not answered"):
        warm_up_pipeline(pipeline, pipeline.sink, [{"text": "Hi", "priority": "high"}],
                         timeout_s=0.5)
