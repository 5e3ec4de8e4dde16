"""The demo's summary with L1/L2: answers by source, retrieval hit rates, kb_ids per
source; a safety-net fallback still names the articles its request used."""

from __future__ import annotations

from spark_ext.l4.answers import answers_for_lost
from sts_harness.demo import SOURCES, print_summary, summarize


def _answer(source: str, kb_ids: str | None, priority: str = "normal") -> dict:
    return {"request_id": f"r-{source}-{kb_ids}", "priority": priority, "answer": "x",
            "answer_source": source, "status": "ok", "reason": None, "latency_ms": 100,
            "deadline_met": True, "kb_ids": kb_ids, "enqueue_ts": 0, "answered_ts": 100}


def test_summary_counts_every_source_and_the_retrieval_figures(capsys) -> None:
    answers = [_answer("llm", "kb-a,kb-b"), _answer("fallback", ""), _answer("kb", "faq-1"),
               _answer("kb", "faq-2"), _answer("rule", None)]
    fast_path = {"events": 5, "routes": {"kb": 2, "llm": 2, "rule": 1}, "hit_share": 0.8,
                 "kb_share": 0.4, "mean_top_score": 0.71}
    summary = summarize(answers, events=5, wall_s=10.0, stats={}, fast_path=fast_path)
    assert list(summary["answers_by_source"]) == list(SOURCES)
    assert summary["answers_by_source"] == {"llm": 1, "fallback": 1, "backfill": 0,
                                            "rule": 1, "kb": 2}
    r = summary["retrieval"]
    assert r["without_llm"] == 0.6 and r["hit_share"] == 0.8
    assert r["with_kb_ids"] == {"llm": "1/1", "fallback": "1/1", "rule": "0/1", "kb": "2/2"}
    # normal: 5 events, 3 answered by L1/L2 (2 kb, 1 rule), 2 left to the LLM, 1 on time.
    sla = summary["llm_within_sla"]["normal"]
    assert (sla["events"], sla["to_llm"], sla["llm_on_time"]) == (5, 2, 1)
    assert sla["share"] == 0.2 and sla["share_of_to_llm"] == 0.5
    assert summary["llm_within_sla"]["high"]["share_of_to_llm"] is None  # no high events
    summary |= {"tables": {}, "plots": [], "incomplete": None}
    print_summary(summary)
    out = capsys.readouterr().out
    assert "normal  LLM within SLA    1/5    ( 20%), 1/2 left to the LLM (50%)" in out
    assert "answered without the LLM (rule + kb) 60%" in out
    assert "hit rate 80%" in out and "FAQ answers 40%" in out and "top-1 score 0.71" in out
    assert summarize(answers, events=5, wall_s=1.0, stats={})["retrieval"] is None


def test_a_safety_net_fallback_keeps_the_articles_of_its_request() -> None:
    lost = answers_for_lost([{"request_id": "r1", "deadline_ts": 5, "kb_ids": ["a", "b"],
                              "event_id": "e1"}, {"request_id": "r2", "deadline_ts": 5}],
                            key_columns=["event_id"], fallback_text="later")
    assert [(a["kb_ids"], a["reason"]) for a in lost] == [("a,b", "no_result"),
                                                          (None, "no_result")]


def test_the_micro_batch_line_counts_the_batches_since_the_replay_began(capsys) -> None:
    summary = summarize([_answer("llm", None)], events=1, wall_s=1.0, stats={})
    summary |= {"tables": {}, "plots": [], "incomplete": None,
                "batch_ms": {"sts-answers": {"p50": 900, "p99": 1200, "n": 40}}}
    print_summary(summary)
    assert ("micro-batches sts-answers  40 with input since the replay began, P50 900 ms, "
            "P99 1200 ms") in capsys.readouterr().out


def test_the_model_answers_readable_by_their_deadline_are_counted_where_known(capsys) -> None:
    in_time = _answer("llm", None, "high") | {"deadline_ts": 1_000, "readable_ts": 900}
    late = _answer("llm", None, "high") | {"request_id": "r2", "deadline_ts": 1_000,
                                           "readable_ts": 1_400}
    summary = summarize([in_time, late], events=2, wall_s=1.0, stats={})
    high = summary["llm_within_sla"]["high"]
    assert (high["llm_on_time"], high["llm_readable_on_time"]) == (2, 1)
    assert summary["hops_ms"]["answer landed -> readable"]["n"] == 2
    summary |= {"tables": {}, "plots": [], "incomplete": None}
    print_summary(summary)
    assert "high    LLM within SLA    2/2    (100%), 1 readable by the deadline" in \
        capsys.readouterr().out
    without = summarize([_answer("llm", None, "high")], events=1, wall_s=1.0, stats={})
    assert "llm_readable_on_time" not in without["llm_within_sla"]["high"]
