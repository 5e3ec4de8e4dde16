"""The Spark side on real Spark (local mode), the real sidecar and real Delta tables."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from spark_ext.config import PipelineConfig
from spark_ext.exceptions import TemplateOrderError
from spark_ext.pipeline import StsPipeline
from spark_ext.submit import submit_requests
from spark_ext.tagging import build_requests
from spark_ext.template import PromptTemplate
from tests.utils import REPO, RemoteSidecar, free_port, wait_until

pytestmark = pytest.mark.timeout(300)


def _config(tmp: Path, endpoint: str, results_dir: str, **sections) -> PipelineConfig:
    data = {
        "source": {"path": str(tmp / "events")},
        "tagging": {"event_time_ms": None, "max_tokens": 8,
                    "sla_ms": {"high": 20_000, "normal": 30_000, "low": 40_000}},
        "sidecar": {"endpoint": endpoint, "results_dir": results_dir, "timeout_s": 3.0},
        "join": {"grace_ms": 1000, "results_watermark": "2 seconds"},
        "output": {"out_dir": str(tmp / "out"), "checkpoint_dir": str(tmp / "ckpt"),
                   "acks_dir": str(tmp / "acks"), "trigger_s": 0.5},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return PipelineConfig.from_dict(data)


def _write_events(tmp: Path, name: str, events: list[dict]) -> None:
    folder = tmp / "events"
    folder.mkdir(parents=True, exist_ok=True)
    tmp_file = folder / f".{name}.tmp"
    tmp_file.write_text("".join(json.dumps(e) + "\n" for e in events))
    tmp_file.rename(folder / f"{name}.json")


def _events(prefix: str, n: int) -> list[dict]:
    prios = ["high", "normal", "low"]
    return [{"event_id": f"{prefix}-{i}", "text": f"My order {i} is late.",
             "priority": prios[i % 3], "event_ts": 0} for i in range(n)]


def _answers(pipeline: StsPipeline) -> dict[str, dict]:
    if not pipeline.answers.exists():
        return {}
    rows = pipeline.answers.read().to_pylist()
    by_id = {r["request_id"]: r for r in rows}
    assert len(by_id) == len(rows), "two answers for one request"
    return by_id


def _run_until(pipeline: StsPipeline, done, timeout_s: float = 90.0) -> dict[str, dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        pipeline.process_all_available()
        answers = _answers(pipeline)
        if done(answers):
            return answers
        assert time.monotonic() < deadline, f"not done after {timeout_s}s: {answers}"
        time.sleep(0.5)


def test_template_with_dynamic_fields_first_is_refused() -> None:
    with pytest.raises(TemplateOrderError, match="empty"):
        PromptTemplate.from_string("{text}\nYou are a support assistant. Answer briefly.")
    with pytest.raises(TemplateOrderError, match="per-event fields"):
        PromptTemplate(stable="Customer {name} says:", dynamic="{text}")
    with pytest.raises(TemplateOrderError, match="fixed content must come first"):
        PromptTemplate(stable="Hi.\n", dynamic="{text}\nYou are a support assistant. "
                                              "Answer in one polite sentence.")
    ok = PromptTemplate.from_string("You are a support assistant.\nTicket: {text}")
    assert ok.stable == "You are a support assistant.\nTicket: "
    assert ok.render({"text": "late"}).endswith("Ticket: late")


def test_request_tagging_is_stable_and_complete(spark, tmp_path: Path) -> None:
    cfg = _config(tmp_path, "unused", "unused")
    events = spark.createDataFrame(_events("tag", 3) + _events("tag", 1))
    template = PromptTemplate(stable=cfg.template.stable, dynamic=cfg.template.dynamic)
    rows = build_requests(events, cfg.tagging, template).collect()
    assert rows[0]["request_id"] == rows[3]["request_id"], "replayed event got a new id"
    assert len({r["request_id"] for r in rows}) == 3
    for r in rows:
        assert r["prompt"].startswith(cfg.template.stable) and r["prompt"].endswith(r["text"])
        assert r["deadline_ts"] - r["enqueue_ts"] == cfg.tagging.sla_ms[r["priority"]]
        assert r["cache_key"] == template.cache_key
        assert r["callback_topic"] == f"llm.result.{r['priority']}"


def test_per_event_max_tokens_column_is_clipped_to_the_cap(spark, tmp_path: Path) -> None:
    cfg = _config(tmp_path, "unused", "unused",
                  tagging={"max_tokens": 100, "max_tokens_column": "budget"})
    events = [dict(e, budget=b) for e, b in zip(_events("mt", 4), [7, 0, 5000, None])]
    df = spark.createDataFrame(events, "event_id string, text string, priority string, "
                                       "event_ts long, budget int")
    template = PromptTemplate(stable=cfg.template.stable, dynamic=cfg.template.dynamic)
    rows = build_requests(df, cfg.tagging, template).orderBy("event_id").collect()
    assert [r["max_tokens"] for r in rows] == [7, 1, 100, 100]


def test_submit_returns_before_generation(spark, tmp_path: Path,
                                          tiny_sidecar: RemoteSidecar) -> None:
    cfg = _config(tmp_path, tiny_sidecar.target, str(tiny_sidecar.results_dir),
                  tagging={"max_tokens": 1500})
    template = PromptTemplate(stable=cfg.template.stable, dynamic=cfg.template.dynamic)
    requests = build_requests(spark.createDataFrame(_events("fire", 4)), cfg.tagging, template)
    start = time.monotonic()
    acks = submit_requests(requests, cfg.sidecar).collect()
    elapsed = time.monotonic() - start
    assert [a["accepted"] for a in acks] == [True] * 4
    assert "prompt" not in acks[0].asDict()
    # 4 x 1500 tokens at two at a time take many seconds on this engine; acks do not.
    stats = tiny_sidecar.client.stats()
    busy = sum(p.in_flight + p.queued for p in stats.pools)
    assert busy >= 2, f"generation already over after {elapsed:.1f}s: acks waited for it"


def test_pipeline_answers_with_llm_and_replay_writes_nothing_twice(
        spark, tmp_path: Path, tiny_sidecar: RemoteSidecar) -> None:
    cfg = _config(tmp_path, tiny_sidecar.target, str(tiny_sidecar.results_dir))
    _write_events(tmp_path, "batch1", _events("llm", 6))
    pipeline = StsPipeline(spark, cfg)
    pipeline.start()
    try:
        answers = _run_until(pipeline, lambda a: len(a) == 6)
    finally:
        pipeline.stop()
    assert {a["answer_source"] for a in answers.values()} == {"llm"}
    assert all(a["answer"].strip() and a["status"] == "ok" for a in answers.values())
    assert all(a["deadline_met"] for a in answers.values())
    assert {a["event_id"] for a in answers.values()} == {f"llm-{i}" for i in range(6)}

    # Replay: forget the submit query's last commit so it re-runs that micro-batch.
    commits = sorted((tmp_path / "ckpt" / "submit" / "commits").glob("[0-9]*"),
                     key=lambda p: int(p.name))
    commits[-1].unlink()
    commits[-1].with_name(f".{commits[-1].name}.crc").unlink(missing_ok=True)
    before = tiny_sidecar.client.stats().duplicates
    pipeline = StsPipeline(spark, cfg)
    pipeline.start()
    try:
        pipeline.process_all_available()
        wait_until(lambda: tiny_sidecar.client.stats().duplicates >= before + 6,
                   what="the re-run batch reaching the sidecar")
        pipeline.process_all_available()
    finally:
        pipeline.stop()
    assert len(_answers(pipeline)) == 6
    assert DeltaTable(cfg.output.table("requests")).to_pyarrow_table().num_rows == 6


def test_unreachable_sidecar_gives_fallbacks_and_keeps_running(spark, tmp_path: Path) -> None:
    cfg = _config(tmp_path, f"127.0.0.1:{free_port()}", str(tmp_path / "results"),
                  sidecar={"timeout_s": 1.0})
    _write_events(tmp_path, "down1", _events("down", 3))
    pipeline = StsPipeline(spark, cfg)
    pipeline.start()
    try:
        answers = _run_until(pipeline, lambda a: len(a) == 3)
        _write_events(tmp_path, "down2", _events("down-later", 2))
        answers = _run_until(pipeline, lambda a: len(a) == 5)
        assert all(q.isActive for q in pipeline.queries)
    finally:
        pipeline.stop()
    assert {a["answer_source"] for a in answers.values()} == {"fallback"}
    assert {a["status"] for a in answers.values()} == {"unavailable"}
    assert all(a["answer"] == cfg.join.fallback_text for a in answers.values())


def test_sidecar_refusal_answers_with_the_pools_fallback_text(
        spark, tmp_path: Path, tiny_sidecar: RemoteSidecar) -> None:
    """The sidecar refuses (max_tokens over its cap); each answer is the rule text of the
    request's pool from conf/sidecar.yaml, not the pipeline's generic fallback."""
    from sidecar.config import SidecarConfig

    pools = SidecarConfig.from_yaml(REPO / "conf" / "sidecar.yaml").scheduler.pools
    cfg = _config(tmp_path, tiny_sidecar.target, str(tiny_sidecar.results_dir),
                  tagging={"max_tokens": 100_000})
    _write_events(tmp_path, "refused", _events("refused", 3))
    pipeline = StsPipeline(spark, cfg)
    pipeline.start()
    try:
        answers = _run_until(pipeline, lambda a: len(a) == 3)
    finally:
        pipeline.stop()
    assert {a["status"] for a in answers.values()} == {"max_tokens_out_of_range"}
    for a in answers.values():
        assert a["answer"] == a["fallback_text"] == pools[a["priority"]].fallback_text
    assert len({a["answer"] for a in answers.values()}) == 3


def test_late_result_gets_fallback_then_backfill(spark, tmp_path: Path,
                                                 tiny_sidecar: RemoteSidecar) -> None:
    """The sidecar answers, but its result files reach Spark only after the window
    closed (a delayed result channel): fallback first, then backfill."""
    delayed = tmp_path / "delayed-results"
    cfg = _config(tmp_path, tiny_sidecar.target, str(delayed))
    _write_events(tmp_path, "late", _events("late", 2))
    pipeline = StsPipeline(spark, cfg)
    pipeline.start()
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "out" / "requests").exists():
            pipeline.process_all_available()
            assert time.monotonic() < deadline
        ids = set(DeltaTable(cfg.output.table("requests")).to_pandas()["request_id"])
        pipeline.drain()  # the window closes with no result in sight
        answers = _run_until(pipeline, lambda a: len(a) == 2)
        assert {a["answer_source"] for a in answers.values()} == {"fallback"}
        assert {a["status"] for a in answers.values()} == {"timeout"}
        # now the delayed result files arrive
        from tests.utils import wait_for_results
        wait_for_results(tiny_sidecar.results_dir, ids)
        for f in tiny_sidecar.results_dir.glob("*.parquet"):
            if ids & set(pq.read_table(f, columns=["request_id"]).column(0).to_pylist()):
                shutil.copy(f, delayed / f.name)
        answers = _run_until(pipeline, lambda a: all(x["answer_source"] == "backfill"
                                                     for x in a.values()))
    finally:
        pipeline.stop()
    for a in answers.values():
        assert a["answer"].strip() and a["answer"] != cfg.join.fallback_text
        assert a["fallback_text"] == cfg.join.fallback_text
        assert a["backfilled_at"] is not None and a["status"] == "ok"


SINK_SCRIPT = """
import sys, pyarrow as pa
from spark_ext.sink import DeltaSink, backfill_answers
sink = DeltaSink(sys.argv[1])
sink.insert_new(pa.table({"request_id": ["a", "b"], "answer": ["x", "y"],
                          "answer_source": ["fallback", "llm"], "enqueue_ts": [1, 1]}))
sink.insert_new(pa.table({"request_id": ["a", "c"], "answer": ["dup", "z"],
                          "answer_source": ["llm", "llm"], "enqueue_ts": [1, 1]}))
rows = sink.read(["request_id", "answer"], filters=[("request_id", "in", ["a", "c"])])
assert sorted(rows.to_pylist(), key=lambda r: r["request_id"]) == [
    {"request_id": "a", "answer": "x"}, {"request_id": "c", "answer": "z"}], rows
assert sink.read().num_rows == 3
"""


def test_delta_sink_merges_and_the_process_exits_cleanly(tmp_path: Path) -> None:
    """insert_new keeps the first answer per id, and reading back does not make the
    interpreter abort at exit (a delta-rs reader left threads behind: exit 134)."""
    import subprocess
    import sys

    from tests.utils import REPO

    done = subprocess.run([sys.executable, "-c", SINK_SCRIPT, str(tmp_path / "t")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
