"""`sts demo` end to end: real SmolLM2 sidecar, real Spark, real Delta tables."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from spark_ext.demo import DemoOptions, load_samples, run_demo


def test_samples_are_realistic_and_mixed() -> None:
    samples = load_samples()
    assert len(samples) >= 200
    assert {s["priority"] for s in samples} == {"high", "normal", "low"}
    assert len({s["ticket_id"] for s in samples}) == len(samples)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_answers_every_event_once_with_llm_and_fallback(tmp_path: Path,
                                                             smollm2_dir: Path) -> None:
    # Faster than the CPU engine sustains, with tight SLAs: some answers must be fallbacks.
    opts = DemoOptions(rate=8.0, duration=12.0, out=str(tmp_path / "demo"), max_tokens=32,
                       sla_ms=(3000, 5000, 8000), drain_timeout_s=60.0)
    summary = run_demo(opts)
    answers = DeltaTable(summary["tables"]["answers"]).to_pyarrow_table().to_pylist()
    assert summary["events"] == len(answers) == len({a["request_id"] for a in answers})
    assert all(a["answer"] for a in answers)
    sources = {a["answer_source"] for a in answers}
    assert "llm" in sources and sources & {"fallback", "backfill"}, summary
    assert summary["latency_ms_by_priority"]["high"]["n"] > 0
