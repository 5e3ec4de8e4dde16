"""`sts demo` end to end: real SmolLM2 sidecar, real Spark, real Delta tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_ext.l4.answer_store import AnswerStore
from sts_harness.demo import DemoOptions, load_samples, run_demo
from sts_harness.warm_up import is_warm_up


def test_samples_are_realistic_and_mixed() -> None:
    samples = load_samples()
    assert len(samples) >= 200
    assert {s["priority"] for s in samples} == {"high", "normal", "low"}
    assert len({s["ticket_id"] for s in samples}) == len(samples)
    assert all(s["customer_id"] for s in samples)  # the feature lookup's key


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_answers_every_event_once_with_llm_and_fallback(tmp_path: Path,
                                                             smollm2_dir: Path) -> None:
    # Independent of machine speed: a `high` SLA of 200 ms is shorter than the way from the
    # landing folder through Spark to the sidecar, so every high ticket misses its deadline
    # and must get a fallback; `normal`/`low` get 120 s, which even a slow, shared CI core
    # meets for the first answers.
    opts = DemoOptions(rate=4.0, duration=8.0, out=str(tmp_path / "demo"), max_tokens=16,
                       sla_ms=(200, 120_000, 120_000), drain_timeout_s=120.0)
    summary = run_demo(opts)
    tables = Path(summary["tables"]["answers"]).parent
    rows = AnswerStore(str(tables), key_columns=[]).read("answers").to_pylist()
    assert summary["incomplete"] is None
    # The warm-up's tickets went through first, each answered before the first replayed
    # event; their rows stay in the table and count in no figure.
    warm = [a for a in rows if is_warm_up(a)]
    answers = [a for a in rows if not is_warm_up(a)]
    assert len(warm) == opts.warm_up > 0
    assert max(a["answered_ts"] for a in warm) <= min(a["enqueue_ts"] for a in answers)
    assert summary["events"] == len(answers) == len({a["request_id"] for a in answers})
    assert all(a["answer"] for a in answers)
    sources = {a["answer_source"] for a in answers}
    assert "llm" in sources and sources & {"fallback", "backfill"}, summary
    assert all(a["answer_source"] != "llm" for a in answers if a["priority"] == "high"), summary
    assert summary["latency_ms_by_priority"]["high"]["n"] > 0
    assert summary["llm_within_sla"]["high"]["llm_on_time"] == 0
    assert summary["hops_ms"]["event -> answer landed"]["n"] == sum(
        a["answer_source"] in ("llm", "fallback") for a in answers)  # hops of the LLM path
    # L1 + L2 run by default: FAQ tickets are answered from the knowledge base, and every
    # answer of the model, the fallback or the knowledge base names the articles it used.
    assert summary["answers_by_source"]["kb"] > 0 and summary["retrieval"]["hit_share"] > 0.5
    assert all(a["kb_ids"] is not None for a in answers
               if a["answer_source"] in ("llm", "fallback", "kb")), answers
    assert all(a["reason"] == f"kb:{a['kb_ids']}" for a in answers if a["answer_source"] == "kb")
    # The plots are written next to the tables and listed in the summary.
    assert [Path(p).name for p in summary["plots"]] == ["latency_over_time.png",
                                                         "answers_by_source.png"]
    assert all(Path(p).stat().st_size > 10_000 for p in summary["plots"])
    # The files Spark read moved out of the landing folder (cleanSource: archive), none lost
    # or kept twice: the folder Spark lists every micro-batch stays small on a long run.
    out = Path(opts.out)
    landing = list((out / "events").glob("*.json"))
    read = list((out / "events-read").rglob("*.json"))
    assert read and not {f.name for f in landing} & {f.name for f in read}
    events = [line for f in landing + read for line in f.read_text().splitlines()]
    assert len(events) == summary["events"] + opts.warm_up
