"""The Spark side on real Spark (local mode), real sidecars and real Delta tables."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sidecar import write_text_atomically
from sidecar.contract import PRIORITY_NAMES
from spark_ext.config import PipelineConfig
from spark_ext.exceptions import TemplateOrderError
from spark_ext.pipeline.sts_pipeline import StsPipeline
from spark_ext.submit.submission import submit_requests
from spark_ext.l2.prompts import build_requests
from spark_ext.l2.template import PromptTemplate
from tests.utils import (
    REPO,
    RemoteSidecar,
    free_port,
    require_tool,
    wait_for_results,
    wait_until,
)

pytestmark = pytest.mark.timeout(300)


def _config(tmp: Path, endpoint: str, results_dir: str, **sections) -> PipelineConfig:
    data = {
        "source": {"path": str(tmp / "events")},
        "tagging": {"event_time_ms": None, "max_tokens": 8,
                    "sla_ms": {"high": 20_000, "normal": 30_000, "low": 40_000}},
        "sidecar": {"endpoint": endpoint, "results_dir": results_dir, "timeout_s": 3.0},
        "answers": {"grace_ms": 1000},
        # the requests/results/review tables at once, not every 10 s (their own test)
        "output": {"out_dir": str(tmp / "out"), "checkpoint_dir": str(tmp / "ckpt"),
                   "writer": "deltalake", "records_interval_s": 0},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return PipelineConfig.from_dict(data)


def _write_events(tmp: Path, name: str, events: list[dict]) -> None:
    write_text_atomically(tmp / "events" / f"{name}.json",
                          "".join(json.dumps(e) + "\n" for e in events))


def _events(prefix: str, n: int) -> list[dict]:
    return [{"event_id": f"{prefix}-{i}", "text": f"My order {i} is late.",
             "priority": PRIORITY_NAMES[i % 3], "event_ts": 0} for i in range(n)]


def _answers(pipeline: StsPipeline) -> dict[str, dict]:
    rows = pipeline.store.read("answers").to_pylist()
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
        time.sleep(0.3)


def _sim_sidecar(tmp: Path, name: str, *extra: str, port: int | None = None) -> RemoteSidecar:
    """A simulated-engine sidecar: 20 ms per decode step, so 100 tokens take ~2 s."""
    args = ["--engine", "simulated", "--sidecar-id", name,
            "--set", "engine.simulated.step_base_ms=20", "--set", "scheduler.deadline_admission=false",
            "--set", "results.flush_interval_s=0.05", *extra]
    sidecar = RemoteSidecar(tmp / "results", args, log_path=tmp / f"{name}.log")
    if port is not None:  # a restart must come back on the same address
        sidecar.port, sidecar.target = port, f"127.0.0.1:{port}"
    return sidecar


def test_the_local_session_runs_the_quick_jit_compiler_only(spark) -> None:
    """C2's compiling took ~40 % of the demo's one Spark core; a local session runs C1
    (with a code cache big enough for Delta's classes)."""
    from spark_ext.session import LOCAL_JAVA_OPTIONS

    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())
    assert "-XX:TieredStopAtLevel=1" in arguments
    assert set(LOCAL_JAVA_OPTIONS.split()) <= set(arguments)


def test_plan_warm_up_writes_no_table_and_a_failure_is_only_logged(
        spark, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The submit plan runs once over one all-null event before the query starts (its
    generated code compiled outside the first micro-batch); nothing is submitted or
    written, and a warm-up that fails is a warning, not a failed start."""
    import logging

    def pipeline(name: str, options: dict) -> StsPipeline:
        return StsPipeline(spark, PipelineConfig.from_dict({
            "source": {"path": str(tmp_path / name / "events"), "options": options},
            "sidecar": {"endpoint": "127.0.0.1:9", "results_dir": str(tmp_path / "results")},
            "output": {"out_dir": str(tmp_path / name / "out"),
                       "checkpoint_dir": str(tmp_path / name / "ck"), "writer": "deltalake"},
            "rollout": {"mode": "canary"}}))

    mine = tmp_path / "good" / "ck" / "plan-warm-up" / "mine.txt"  # not the pipeline's
    mine.parent.mkdir(parents=True)
    mine.write_text("keep")
    with caplog.at_level(logging.INFO, logger="spark_ext.pipeline.sts_pipeline"):
        good = pipeline("good", {})
        good._warm_up_plan()
        good._warm_up_plan()  # the event file of the first start is reused
        pipeline("bad", {"multiLine": "maybe"})._warm_up_plan()
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("Submit plan warmed up in") for m in messages) == 2, messages
    assert mine.read_text() == "keep", "nothing the pipeline did not write is replaced"
    assert any(m.startswith("Plan warm-up skipped: ") and "\n" not in m
               for m in messages), messages
    assert not any((tmp_path / "good" / "out").iterdir())  # no table written
    assert not any(f.is_file() for f in (tmp_path / "results").rglob("*"))  # nothing sent, no ack


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
    events = spark.createDataFrame(_events("tag", 3) + _events("tag", 1)
                                   + [dict(_events("odd", 1)[0], priority="urgent")])
    template = PromptTemplate(stable=cfg.template.stable, dynamic=cfg.template.dynamic)
    rows = build_requests(events, cfg.tagging, template).collect()
    assert rows[0]["request_id"] == rows[3]["request_id"], "replayed event got a new id"
    assert len({r["request_id"] for r in rows}) == 4
    # a priority the sidecar refuses: its row goes to the normal topic, which L4 reads
    assert rows.pop()["callback_topic"] == "llm.result.normal"
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
    # The shared sidecar as this test found it: its long requests would make the next
    # test's requests wait behind them (on a slow machine past a pool's queue delay).
    wait_until(lambda: not sum(p.in_flight + p.queued
                               for p in tiny_sidecar.client.stats().pools),
               timeout_s=180, what="the tiny sidecar idle again")


def test_pipeline_answers_from_results_submits_once_and_replays_write_nothing_twice(
        spark, tmp_path: Path, tiny_sidecar: RemoteSidecar) -> None:
    cfg = _config(tmp_path, tiny_sidecar.target, str(tiny_sidecar.results_dir))
    before = tiny_sidecar.client.stats()
    _write_events(tmp_path, "batch1", _events("llm", 6))
    pipeline = StsPipeline(spark, cfg)
    pipeline.start()
    try:
        # Local checkpoints: the faster FileSystem-based manager, for our queries only.
        managers = {q.name: q._jsq.streamingQuery().offsetLog().fileManager().getClass().getName()
                    for q in pipeline.queries}
        assert all(m.endswith("FileSystemBasedCheckpointFileManager") for m in managers.values()), \
            managers
        assert spark.conf.get("spark.sql.streaming.checkpointFileManagerClass", None) is None
        answers = _run_until(pipeline, lambda a: len(a) == 6)
    finally:
        pipeline.stop()
    after = tiny_sidecar.client.stats()
    assert after.submitted - before.submitted == 6, "a request was submitted twice"
    assert after.duplicates == before.duplicates
    assert {a["answer_source"] for a in answers.values()} == {"llm"}, [
        (a["answer_source"], a["status"], a["reason"], a["answered_ts"] - a["enqueue_ts"]) for a in answers.values()]
    assert all(a["answer"].strip() and a["status"] == "ok" for a in answers.values())
    assert all(a["deadline_met"] for a in answers.values())
    assert {a["event_id"] for a in answers.values()} == {f"llm-{i}" for i in range(6)}
    for a in answers.values():  # every hop is stamped
        assert a["enqueue_ts"] <= a["submit_ts"] <= a["received_ts"] <= a["finish_ts"] \
            <= a["answered_ts"]

    # Replay: forget the submit query's last commit so it re-runs that micro-batch.
    commits = sorted((tmp_path / "ckpt" / "submit" / "commits").glob("[0-9]*"),
                     key=lambda p: int(p.name))
    commits[-1].unlink()
    commits[-1].with_name(f".{commits[-1].name}.crc").unlink(missing_ok=True)
    pipeline = StsPipeline(spark, cfg)
    pipeline.start()
    try:
        pipeline.process_all_available()
        wait_until(lambda: tiny_sidecar.client.stats().duplicates - after.duplicates == 6,
                   what="the re-run batch reaching the sidecar")
        pipeline.process_all_available()
    finally:
        pipeline.stop()
    assert len(_answers(pipeline)) == 6
    assert pipeline.store.read("requests").num_rows == 6


def test_unreachable_sidecar_gives_fallbacks_and_keeps_running(spark, tmp_path: Path) -> None:
    cfg = _config(tmp_path, f"127.0.0.1:{free_port()}", str(tmp_path / "results"),
                  sidecar={"timeout_s": 1.0})
    _write_events(tmp_path, "down1", _events("down", 3))
    pipeline = StsPipeline(spark, cfg)
    pipeline.start()
    try:
        _run_until(pipeline, lambda a: len(a) == 3)
        _write_events(tmp_path, "down2", _events("down-later", 2))
        answers = _run_until(pipeline, lambda a: len(a) == 5)
        assert all(q.isActive for q in pipeline.queries)
    finally:
        pipeline.stop()
    assert {a["answer_source"] for a in answers.values()} == {"fallback"}
    assert {a["status"] for a in answers.values()} == {"unavailable"}
    assert all(a["answer"] == cfg.answers.fallback_text for a in answers.values())


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
        pipeline.process_all_available()  # the sidecar's rejected rows change nothing
        assert len(_answers(pipeline)) == 3
    finally:
        pipeline.stop()
    assert {(a["status"], a["reason"]) for a in answers.values()} == {
        ("rejected", "max_tokens_out_of_range")}
    for a in answers.values():
        assert a["answer"] == a["fallback_text"] == pools[a["priority"]].fallback_text
    assert len({a["answer"] for a in answers.values()}) == 3


def test_lost_result_gets_the_safety_net_fallback_then_backfill(
        spark, tmp_path: Path, tiny_sidecar: RemoteSidecar) -> None:
    """The sidecar answers, but its result files reach Spark only after deadline + grace
    (a delayed result channel): the safety net answers on time, the late file backfills."""
    delayed = tmp_path / "delayed-results"
    cfg = _config(tmp_path, tiny_sidecar.target, str(delayed),
                  tagging={"sla_ms": {"high": 3000, "normal": 3000, "low": 3000}},
                  answers={"grace_ms": 500})
    _write_events(tmp_path, "late", _events("late", 2))
    pipeline = StsPipeline(spark, cfg)
    pipeline.start()
    try:
        answers = _run_until(pipeline, lambda a: len(a) == 2, timeout_s=60)
        assert {(a["answer_source"], a["status"], a["reason"]) for a in answers.values()} == {
            ("fallback", "timeout", "no_result")}
        for a in answers.values():  # on time: within deadline + grace + one sweep
            assert a["answered_ts"] <= a["deadline_ts"] + 500 + 5000
        ids = set(answers)
        wait_for_results(tiny_sidecar.results_dir, ids)
        for f in tiny_sidecar.results_dir.glob("*.parquet"):
            if ids & set(pq.read_table(f, columns=["request_id"]).column(0).to_pylist()):
                shutil.copy(f, delayed / f.name)
        answers = _run_until(pipeline, lambda a: all(x["answer_source"] == "backfill"
                                                     for x in a.values()))
    finally:
        pipeline.stop()
    for a in answers.values():
        assert a["answer"].strip() and a["answer"] != cfg.answers.fallback_text
        assert a["fallback_text"] == cfg.answers.fallback_text
        assert a["backfilled_at"] is not None and a["status"] == "ok"


@pytest.mark.parametrize("restart", [False, True], ids=["killed", "killed-and-restarted"])
def test_killed_sidecar_every_event_answered_once_without_a_drain(
        spark, tmp_path: Path, restart: bool) -> None:
    """kill -9 of the sidecar with requests in flight: those get the safety-net fallback
    within deadline + grace + 5 s although no result ever comes; with a restart, later
    events get model answers again; no event has two answers, none has none."""
    port = free_port()
    # Every request in the engine at once: the shipped pool caps (low 1) would queue lows.
    sidecar = _sim_sidecar(tmp_path, "victim", "--max-in-flight", "16",
                           "--set", "scheduler.pools.low.max_in_flight=3",
                           port=port).__enter__()
    cfg = _config(tmp_path, sidecar.target, str(tmp_path / "results"),
                  source={"schema": "event_id STRING, text STRING, priority STRING, "
                                    "event_ts LONG, budget INT"},
                  tagging={"max_tokens": 1000, "max_tokens_column": "budget",
                           "sla_ms": {"high": 15_000, "normal": 15_000, "low": 15_000}},
                  answers={"grace_ms": 1000}, sidecar={"timeout_s": 2.0})
    pipeline = StsPipeline(spark, cfg)
    restarted = None
    try:
        pipeline.start()
        # ~20 s of decoding each: still running when the sidecar is killed
        _write_events(tmp_path, "before", [dict(e, budget=1000) for e in _events("before", 9)])
        wait_until(lambda: sidecar.client.stats().accepted >= 9, 60, what="requests accepted")
        assert sum(p.in_flight + p.queued for p in sidecar.client.stats().pools) == 9
        os.kill(sidecar.proc.pid, signal.SIGKILL)
        sidecar.proc.wait()
        sidecar.__exit__(None, None, None)
        if restart:
            restarted = _sim_sidecar(tmp_path, "reborn", port=port).__enter__()
        _write_events(tmp_path, "after", [dict(e, budget=20) for e in _events("after", 3)])
        answers = _run_until(pipeline, lambda a: len(a) == 12, timeout_s=60)
    finally:
        pipeline.stop()
        sidecar.__exit__(None, None, None)  # idempotent: a failed test leaves no process
        if restarted is not None:
            restarted.__exit__(None, None, None)
    lost = [a for a in answers.values() if a["event_id"].startswith("before")]
    assert {(a["answer_source"], a["reason"]) for a in lost} == {("fallback", "no_result")}
    for a in lost:
        assert a["answered_ts"] <= a["deadline_ts"] + 1000 + 5000, a
    later = [a for a in answers.values() if a["event_id"].startswith("after")]
    if restart:
        assert {a["answer_source"] for a in later} == {"llm"}, [
            (a["status"], a["reason"]) for a in later]
    else:
        assert {(a["answer_source"], a["status"]) for a in later} == {("fallback", "unavailable")}


def test_restart_from_checkpoints_answers_each_event_once(spark, tmp_path: Path) -> None:
    """Stop the pipeline with requests in flight and start it again from its checkpoints:
    the results that landed meanwhile are answered once, nothing is answered twice."""
    with _sim_sidecar(tmp_path, "steady") as sidecar:
        cfg = _config(tmp_path, sidecar.target, str(tmp_path / "results"),
                      tagging={"max_tokens": 100})
        pipeline = StsPipeline(spark, cfg)
        pipeline.start()
        try:
            _write_events(tmp_path, "first", _events("first", 6))
            wait_until(lambda: sidecar.client.stats().submitted >= 6, 30, what="submitted")
        finally:
            pipeline.stop()
        wait_until(lambda: sum(p.queued + p.in_flight for p in sidecar.client.stats().pools)
                   == 0, 60, what="the results of the first 6 written")
        again = StsPipeline(spark, cfg)
        again.start()
        try:
            _write_events(tmp_path, "second", _events("second", 3))
            answers = _run_until(again, lambda a: len(a) == 9)
            again.process_all_available()
        finally:
            again.stop()
    assert {a["answer_source"] for a in answers.values()} == {"llm"}
    assert len(_answers(again)) == 9


def test_bad_result_files_are_quarantined_and_answers_go_on(spark, tmp_path: Path) -> None:
    """A corrupt file and one with request_id as INT64 land in the results folder: both
    are moved to quarantine/, the queries stay up, every event is answered."""
    with _sim_sidecar(tmp_path, "clean") as sidecar:
        cfg = _config(tmp_path, sidecar.target, str(tmp_path / "results"))
        results = tmp_path / "results"
        (results / "part-0000000000001-0000000000-intruder.parquet").write_bytes(
            b"PAR1 this is not parquet")
        pq.write_table(pa.table({"request_id": [1, 2], "status": ["ok", "ok"]}),
                       results / "part-0000000000001-0000000001-intruder.parquet")
        pipeline = StsPipeline(spark, cfg)
        pipeline.start()
        try:
            _write_events(tmp_path, "good", _events("good", 6))
            answers = _run_until(pipeline, lambda a: len(a) == 6)
            assert all(q.isActive for q in pipeline.queries)
        finally:
            pipeline.stop()
    assert {a["answer_source"] for a in answers.values()} == {"llm"}
    quarantined = sorted(p.name for p in (results / "quarantine").glob("*.parquet"))
    assert len(quarantined) == 2, quarantined
    reasons = [p.read_text() for p in (results / "quarantine").glob("*.reason")]
    assert any("request_id is int64" in r for r in reasons), reasons


def test_landing_folder_stays_bounded(spark, tmp_path: Path) -> None:
    """A long run, scaled: results are kept 1 s after they are read (instead of an hour),
    so the folder holds a few seconds' worth of files however many the sidecar writes."""
    from sidecar.contract import parse_result_file_name

    results = tmp_path / "results"
    # one result per file: 60 files written in ~12 s
    with _sim_sidecar(tmp_path, "busy", "--set", "results.max_rows_per_file=1") as sidecar:
        cfg = _config(tmp_path, sidecar.target, str(results),
                      maintenance={"results_retention_s": 1.0})
        pipeline = StsPipeline(spark, cfg)
        pipeline.start()
        try:
            _write_events(tmp_path, "first", _events("first", 1))  # queries up and warm
            _run_until(pipeline, lambda a: len(a) == 1)
            sizes, written = [], set()
            for i in range(60):  # one event every 0.2 s
                _write_events(tmp_path, f"e{i}", _events(f"e{i}", 1))
                time.sleep(0.2)
                names = [p.name for p in results.glob("*.parquet")]
                written.update(k.seq for n in names if (k := parse_result_file_name(n)))
                sizes.append(len(names))
            pipeline.check()
            answers = _run_until(pipeline, lambda a: len(a) == 61)
        finally:
            pipeline.stop()
    assert len(answers) == 61
    assert pipeline.store.read("results").num_rows == 61  # the rows are kept in Delta
    assert len(written) >= 30, f"too few result files seen to tell: {len(written)}"
    assert max(sizes[20:]) <= 15, f"landing folder grew: {sizes}"


def test_a_dead_query_stops_the_pipeline_with_one_line(spark, tmp_path: Path) -> None:
    """If one query dies, the pipeline does not go on submitting with nobody answering:
    everything stops and check() names the query and the error in one line."""
    from spark_ext.exceptions import PipelineFailedError

    cfg = _config(tmp_path, f"127.0.0.1:{free_port()}", str(tmp_path / "results"),
                  sidecar={"timeout_s": 1.0})
    pipeline = StsPipeline(spark, cfg)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    pipeline.tables.append = broken  # type: ignore[method-assign]
    pipeline.start()
    try:
        _write_events(tmp_path, "doomed", _events("doomed", 2))
        wait_until(lambda: pipeline.failure, 60, what="the failure noticed")
        wait_until(lambda: not any(q.isActive for q in pipeline.queries), 30,
                   what="every query stopped")
        with pytest.raises(PipelineFailedError) as err:
            pipeline.check()
    finally:
        pipeline.stop()
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("query sts-answers failed") and "disk full" in message


def test_an_answer_that_leaks_an_email_goes_to_review_not_to_the_reader(
        spark, tmp_path: Path) -> None:
    """Output validation end to end: the model's answer carries an e-mail address, so the
    reader gets the fallback (status invalid, the rule named) and a person gets the
    model's text in the review_queue table."""
    leak = "Write to jane.doe@example.com and we will sort it out."
    with _sim_sidecar(tmp_path, "leaky", "--set", f"engine.simulated.text={json.dumps(leak)}"
                      ) as sidecar:
        cfg = _config(tmp_path, sidecar.target, str(sidecar.results_dir),
                      output={"metrics_port": 0})
        _write_events(tmp_path, "leak", _events("leak", 3))
        pipeline = StsPipeline(spark, cfg)
        pipeline.start()
        try:
            answers = _run_until(pipeline, lambda a: len(a) == 3)
            # The listener hears each query's progress on its own: the answers batch and
            # the submit batch's rows, in either order. It counts the session's queries
            # by name, so a query of the same name an earlier test left in the shared
            # session may add rows: at least this pipeline's three.
            metrics = _scrape_until(pipeline, lambda text: (
                'sts_spark_batches_total{query="sts-answers"}' in text
                and _value(text, 'sts_spark_input_rows_total{query="sts-submit"}') >= 3))
        finally:
            pipeline.stop()
    assert {(a["answer_source"], a["status"], a["reason"]) for a in answers.values()} == {
        ("fallback", "invalid", "pii:email")}
    assert all(a["answer"] == cfg.answers.fallback_text for a in answers.values())
    review = pipeline.store.read("review_queue").to_pylist()
    assert sorted(r["request_id"] for r in review) == sorted(answers)
    assert {(r["rule"], r["model_text"]) for r in review} == {("pii:email", leak)}
    assert {r["event_id"] for r in review} == {"leak-0", "leak-1", "leak-2"}
    assert pipeline.validation_failures == {"pii:email": 3}
    # The driver's /metrics: the listener's micro-batches and the pipeline's counters.
    assert 'sts_spark_validation_failures_total{rule="pii:email"} 3.0' in metrics
    assert 'sts_spark_answers_total{source="fallback",status="invalid"} 3.0' in metrics
    assert 'sts_spark_validation_failures_total{rule="pii:card"} 0.0' in metrics
    # The start-up check's scale signal: one idle simulated sidecar, one GPU, asks for one.
    assert 'sts_spark_scale{measure="gpus"} 1.0' in metrics
    assert 'sts_spark_scale{measure="desired_gpus"} 1.0' in metrics
    assert "sts_spark_requests_submitted_total 3.0" in metrics
    assert _value(metrics, 'sts_spark_input_rows_total{query="sts-submit"}') >= 3
    assert "sts_spark_backlog_requests 0.0" in metrics
    # Where the answers micro-batches' time went: the ledger in each, the answers' append.
    steps = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'sts_spark_answers_batch_step_seconds_count\{step="(\w+)"\} (\S+)', metrics)}
    assert steps["ledger"] == steps["total"] >= 1 and steps["answers"] >= 1
    assert 'sts_spark_answers_batch_step_seconds_sum{step="answers"}' in metrics
    promtool = require_tool("promtool", "Debian's prometheus package")
    lint = subprocess.run([promtool, "check", "metrics"], input=metrics, text=True,
                          capture_output=True, timeout=30)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def _value(text: str, sample: str) -> float:
    """A sample's value in a Prometheus text page (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


def _scrape_until(pipeline: StsPipeline, done: Callable[[str], bool],
                  timeout_s: float = 120.0) -> str:
    """The driver's /metrics once ``done`` holds for it. Spark's listener bus hears each
    query's progress on its own thread, after the batch, and on a busy machine late; a
    miss names the listener's lines it had."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = _scrape(pipeline)
        if done(text):
            return text
        if time.monotonic() > deadline:
            heard = [m for m in text.splitlines()
                     if m.startswith(("sts_spark_batches_total", "sts_spark_input_rows_total"))]
            raise AssertionError(f"/metrics not as awaited after {timeout_s}s; it has {heard}")
        time.sleep(0.2)


def _scrape(pipeline: StsPipeline) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{pipeline.metrics_port}/metrics",
                                timeout=10) as r:
        return r.read().decode()
