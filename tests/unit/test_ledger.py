"""The ledger that gives each request one answer row (:mod:`spark_ext.l4.ledger`), the
candidates it decides on (:mod:`spark_ext.l4.candidates`) and the clock that wakes it
(:mod:`spark_ext.sources.clock`), in process on Arrow tables (no Spark)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from sidecar.contract import RESULT_SCHEMA
from spark_ext.config import ValidationConfig
from spark_ext.l4.candidates import NOW as NOW_COL, PAYLOAD, ack_candidates, result_candidates
from spark_ext.l4.ledger import (APPEND, MERGE, RECORD, LedgerState, hold_records, ledger_schema,
                                 ledger_step, stats_payload)
from spark_ext.sources.clock import next_tick, read_hint, write_hint

KEYS = ("event_id",)
SCHEMA = ledger_schema(KEYS)
T0 = 1_800_000_000_000
GRACE, HOLD = 1_000, 30_000


def _candidate(rid: str, kind: str, source: str = "llm", *, table: str = "answers",
               enqueue: int = T0, deadline: int = T0 + 5_000, **extra) -> dict:
    return {"request_id": rid, "answer_source": source, "answer": f"{source} answer",
            "status": "ok" if source == "llm" else "timeout", "_kind": kind, "_table": table,
            "enqueue_ts": enqueue, "deadline_ts": deadline, "answered_ts": T0,
            "_due_ts": deadline + GRACE if kind == "watch" and deadline else None,
            "_expire_ts": deadline + GRACE + HOLD if deadline else None, "event_id": f"e-{rid}", **extra}


def _step(state: LedgerState, rows: list[dict], now: int, merge_before: int = 0):
    out, after = ledger_step(state, pa.Table.from_pylist(rows, SCHEMA), now=now,
                             merge_before=merge_before)
    return [(r["request_id"], r["_kind"], r["answer_source"]) for r in out.to_pylist()], after


def test_the_first_answer_wins_and_repeats_are_dropped() -> None:
    out, st = _step(LedgerState.empty(SCHEMA), [
        _candidate("a", "answer"), _candidate("a", "answer"),   # a repeated result row
        _candidate("b", "answer", "fallback"), _candidate("b", "answer")], now=T0)
    assert out == [("a", APPEND, "llm"), ("b", APPEND, "fallback"), ("b", MERGE, "backfill")]
    out, st = _step(st, [_candidate("a", "answer"), _candidate("b", "answer")], now=T0 + 100)
    assert out == []  # a replayed batch of the same results: nothing twice
    assert st.answered.num_rows == 2 and st.open.num_rows == 0


def test_an_accepted_request_without_an_answer_gets_its_fallback_at_due_time() -> None:
    st = LedgerState.empty(SCHEMA)
    out, st = _step(st, [_candidate("lost", "watch", "fallback", reason="no_result"),
                         _candidate("kept", "watch", "fallback", reason="no_result")], now=T0)
    assert out == [] and stats_payload(st, 0)["next_due_ts"] == T0 + 5_000 + GRACE
    out, st = _step(st, [_candidate("kept", "answer")], now=T0 + 2_000)
    assert out == [("kept", APPEND, "llm")]
    out, st = _step(st, [], now=T0 + 5_000 + GRACE - 1)  # a tick before the due time
    assert out == []
    out, st = _step(st, [], now=T0 + 5_000 + GRACE)
    assert out == [("lost", APPEND, "fallback")]
    assert st.open.num_rows == 0 and stats_payload(st, 0)["next_due_ts"] is None
    # the model's answer after the fallback backfills it; once
    out, st = _step(st, [_candidate("lost", "answer")], now=T0 + 9_000)
    assert out == [("lost", MERGE, "backfill")]
    out, _ = _step(st, [_candidate("lost", "answer")], now=T0 + 9_500)
    assert out == []


def test_a_result_before_its_ack_answers_and_the_ack_then_changes_nothing() -> None:
    out, st = _step(LedgerState.empty(SCHEMA), [_candidate("r", "answer")], now=T0)
    assert out == [("r", APPEND, "llm")]
    out, st = _step(st, [_candidate("r", "watch", "fallback")], now=T0 + 100)
    assert out == [] and st.open.num_rows == 0
    out, _ = _step(st, [], now=T0 + 60_000)
    assert out == []  # no fallback ever for it


def test_the_fallback_row_given_late_is_timed_when_it_is_given() -> None:
    st = LedgerState.empty(SCHEMA)
    _, st = _step(st, [_candidate("x", "watch", "fallback")], now=T0)
    out, _ = ledger_step(st, SCHEMA.empty_table(), now=T0 + 7_000, merge_before=0)
    row = out.to_pylist()[0]
    assert (row["answered_ts"], row["latency_ms"], row["deadline_met"]) == (
        T0 + 7_000, 7_000, False)


def test_what_the_ledger_cannot_know_goes_to_the_table_as_a_merge() -> None:
    """Past its hold, or enqueued before this run's checkpoint began, a request may have
    an answer the ledger never saw: its candidates are merged (insert if missing)."""
    old = _candidate("old", "answer", deadline=T0 - 60_000)
    out, st = _step(LedgerState.empty(SCHEMA), [old], now=T0)
    assert out == [("old", MERGE, "llm")]
    before = _candidate("before", "watch", "fallback", enqueue=T0 - 10)
    out, st = _step(st, [before], now=T0, merge_before=T0)
    out, st = _step(st, [], now=T0 + 6_000, merge_before=T0)
    assert out == [("before", MERGE, "fallback")]
    out, _ = _step(st, [_candidate("new", "answer")], now=T0, merge_before=T0 - 1)
    assert out == [("new", APPEND, "llm")]


def test_answered_requests_are_forgotten_after_their_hold() -> None:
    _, st = _step(LedgerState.empty(SCHEMA), [_candidate("a", "answer")], now=T0)
    assert st.answered.num_rows == 1
    _, st = _step(st, [], now=T0 + 5_000 + GRACE + HOLD)
    assert st.answered.num_rows == 0


def test_shadow_answers_are_never_backfilled() -> None:
    out, _ = _step(LedgerState.empty(SCHEMA), [
        _candidate("s", "answer", "fallback", table="shadow_answers"),
        _candidate("s", "answer", table="shadow_answers"),
        _candidate("s", "answer")], now=T0)  # the served answer of the same request
    assert out == [("s", APPEND, "fallback"), ("s", APPEND, "llm")]


def test_state_survives_its_bytes() -> None:
    _, st = _step(LedgerState.empty(SCHEMA), [_candidate("w", "watch", "fallback"),
                                              _candidate("a", "answer")], now=T0)
    again = LedgerState.from_bytes(*st.to_bytes(), schema=SCHEMA)
    assert again.open.to_pylist() == st.open.to_pylist()
    assert again.answered.to_pylist() == st.answered.to_pylist()


def test_records_are_held_until_the_next_window() -> None:
    record = lambda t: {"_kind": RECORD, "_table": "requests", "_now": t}  # noqa: E731
    rows = pa.Table.from_pylist([record(T0)], SCHEMA)
    out, held = hold_records(SCHEMA.empty_table(), rows, now=T0, every_ms=10_000)
    assert (out.num_rows, held.num_rows) == (0, 1)
    st = LedgerState(LedgerState.empty(SCHEMA).answered, SCHEMA.empty_table(), held)
    assert stats_payload(st, 10_000)["next_due_ts"] == (T0 // 10_000 + 1) * 10_000
    out, held = hold_records(held, pa.Table.from_pylist([record(T0 + 10_000)], SCHEMA),
                             now=T0 + 10_000, every_ms=10_000)
    assert (out.num_rows, held.num_rows) == (2, 0)
    out, held = hold_records(SCHEMA.empty_table(), rows, now=T0, every_ms=0)
    assert (out.num_rows, held.num_rows) == (1, 0)


def test_the_record_tables_flush_half_a_window_apart() -> None:
    """``requests`` and ``results`` hold records for the same 10 s windows, shifted by
    5 s against each other: no micro-batch commits both, and a bucket's next wake-up is
    the earlier of the two."""
    start = T0 - T0 % 10_000  # a window's start for requests, mid-window for results
    held = pa.Table.from_pylist([{"_kind": RECORD, "_table": t, "_now": start + 1_000}
                                 for t in ("requests", "results")], SCHEMA)
    st = LedgerState(LedgerState.empty(SCHEMA).answered, SCHEMA.empty_table(), held)
    assert stats_payload(st, 10_000)["next_due_ts"] == start + 5_000  # results' window ends
    flushed = []
    for now in range(start + 2_000, start + 22_000, 1_000):
        out, held = hold_records(held, SCHEMA.empty_table(), now=now, every_ms=10_000)
        flushed += [(now - start, t) for t in sorted(set(out.column("_table").to_pylist()))]
        new = [{"_kind": RECORD, "_table": t, "_now": now} for t in ("requests", "results")]
        held = pa.concat_tables([held, pa.Table.from_pylist(new, SCHEMA)])
    assert flushed == [(5_000, "results"), (10_000, "requests"), (15_000, "results"),
                       (20_000, "requests")]


def _results(*rows: dict) -> pa.Table:
    table = pa.Table.from_pylist([{
        "request_id": r["request_id"], "trace_id": r["request_id"], "status": r["status"],
        "text": r.get("text", ""), "priority": "high", "enqueue_ts": T0,
        "deadline_ts": T0 + 5_000, "finish_ts": T0 + 900, "late": r.get("late", False),
        "attributes": [("event_id", f"e-{r['request_id']}")], "fallback_text": None}
        for r in rows], schema=pa.schema([RESULT_SCHEMA.field(n).with_nullable(True) for n in (
            "request_id", "trace_id", "status", "text", "priority", "enqueue_ts", "deadline_ts",
            "finish_ts", "late", "attributes", "fallback_text")]))
    table = table.append_column(NOW_COL, pa.array([T0 + 1_000] * len(rows), pa.int64()))
    return table.append_column(PAYLOAD, pa.array([json.dumps({"request_id": r["request_id"]})
                                                  for r in rows]))


def test_result_rows_offer_their_answer_and_their_record() -> None:
    batch = _results({"request_id": "ok1", "status": "ok", "text": "Sure, done."},
                     {"request_id": "bad", "status": "ok", "text": "mail me at a@b.co"},
                     {"request_id": "shed", "status": "shed"})
    out = pa.Table.from_batches(list(result_candidates(
        iter(batch.to_batches()), key_columns=KEYS, fallback_text="Sorry.",
        validation=ValidationConfig(pii=["email"]), grace_ms=GRACE, hold_ms=HOLD)))
    rows = out.to_pylist()
    offers = {(r["request_id"], r["_table"]): r for r in rows}
    assert offers[("ok1", "answers")]["answer_source"] == "llm"
    assert offers[("ok1", "answers")]["answered_ts"] == T0 + 1_000
    assert offers[("ok1", "answers")]["_expire_ts"] == T0 + 5_000 + GRACE + HOLD
    assert (offers[("bad", "answers")]["answer_source"], offers[("bad", "answers")]["status"]
            ) == ("fallback", "invalid")
    assert offers[("shed", "answers")]["answer_source"] == "fallback"
    assert {r["request_id"] for r in rows if r["_table"] == "results"} == {"ok1", "bad", "shed"}
    assert [r["request_id"] for r in rows if r["_table"] == "review_queue"] == ["bad"]
    assert offers[("ok1", "answers")]["event_id"] == "e-ok1"


def test_ack_rows_offer_watches_refusals_and_l1l2_answers() -> None:
    acks = pa.table({
        "request_id": ["acc", "ref", "kb"], "trace_id": ["acc", "ref", "kb"],
        "priority": ["high"] * 3, "enqueue_ts": [T0] * 3, "deadline_ts": [T0 + 5_000] * 3,
        "event_id": ["1", "2", "3"], "route": ["llm", "llm", "kb"],
        "kb_answer": [None, None, "See FAQ 7."], "kb_answer_id": [None, None, "faq-7"],
        "_sts_submit": [True, True, False], "accepted": [True, False, None],
        "reason": [None, "queue_full", None], "sidecar_fallback_text": [None, None, None],
        "submit_ts": [T0 + 5, T0 + 5, None], NOW_COL: [T0 + 10] * 3,
        PAYLOAD: ['{"request_id": "acc"}', '{"request_id": "ref"}', None]})
    out = pa.Table.from_batches(list(ack_candidates(
        iter(acks.to_batches()), key_columns=KEYS, fallback_text="Sorry.", rule_text="Hi!",
        rollout_mode="full", submit_column="_sts_submit", dead_letter_column=None,
        grace_ms=GRACE, hold_ms=HOLD, count_events=False)))
    got = sorted((r["request_id"], r["_kind"], r["_table"], r["answer_source"], r["_due_ts"])
                 for r in out.to_pylist())
    assert got == [("acc", "record", "requests", None, None),
                   ("acc", "watch", "answers", "fallback", T0 + 5_000 + GRACE),
                   ("kb", "answer", "answers", "kb", None),
                   ("ref", "answer", "answers", "fallback", None),
                   ("ref", "record", "requests", None, None)]


def test_the_clock_ticks_when_a_fallback_is_due_and_once_without_a_hint(tmp_path) -> None:
    hint = str(tmp_path / "hint.json")
    assert read_hint(hint) is None
    assert next_tick(None, now_ms=T0, ticked=False)   # a restart: look once
    assert not next_tick(None, now_ms=T0, ticked=True)
    write_hint(hint, {0: T0 + 500, 1: None})
    write_hint(hint, {1: T0 + 900})                   # bucket 0 keeps its due time
    assert not next_tick(read_hint(hint), now_ms=T0, ticked=True)
    assert next_tick(read_hint(hint), now_ms=T0 + 500, ticked=True)
    write_hint(hint, {0: None, 1: None})               # nothing watched: never
    assert not next_tick(read_hint(hint), now_ms=T0 + 10**9, ticked=True)


@pytest.mark.parametrize("kind", ["answer", "watch"])
def test_a_candidate_without_a_deadline_is_decided_by_the_table(kind: str) -> None:
    row = _candidate("n", kind, "fallback", deadline=None)
    row["_expire_ts"] = None
    out, st = _step(LedgerState.empty(SCHEMA), [row], now=T0)
    assert out == [("n", MERGE, "fallback")]  # a watch without a due time: due at once
    assert st.open.num_rows == 0
