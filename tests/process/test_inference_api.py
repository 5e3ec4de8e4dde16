"""The DataFrame API inside a user's own query (:class:`spark_ext.LlmInference`), on real
Spark, real simulated-engine sidecars over gRPC and real Delta tables: a source and sinks
the pipeline never uses (a shaped ``rate`` source, a Delta table by catalog name, the
user's own ``foreachBatch``), one answer per event, fallbacks when the sidecar dies, and
namespaces that keep two queries over the same keys apart."""

from __future__ import annotations

import doctest
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from spark_ext import LlmInference
from tests.unit.test_doctests import NEEDS_SPARK
from tests.utils import RemoteSidecar, wait_until

pytestmark = pytest.mark.timeout(300)

TEMPLATE = "You answer questions in one short sentence.\nQuestion: {text}\nAnswer:"


def _sidecar(tmp: Path, name: str, *, step_ms: int = 10, port: int | None = None
             ) -> RemoteSidecar:
    args = ["--engine", "simulated", "--sidecar-id", name,
            "--set", f"engine.simulated.step_base_ms={step_ms}",
            "--set", "scheduler.deadline_admission=false",
            "--set", "results.flush_interval_s=0.05"]
    sidecar = RemoteSidecar(tmp / "results", args, log_path=tmp / f"{name}.log")
    if port is not None:
        sidecar.port, sidecar.target = port, f"127.0.0.1:{port}"
    return sidecar


def _events(spark, rows: list[tuple[str, str, str]]):
    return spark.createDataFrame(rows, "id string, text string, p string")


def _landed(spark, folder: Path, prefix: str, n: int, priority: str):
    """``n`` events (ids ``<prefix>-<i>``) in a landing folder, read as a stream."""
    folder.mkdir()
    (folder / "e.json").write_text("".join(
        f'{{"id": "{prefix}-{i}", "text": "question {i}", "p": "{priority}"}}\n'
        for i in range(n)))
    return spark.readStream.schema("id string, text string, p string").json(str(folder))


def _inference(spark, tmp: Path, target: str, **kwargs) -> LlmInference:
    """A user's ``LlmInference`` on key ``id`` with its checkpoints and results in ``tmp``."""
    return LlmInference(spark, key="id", checkpoint_location=str(tmp / "chk"), sidecar=target,
                        results_dir=str(tmp / "results"), **{"fallback_text": "Later.",
                                                             "grace_ms": 1000, **kwargs})


def _collect(rows: list, into: list):
    """A user's own ``foreachBatch`` sink: the answer rows, kept in a list."""
    def sink(batch, batch_id: int) -> None:
        into.extend(r.asDict() for r in batch.collect())
    return sink


def _run(queries, done, timeout_s: float = 90.0) -> None:
    def check() -> bool:
        for q in queries:
            q.processAllAvailable()
            assert q.exception() is None, q.exception()
        return done()
    wait_until(check, timeout_s, interval_s=0.3, what="the answers")


def _kill_with_four_in_flight(landing: Path, sidecar: RemoteSidecar, timeout_s: float) -> None:
    """Four ``normal`` events a-0..a-3 into ``landing``; once the sidecar accepted them,
    it is killed (SIGKILL) with them in flight."""
    (landing / "a.json").write_text("".join(
        f'{{"id": "a-{i}", "text": "question {i}", "p": "normal"}}\n' for i in range(4)))
    wait_until(lambda: sidecar.client.stats().accepted >= 4, timeout_s,
               what="requests accepted")
    os.kill(sidecar.proc.pid, signal.SIGKILL)
    sidecar.proc.wait()
    sidecar.__exit__(None, None, None)


def test_a_users_job_gets_one_answer_per_event_into_a_delta_table_by_name(
        spark, tmp_path: Path) -> None:
    """A ``rate`` stream shaped into id + text by the job, answers into a catalog
    table, every event answered once by the model (``high`` ones by their SLA)."""
    with _sidecar(tmp_path, "api") as sidecar:
        llm = LlmInference(spark, key="id", checkpoint_location=str(tmp_path / "chk"),
                           sidecar=sidecar.target, results_dir=str(tmp_path / "results"),
                           fallback_text="Please try again later.", grace_ms=1000)
        events = (spark.readStream.format("rate").option("rowsPerSecond", 5).load()
                  .where(F.col("value") < 12)
                  .select(F.concat(F.lit("q-"), F.col("value").cast("string")).alias("id"),
                          F.concat(F.lit("What is "), F.col("value").cast("string"),
                                   F.lit(" plus one?")).alias("text"),
                          F.when(F.col("value") % 2 == 0, "high").otherwise("low")
                          .alias("p")))
        requests = llm.requests(events, template=TEMPLATE, priority="p", max_tokens=8,
                                sla_ms={"high": 20_000, "low": 40_000})
        table = f"sts_api_answers_{uuid.uuid4().hex[:8]}"
        queries = llm.start(requests, answers_table=table)
        try:
            _run(queries, lambda: spark.table(table).count() >= 12
                 if spark.catalog.tableExists(table) else False)
            rows = [r.asDict() for r in spark.table(table).collect()]
        finally:
            queries.stop()
            spark.sql(f"DROP TABLE IF EXISTS {table}")
    ids = sorted(r["id"] for r in rows)
    assert ids == sorted(f"q-{i}" for i in range(12)), ids
    assert {r["answer_source"] for r in rows} == {"llm"}, rows
    assert len({r["request_id"] for r in rows}) == 12
    assert all(r["deadline_met"] for r in rows if r["priority"] == "high"), rows


def test_a_killed_sidecar_is_answered_by_the_fallback_and_nothing_twice(
        spark, tmp_path: Path) -> None:
    """The sidecar dies with requests in flight and comes back: every event has exactly
    one answer row in the user's own ``foreachBatch`` sink; those in flight get their
    own fallback text within deadline + grace + 5 s; later ones the model's."""
    got: list[dict] = []
    first = _sidecar(tmp_path, "dies", step_ms=20)  # 1,000 tokens take ~20 s
    sidecar = first.__enter__()
    port = sidecar.port
    llm = LlmInference(spark, key="id", checkpoint_location=str(tmp_path / "chk"),
                       sidecar=sidecar.target, results_dir=str(tmp_path / "results"),
                       fallback_text="default fallback", grace_ms=500)
    landing = tmp_path / "events"
    landing.mkdir()
    events = spark.readStream.schema("id string, text string, p string").json(str(landing))
    # the first four run ~20 s, so they are in flight when the sidecar dies
    budget = F.when(F.col("id").startswith("a-"), 1000).otherwise(8)
    requests = llm.requests(events, template=TEMPLATE, priority="p", max_tokens=budget,
                            sla_ms=10_000, fallback_text=F.concat(F.lit("sorry "), F.col("id")))
    queries = llm.start(requests, answers_writer=lambda a: a.writeStream.foreachBatch(
        _collect([], got)))
    try:
        _kill_with_four_in_flight(landing, first, timeout_s=60)
        killed_at = time.time() * 1000
        _run(queries, lambda: len({r["id"] for r in got}) >= 4, timeout_s=60)
        fallbacks = [r for r in got if r["id"].startswith("a-")]
        assert {(r["answer_source"], r["reason"]) for r in fallbacks} == {
            ("fallback", "no_result")}, fallbacks
        assert all(r["answer"] == f"sorry {r['id']}" for r in fallbacks), fallbacks
        assert all(r["answered_ts"] <= r["deadline_ts"] + 500 + 5000 for r in fallbacks)
        assert all(r["answered_ts"] >= killed_at - 1000 for r in fallbacks)
        with _sidecar(tmp_path, "back", port=port):
            (landing / "b.json").write_text("".join(
                f'{{"id": "b-{i}", "text": "question {i}", "p": "high"}}\n' for i in range(3)))
            _run(queries, lambda: len({r["id"] for r in got if r["id"].startswith("b-")}) >= 3,
                 timeout_s=90)
    finally:
        queries.stop()
        first.__exit__(None, None, None)  # idempotent: a failed test leaves no process
    by_id: dict[str, list] = {}
    for r in got:
        if r["write"] == "append":
            by_id.setdefault(r["id"], []).append(r)
    assert sorted(by_id) == sorted([*(f"a-{i}" for i in range(4)), *(f"b-{i}" for i in range(3))])
    assert all(len(v) == 1 for v in by_id.values()), by_id
    assert {by_id[f"b-{i}"][0]["answer_source"] for i in range(3)} == {"llm"}


def test_two_queries_over_the_same_keys_each_get_their_own_model_answers(
        spark, tmp_path: Path) -> None:
    """Two jobs (and the first again on a new checkpoint) submit the same keys to one
    sidecar with one results folder: each gets the model's answers, none a fallback
    from the sidecar's de-duplication, and none another's acks."""
    keys = [f"k-{i}" for i in range(5)]

    def run(name: str, checkpoint: Path, target: str) -> list[dict]:
        llm = LlmInference(spark, key="id", checkpoint_location=str(checkpoint),
                           sidecar=target, results_dir=str(tmp_path / "results"),
                           fallback_text=f"fallback of {name}", grace_ms=1000)
        events = _landed(spark, tmp_path / f"events-{name}", "k", len(keys), "normal")
        got: list[dict] = []
        queries = llm.start(llm.requests(events, template=TEMPLATE, priority="p",
                                         max_tokens=4, sla_ms=30_000),
                            answers_writer=lambda a: a.writeStream.foreachBatch(
                                _collect([], got)))
        try:
            _run(queries, lambda: len(got) >= 5)
        finally:
            queries.stop()
        return got

    with _sidecar(tmp_path, "shared") as sidecar:
        one = run("one", tmp_path / "chk-one", sidecar.target)
        two = run("two", tmp_path / "chk-two", sidecar.target)
        import shutil

        shutil.rmtree(tmp_path / "chk-one")  # the same job on a new checkpoint
        again = run("again", tmp_path / "chk-one", sidecar.target)
    for got in (one, two, again):
        assert sorted(r["id"] for r in got) == keys, got
        assert {r["answer_source"] for r in got} == {"llm"}, got
    ids = [{r["request_id"] for r in got} for got in (one, two, again)]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])


def test_a_static_dataframe_gets_its_requests(spark, tmp_path: Path) -> None:
    """The request columns on a batch DataFrame: ids stable for the same query, other
    in another; priority and deadline from columns or constants; the stable part first."""
    events = _events(spark, [("t1", "late order", "HIGH"), ("t2", "refund", "low")])
    llm = LlmInference(spark, key="id", checkpoint_location=str(tmp_path / "a"),
                       fallback_text="x", results_dir=str(tmp_path / "results"))
    other = LlmInference(spark, key="id", checkpoint_location=str(tmp_path / "b"),
                         fallback_text="x", results_dir=str(tmp_path / "results"))
    reqs = llm.requests(events, template=TEMPLATE, priority="p",
                        deadline_ts=F.lit(10_000).cast("long"), enqueue_ts=F.lit(1_000))
    rows = {r.id: r for r in reqs.collect()}
    assert rows["t1"].priority == "high" and rows["t2"].priority == "low"
    assert rows["t1"].deadline_ts == 10_000 and rows["t1"].enqueue_ts == 1_000
    assert rows["t1"].prompt.startswith("You answer questions") and rows["t1"].cache_key
    again = {r.id: r.request_id for r in llm.requests(events, template=TEMPLATE).collect()}
    elsewhere = {r.id: r.request_id for r in other.requests(events, template=TEMPLATE).collect()}
    assert again == {k: r.request_id for k, r in rows.items()}
    assert not set(again.values()) & set(elsewhere.values())
    constant = llm.requests(events, prompt=F.col("text"), priority="normal", sla_ms=500)
    assert {(r.priority, r.deadline_ts - r.enqueue_ts) for r in constant.collect()} == {
        ("normal", 500)}


@pytest.mark.parametrize("module", sorted(NEEDS_SPARK))
def test_the_examples_that_need_spark_run(spark, tmp_path: Path, module: str) -> None:
    """Every ``>>>`` example of the modules whose examples need a session (the API's
    among them) runs, on a real session."""
    import importlib

    llm = LlmInference(spark, key="id", checkpoint_location=str(tmp_path / "ex"),
                       fallback_text="Later.", results_dir=str(tmp_path / "results"))
    reqs = llm.requests(_events(spark, [("t1", "hi", "high")]), template=TEMPLATE)
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS,
                             extraglobs={"spark": spark, "tmp": tmp_path, "llm": llm,
                                         "reqs": reqs})
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"


def test_every_public_name_has_an_example() -> None:
    """``spark_ext.__all__`` is the public surface; each name's docstring shows it in a
    ``>>>`` example (run by this file or by tests/unit/test_doctests.py)."""
    import inspect

    import spark_ext

    missing = [n for n in spark_ext.__all__
               if ">>>" not in (inspect.getdoc(getattr(spark_ext, n)) or "")]
    assert not missing, f"public names without an example: {missing}"


@pytest.mark.slow
def test_ten_stops_in_a_row_print_no_stack_overflow(tmp_path: Path) -> None:
    """Stopping a job while its answers are being written: Spark parses the cancelled
    write's error with a regex that overflowed Java's stack on a full Java stack trace
    (``java.lang.StackOverflowError`` from the answers query's thread, 4 stops in 6);
    the writers now hand Spark two lines."""
    import subprocess
    import sys

    from tests.utils import REPO

    with _sidecar(tmp_path, "stops") as sidecar:
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(REPO)}
        env.pop("SPARK_REMOTE", None)
        done = subprocess.run(
            [sys.executable, str(REPO / "tests" / "process" / "stop_loop_job.py"),
             sidecar.target, str(tmp_path / "results"), str(tmp_path / "work"), "10"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    stops = [line for line in done.stdout.splitlines() if line.startswith("stop ")]
    assert [s.split(":")[0] for s in stops] == [f"stop {i}" for i in range(10)], out[-3000:]
    assert "StackOverflowError" not in out, out[out.find("StackOverflowError") - 500:][:3000]


@pytest.mark.slow
def test_the_same_job_on_spark_connect_with_its_sidecar_killed(spark_connect,
                                                               tmp_path: Path) -> None:
    """The user's job on a Spark Connect session (Databricks serverless), answers into a
    Delta table by catalog name written by the ``foreachBatch`` in the server's Python
    process: the sidecar dies with requests in flight and comes back on its address; those
    in flight get their own fallback within deadline + grace + 5 s, later ones the model's,
    every event one row."""
    spark = spark_connect
    first = _sidecar(tmp_path, "connect", step_ms=20)  # 1,000 tokens take ~20 s
    sidecar = first.__enter__()
    port = sidecar.port
    llm = _inference(spark, tmp_path, sidecar.target, grace_ms=500)
    landing = tmp_path / "events"
    landing.mkdir()
    events = spark.readStream.schema("id string, text string, p string").json(str(landing))
    budget = F.when(F.col("id").startswith("a-"), 1000).otherwise(8)
    table = f"sts_api_connect_{uuid.uuid4().hex[:8]}"
    queries = llm.start(llm.requests(events, template=TEMPLATE, priority="p", max_tokens=budget,
                                     sla_ms=10_000,
                                     fallback_text=F.concat(F.lit("sorry "), F.col("id"))),
                        answers_table=table)

    def rows(prefix: str, n: int) -> list[dict]:
        def landed() -> bool:
            for q in queries:
                assert q.exception() is None, q.exception()
            return spark.catalog.tableExists(table) and spark.table(table).where(
                F.col("id").startswith(prefix)).count() >= n
        wait_until(landed, 240, interval_s=0.5, what=f"the {prefix} answers on Spark Connect")
        return [r.asDict() for r in spark.table(table).collect()]

    try:
        _kill_with_four_in_flight(landing, first, timeout_s=120)
        fallbacks = [r for r in rows("a-", 4) if r["id"].startswith("a-")]
        with _sidecar(tmp_path, "connect-back", port=port):
            (landing / "b.json").write_text("".join(
                f'{{"id": "b-{i}", "text": "question {i}", "p": "high"}}\n' for i in range(3)))
            answers = rows("b-", 3)
    finally:
        queries.stop()
        first.__exit__(None, None, None)  # idempotent: a failed test leaves no process
        spark.sql(f"DROP TABLE IF EXISTS {table}")
    assert {(r["answer_source"], r["reason"]) for r in fallbacks} == {
        ("fallback", "no_result")}, fallbacks
    assert all(r["answer"] == f"sorry {r['id']}" for r in fallbacks), fallbacks
    late = [r["answered_ts"] - r["deadline_ts"] - 500 for r in fallbacks]
    assert max(late) <= 5000, late
    assert sorted(r["id"] for r in answers) == [*(f"a-{i}" for i in range(4)),
                                               *(f"b-{i}" for i in range(3))], answers
    assert {r["answer_source"] for r in answers if r["id"].startswith("b-")} == {"llm"}, answers


def test_the_answers_go_to_a_kafka_topic(spark, kafka_broker, tmp_path: Path) -> None:
    """The answers through the user's own Kafka sink (``answers_writer``): one record per
    event, keyed by the event's key, the answer row as JSON."""
    import json

    from confluent_kafka import Consumer

    topic = f"answers-{uuid.uuid4().hex[:8]}"
    bootstrap = kafka_broker.bootstrap_servers
    with _sidecar(tmp_path, "to-kafka") as sidecar:
        llm = _inference(spark, tmp_path, sidecar.target)
        events = _landed(spark, tmp_path / "events", "k", 5, "normal")
        queries = llm.start(
            llm.requests(events, template=TEMPLATE, priority="p", max_tokens=4, sla_ms=30_000),
            answers_writer=lambda a: a.select(
                F.col("id").alias("key"), F.to_json(F.struct("*")).alias("value"))
            .writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("topic", topic))
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic,
                             "auto.offset.reset": "earliest"})
        consumer.subscribe([topic])
        got: dict[str, list[dict]] = {}
        try:
            def five() -> bool:
                for q in queries:
                    assert q.exception() is None, q.exception()
                while (msg := consumer.poll(0.5)) is not None:
                    if msg.error() is None:
                        got.setdefault(msg.key().decode(), []).append(json.loads(msg.value()))
                return len(got) >= 5
            wait_until(five, 120, interval_s=0.2, what="five answers on the topic")
        finally:
            queries.stop()
            consumer.close()
    assert sorted(got) == [f"k-{i}" for i in range(5)], got
    assert all(len(v) == 1 and v[0]["answer_source"] == "llm" and v[0]["write"] == "append"
               for v in got.values()), got


def test_a_batch_job_gets_one_answer_per_row(spark, tmp_path: Path) -> None:
    """``answer_batch`` on a static DataFrame: every row submitted, and answered once,
    the model's answers and a refused row's fallback, as a static DataFrame."""
    rows = [(f"b-{i}", f"question {i}", "normal") for i in range(4)] + [("b-x", "?", "urgent")]
    with _sidecar(tmp_path, "batch") as sidecar:
        llm = _inference(spark, tmp_path, sidecar.target, fallback_text="Not now.")
        answers = llm.answer_batch(llm.requests(_events(spark, rows), template=TEMPLATE,
                                                priority="p", max_tokens=4, sla_ms=30_000))
    assert not answers.isStreaming
    got = {r.id: r for r in answers.collect()}
    assert sorted(got) == sorted(k for k, _, _ in rows)
    assert {got[f"b-{i}"].answer_source for i in range(4)} == {"llm"}
    # an unknown priority is refused by the sidecar and answered, never dropped
    assert (got["b-x"].answer_source, got["b-x"].status) == ("fallback", "rejected")


def test_two_events_under_one_key_are_counted_and_said_never_a_silent_fallback(
        spark, tmp_path: Path) -> None:
    """Two different events with equal key columns share a request id: the second's ack
    says so (``detail``), the sidecar counts it (``id_conflicts``); a replay of the same
    rows is a plain duplicate for the events that were first (their prompts repeat)."""
    from sidecar.client import SidecarClient
    from spark_ext.submit.submission import ID_CONFLICT_DETAIL

    rows = [("d-1", "question one", "normal"), ("d-1", "question two", "normal"),
            ("d-2", "question three", "normal")]
    with _sidecar(tmp_path, "conflicts") as sidecar:
        llm = _inference(spark, tmp_path, sidecar.target)
        requests = llm.requests(_events(spark, rows), template=TEMPLATE, priority="p",
                                max_tokens=4, sla_ms=30_000).coalesce(1)
        first = llm.submit(requests).collect()
        replay = llm.submit(requests).collect()
        with SidecarClient(sidecar.target) as client:
            stats = client.stats()
    assert [r.detail for r in first].count(ID_CONFLICT_DETAIL) == 1, first
    assert len({r.request_id for r in first}) == 2 and all(r.accepted for r in first)
    assert all(r.duplicate for r in replay), replay
    assert [r.detail for r in replay] == [r.detail for r in first], replay
    assert (stats.id_conflicts, stats.duplicates) == (2, 4)


def test_a_sidecar_on_another_result_channel_is_refused_at_start_in_one_line(
        spark, tmp_path: Path) -> None:
    """The pipeline reads results from Kafka, its sidecar writes them to files: nothing
    but the safety net would ever answer. The start-up check compares the two and
    refuses in one line naming both values and what to change; no query starts."""
    from spark_ext import PipelineConfigError

    with _sidecar(tmp_path, "files-side") as sidecar:
        llm = _inference(spark, tmp_path, sidecar.target, result_channel="kafka",
                         kafka_bootstrap_servers="127.0.0.1:9")
        requests = llm.requests(_landed(spark, tmp_path / "in", "m", 1, "high"),
                                template=TEMPLATE, priority="p", max_tokens=4)
        with pytest.raises(PipelineConfigError) as refused:
            llm.start(requests, answers_table=f"sts_mismatch_{uuid.uuid4().hex[:8]}")
    message = str(refused.value)
    assert "\n" not in message and "'files' channel (its results.kind)" in message, message
    assert "reads 'kafka' (sidecar.result_channel)" in message, message
    assert not [q for q in spark.streams.active if "sts-" in (q.name or "")]
