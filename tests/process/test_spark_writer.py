"""The writers of the tables on real Spark and real Delta: Delta on Spark (``output.writer:
spark``) with catalog tables, each writer's tables read and continued by the other, the
table-driven safety net, and a checkpoint reset that loses no write."""

from __future__ import annotations

import json
import shutil
import signal
import uuid
from pathlib import Path

import pytest
from deltalake import DeltaTable

from sidecar import write_text_atomically
from sidecar.contract import PRIORITY_NAMES
from spark_ext import PipelineConfig, StsPipeline
from tests.utils import RemoteSidecar, wait_until

pytestmark = pytest.mark.timeout(420)


def _sidecar(tmp: Path, name: str, *extra: str) -> RemoteSidecar:
    return RemoteSidecar(tmp / "results", [
        "--engine", "simulated", "--sidecar-id", name,
        "--set", "engine.simulated.step_base_ms=5", "--set", "results.flush_interval_s=0.05",
        *extra], log_path=tmp / f"{name}.log")


def _config(tmp: Path, endpoint: str, *, writer: str, ckpt: str = "ckpt",
            tables: dict[str, str] | None = None, **sections) -> PipelineConfig:
    data = {
        "source": {"path": str(tmp / "events")},
        "tagging": {"event_time_ms": None, "max_tokens": 8,
                    "sla_ms": {"high": 30_000, "normal": 40_000, "low": 50_000}},
        "sidecar": {"endpoint": endpoint, "results_dir": str(tmp / "results"), "timeout_s": 3.0},
        "answers": {"grace_ms": 1000},
        "output": {"out_dir": str(tmp / "tables"), "checkpoint_dir": str(tmp / ckpt),
                   "writer": writer, "tables": tables or {}, "records_interval_s": 0},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return PipelineConfig.from_dict(data)


def _write_events(tmp: Path, prefix: str, n: int, folder: str = "events") -> set[str]:
    events = [{"event_id": f"{prefix}-{i}", "text": f"Where is my order {i}?",
               "priority": PRIORITY_NAMES[i % 3], "event_ts": 0} for i in range(n)]
    write_text_atomically(tmp / folder / f"{prefix}.json",
                          "".join(json.dumps(e) + "\n" for e in events))
    return {e["event_id"] for e in events}


def _answers(pipeline: StsPipeline) -> dict[str, dict]:
    rows = pipeline.store.read("answers").to_pylist()
    by_event = {r["event_id"]: r for r in rows}
    assert len(by_event) == len(rows), "an event has two answer rows"
    return by_event


def _until(pipeline: StsPipeline, events: set[str], timeout_s: float = 240) -> dict[str, dict]:
    def done():
        pipeline.check()
        answers = _answers(pipeline)
        return answers if events <= set(answers) else None

    return wait_until(done, timeout_s=timeout_s, interval_s=0.5,
                      what=f"answers for {len(events)} events")


def test_delta_on_spark_answers_once_into_catalog_tables(spark, tmp_path: Path) -> None:
    """With ``writer: spark`` the tables are Spark's Delta tables, here catalog tables by
    name that an analyst queries with Spark SQL: one answer row per event, requests and
    results appended, the documented partitioning and properties."""
    suffix = uuid.uuid4().hex[:8]
    names = {t: f"spark_catalog.default.sts_{t}_{suffix}" for t in ("answers", "requests", "results")}
    with _sidecar(tmp_path, "writer-spark") as sidecar:
        pipeline = StsPipeline(spark, _config(tmp_path, sidecar.target, writer="spark",
                                              tables=names))
        assert pipeline.writer == "spark"
        pipeline.start()
        try:
            events = _write_events(tmp_path, "cat", 6)
            answers = _until(pipeline, events)
            pipeline.process_all_available()
        finally:
            pipeline.stop()
    assert {a["answer_source"] for a in answers.values()} == {"llm"}
    by_source = {r["answer_source"]: r["n"] for r in spark.sql(
        f"SELECT answer_source, count(*) AS n FROM {names['answers']} GROUP BY answer_source"
    ).collect()}
    assert by_source == {"llm": 6}
    assert spark.table(names["requests"]).count() == 6
    assert spark.table(names["results"]).count() == 6
    detail = spark.sql(f"DESCRIBE DETAIL {names['answers']}").collect()[0]
    assert detail["partitionColumns"] == ["enqueue_hour"]
    props = {r["key"]: r["value"] for r in spark.sql(
        f"SHOW TBLPROPERTIES {names['answers']}").collect()}
    assert props["delta.enableDeletionVectors"] == "false"  # deltalake reads it too
    assert props["delta.enableChangeDataFeed"] == "true"
    assert props["delta.autoOptimize.autoCompact"] == "true"  # it compacts as it writes
    assert props["delta.checkpointInterval"] == "100"  # not inside every tenth append
    assert {r["key"]: r["value"] for r in spark.sql(  # a table its first append made
        f"SHOW TBLPROPERTIES {names['requests']}").collect()}["delta.checkpointInterval"] == "100"


def test_each_writer_continues_and_reads_the_others_tables(spark, tmp_path: Path) -> None:
    """delta-rs writes the tables, then Delta on Spark continues them (same paths, new
    checkpoints, new events: a new checkpoint is a new query, whose requests are its
    own), and delta-rs reads every row back: no protocol or writer feature stands in
    between (the tables hold no timestamp columns, no deletion vectors)."""
    with _sidecar(tmp_path, "writers") as sidecar:
        first = StsPipeline(spark, _config(tmp_path, sidecar.target, writer="deltalake",
                                           ckpt="ckpt-rs"))
        first.start()
        try:
            before = _until(first, _write_events(tmp_path, "rs", 4))
        finally:
            first.stop()
        second = StsPipeline(spark, _config(tmp_path, sidecar.target, writer="spark",
                                            ckpt="ckpt-spark",
                                            source={"path": str(tmp_path / "events-2")}))
        second.start()
        try:
            after = _until(second, set(before) | _write_events(tmp_path, "sp", 4, "events-2"))
            # Delta on Spark holds the records' rows for records_interval_s (10 s)
            wait_until(lambda: len(set(second.store.read("requests", ["request_id"])
                                       .column("request_id").to_pylist())) >= 8,
                       timeout_s=90, interval_s=1.0, what="the new requests recorded")
        finally:
            second.stop()
    assert len(after) == 8 and {a["answer_source"] for a in after.values()} == {"llm"}
    answers = DeltaTable(str(tmp_path / "tables" / "answers")).to_pyarrow_table()
    assert sorted(answers.column("event_id").to_pylist()) == sorted(after)
    for name in ("answers", "requests"):  # made by delta-rs without it: turned on at start
        props = {r["key"]: r["value"] for r in spark.sql(
            f"SHOW TBLPROPERTIES delta.`{tmp_path / 'tables' / name}`").collect()}
        assert props.get("delta.autoOptimize.autoCompact") == "true", name
    log = tmp_path / "tables" / "answers" / "_delta_log"
    last = max(int(p.stem) for p in log.glob("*.json"))
    assert not (log / f"{last:020d}.crc").exists()  # the answers query writes no checksum
    requests = spark.read.format("delta").load(str(tmp_path / "tables" / "requests"))
    assert requests.select("request_id").distinct().count() == 8


def test_delta_on_spark_compacts_as_it_writes_and_vacuums_only_when_asked(
        spark, tmp_path: Path) -> None:
    """The writer's own appends compact a partition once it holds Delta's
    ``autoCompact.minNumFiles`` small files (4 here; 50 by default): a post-commit step of
    the same write, so no second writer (a scheduled OPTIMIZE) commits beside the
    streaming ones and nothing conflicts. ``maintain`` rewrites nothing and vacuums only
    when given a retention."""
    from pyspark.sql import functions as F

    from spark_ext.config import OutputConfig
    from spark_ext.l4.writers.spark import SparkWriter

    writer = SparkWriter(OutputConfig(out_dir=str(tmp_path / "tables"),
                                      checkpoint_dir=str(tmp_path / "ckpt")), ("event_id",))
    where = f"delta.`{tmp_path / 'tables' / 'requests'}`"
    spark.conf.set("spark.databricks.delta.autoCompact.minNumFiles", "4")
    try:
        for version in range(6):
            rows = spark.range(10 * version, 10 * version + 10).select(
                F.col("id").cast("string").alias("request_id"),
                F.lit("2026-12-02T16").alias("enqueue_hour")).coalesce(1)
            writer.append("requests", rows, app_id="compaction-test", version=version)
    finally:
        spark.conf.unset("spark.databricks.delta.autoCompact.minNumFiles")
    history = spark.sql(f"DESCRIBE HISTORY {where}").collect()
    compactions = [h for h in history if h["operation"] == "OPTIMIZE"]
    assert compactions and all(h["operationParameters"].get("auto") == "true"
                               for h in compactions)
    detail = spark.sql(f"DESCRIBE DETAIL {where}").collect()[0]
    assert detail["numFiles"] < 6  # six one-file appends, compacted on the way
    assert spark.read.format("delta").load(str(tmp_path / "tables" / "requests")).count() == 60
    assert writer.conflicts_retried == 0

    versions = len(history)
    writer.maintain(spark, ("requests",), ["2026-12-02T16"], vacuum_retention_hours=None)
    assert len(spark.sql(f"DESCRIBE HISTORY {where}").collect()) == versions  # nothing
    writer.maintain(spark, ("requests",), ["2026-12-02T16"], vacuum_retention_hours=168)
    operations = [h["operation"] for h in spark.sql(f"DESCRIBE HISTORY {where}").collect()]
    assert "OPTIMIZE" not in operations[:len(operations) - versions]
    assert "VACUUM END" in operations  # the vacuum ran (nothing old enough to delete)


def test_the_log_is_checkpointed_every_hundred_appends_not_every_ten(
        spark, tmp_path: Path) -> None:
    """Delta checkpoints a table's log inside the commit of every tenth version by default
    (a micro-batch several times slower than the others): the writer's tables say every
    100th, also one its first append makes; a table of the pipeline made without it gets
    it at start, and one whose owner chose an interval keeps theirs."""
    from pyspark.sql import functions as F

    from spark_ext.config import OutputConfig
    from spark_ext.l4.writers.spark import SparkWriter

    output = OutputConfig(out_dir=str(tmp_path / "tables"), checkpoint_dir=str(tmp_path / "c"))
    writer = SparkWriter(output, ("event_id",))
    log = tmp_path / "tables" / "requests" / "_delta_log"

    def interval(name: str) -> str | None:
        return {r["key"]: r["value"] for r in spark.sql(
            f"SHOW TBLPROPERTIES {writer.ref(name)}").collect()}.get("delta.checkpointInterval")

    for version in range(12):
        rows = spark.range(version, version + 1).select(
            F.col("id").cast("string").alias("request_id"),
            F.lit("2026-12-05T07").alias("enqueue_hour"))
        writer.append("requests", rows, app_id="checkpoint-test", version=version)
    assert interval("requests") == "100"
    assert not list(log.glob("*.checkpoint.parquet"))  # Delta's default: version 10's
    assert spark.read.format("delta").load(str(log.parent)).count() == 12

    made_without = tmp_path / "tables" / "results"  # e.g. by an earlier version
    spark.range(1).select(F.col("id").cast("string").alias("request_id"),
                          F.lit("2026-12-05T07").alias("enqueue_hour")) \
        .write.format("delta").partitionBy("enqueue_hour").save(str(made_without))
    spark.sql(f"ALTER TABLE {writer.ref('requests')} SET TBLPROPERTIES "
              "('delta.checkpointInterval' = '25')")  # its owner's choice
    writer.create_tables(spark)
    assert interval("results") == interval("answers") == "100"
    assert interval("requests") == "25"


def test_the_tables_keep_file_statistics_on_their_time_columns_only(
        spark, tmp_path: Path) -> None:
    """Delta keeps min, max and null counts of a file's first 32 columns by default; the
    writer's tables keep them on their time columns (what skips files here), which the
    backfill MERGE still prunes by. So does a table its first append makes; one made
    without gets them at start, unless its owner chose what Delta keeps."""
    from pyspark.sql import functions as F

    from spark_ext.config import OutputConfig
    from spark_ext.l4.writers.spark import STATS_PROPERTY, SparkWriter

    out = tmp_path / "tables"
    writer = SparkWriter(OutputConfig(out_dir=str(out), checkpoint_dir=str(tmp_path / "c")),
                         ("event_id",))

    def stats_of(name: str) -> str | None:
        return {r["key"]: r["value"] for r in spark.sql(
            f"SHOW TBLPROPERTIES {writer.ref(name)}").collect()}.get(STATS_PROPERTY)

    def rows(first: int, n: int, **columns):
        return spark.range(first, first + n).select(
            F.col("id").cast("string").alias("request_id"), F.lit("high").alias("priority"),
            (F.lit(1_796_000_000_000) + F.col("id") * 1000).alias("enqueue_ts"),
            *[F.lit(v).alias(k) for k, v in columns.items()],
            F.lit("2026-12-05T13").alias("enqueue_hour"))

    writer.create_tables(spark)
    for version in range(3):  # three micro-batches' answers, in time order: three files
        writer.append("answers", rows(3 * version, 3, answer_source="fallback"),
                      app_id="stats-test", version=version)
    writer.append("requests", rows(0, 3, submit_ts=1_796_000_000_500),
                  app_id="stats-test", version=0)
    assert stats_of("answers") == "enqueue_ts,answered_ts"
    assert stats_of("requests") == "enqueue_ts,submit_ts"  # made by its first append
    for name in ("answers", "requests"):
        adds = [json.loads(line)["add"] for log in (out / name / "_delta_log").glob("*.json")
                for line in log.read_text().splitlines() if '"add"' in line]
        assert adds and all(set(json.loads(a["stats"])["nullCount"])
                            == set(stats_of(name).split(",")) for a in adds), name
        # each file's enqueue_ts range: what the backfill MERGE skips files by
        assert all("enqueue_ts" in json.loads(a["stats"])["maxValues"] for a in adds), name

    late = (writer.table(spark, "answers").where(F.col("request_id") == "7")
            .withColumn("answer_source", F.lit("llm"))
            .withColumn("answered_ts", F.lit(1_796_000_009_000)))  # the model's, late
    assert writer.merge_answers("answers", late, backfill=True) == {"inserted": 0,
                                                                    "updated": 1}

    rows(0, 1, finish_ts=1).write.format("delta").partitionBy("enqueue_hour") \
        .save(str(out / "results"))  # made without, e.g. by an earlier version
    rows(0, 1, dead_lettered_ts=1).write.format("delta").partitionBy("enqueue_hour") \
        .option("delta.dataSkippingNumIndexedCols", "2").save(str(out / "dead_letters"))
    writer.create_tables(spark)
    assert stats_of("results") == "enqueue_ts,finish_ts"
    assert stats_of("dead_letters") is None  # its owner's choice stands


@pytest.mark.slow
def test_the_table_safety_net_answers_what_a_killed_sidecar_never_sent(
        spark, tmp_path: Path) -> None:
    """Delta on Spark keeps no list of open requests in the driver: the safety net asks
    the tables. Accepted requests whose sidecar is killed get the fallback
    (``no_result``) after their deadline plus the grace. No warm-up: at 2 s a step it
    takes a minute, and a calibrated sidecar refuses the 128 s of work at once
    (``deadline_infeasible``) instead of accepting it."""
    with _sidecar(tmp_path, "killed", "--set", "engine.simulated.step_base_ms=2000",
                  "--set", "warmup.enabled=false") as sidecar:
        pipeline = StsPipeline(spark, _config(
            tmp_path, sidecar.target, writer="spark",
            tagging={"sla_ms": {"high": 20_000, "normal": 20_000, "low": 20_000},
                     "max_tokens": 64}))
        pipeline.start()
        try:
            events = _write_events(tmp_path, "lost", 3)
            wait_until(lambda: pipeline.store.read("requests").num_rows >= 3, timeout_s=120,
                       what="the requests recorded")
            sidecar.proc.send_signal(signal.SIGKILL)
            answers = _until(pipeline, events)
            # The answers are visible once appended; the batch counts them after its
            # record tables' appends, so let it end before reading the counts.
            pipeline.process_all_available()
        finally:
            pipeline.stop()
    assert {(a["answer_source"], a["reason"]) for a in answers.values()} == {
        ("fallback", "no_result")}
    assert pipeline.counts.no_result_fallbacks == 3


@pytest.mark.parametrize(("writer", "topic", "legacy"), [
    ("deltalake", False, True), ("deltalake", True, False), ("spark", False, False),
    ("spark", True, False)],
    ids=["deltalake-no-topic-eight-buckets", "deltalake-answers-topic", "spark-no-topic",
         "spark-answers-topic"])
def test_a_restarted_pipeline_answers_the_requests_whose_result_was_lost(
        spark, tmp_path: Path, request, monkeypatch, writer: str, topic: bool,
        legacy: bool) -> None:
    """Requests accepted, the pipeline stopped, the sidecar killed (their results never
    come), the pipeline started again from its checkpoints: the ledger's state in the
    answers query's checkpoint still watches them, and each gets its one fallback
    (``no_result``) after deadline + grace, also with nothing else arriving (the clock
    ticks). Before: with ``deltalake`` and no answers topic the restarted pipeline forgot
    them (never answered); with ``spark`` and an answers topic it did not start.

    The checkpoint keeps the ledger's buckets (one per task slot); ``legacy``: a
    checkpoint begun before it kept them, with the eight buckets 0-7 of that time,
    restarts with those (with today's two, the requests in the other six would never
    be answered)."""
    from spark_ext.l4 import buckets

    if legacy:
        monkeypatch.setattr(buckets, "bucket_keys", lambda partitions: buckets.LEGACY_KEYS)
    sections = {}
    if topic:
        from tests.process.test_kafka import _records

        broker = request.getfixturevalue("kafka_broker")
        answers_topic = f"answers-lost-{uuid.uuid4().hex[:8]}"
        sections = {"answers": {"grace_ms": 1000, "topic": answers_topic},
                    "kafka": {"bootstrap_servers": broker.bootstrap_servers}}
    with _sidecar(tmp_path, "lost", "--set", "engine.simulated.step_base_ms=2000",
                  "--set", "warmup.enabled=false") as sidecar:
        config = _config(tmp_path, sidecar.target, writer=writer,
                         tagging={"sla_ms": {"high": 8_000, "normal": 8_000, "low": 8_000},
                                  "max_tokens": 64}, **sections)
        first = StsPipeline(spark, config)
        first.start()
        try:
            events = _write_events(tmp_path, "lost", 6 if legacy else 3)
            wait_until(lambda: sidecar.client.stats().accepted >= len(events), timeout_s=60,
                       what="the requests accepted")
            # their submit batch committed (not re-run after the restart) and their acks
            # in the ledger: the restart finds them watched
            wait_until(lambda: sum(p["numInputRows"] for p in first.queries[0].recentProgress)
                       >= len(events) and first.open_requests >= len(events), timeout_s=60,
                       what="the acks in the ledger")
        finally:
            first.stop()
        sidecar.proc.send_signal(signal.SIGKILL)
        sidecar.proc.wait()
    keys_file = tmp_path / "ckpt" / "answers" / buckets.KEYS_FILE
    if legacy:
        keys_file.unlink()  # as a checkpoint of an earlier version has it
        monkeypatch.undo()
    else:
        assert keys_file.read_text().strip() == "2,0"  # local[2]: one bucket per task slot
    again = StsPipeline(spark, config)
    again.start()
    try:
        assert keys_file.is_file() is not legacy  # a restart keeps what the checkpoint has
        answers = _until(again, events, timeout_s=120)
        again.process_all_available()
        answers = _answers(again)
    finally:
        again.stop()
    assert set(answers) == events
    assert {(a["answer_source"], a["reason"]) for a in answers.values()} == {
        ("fallback", "no_result")}
    if topic:
        records = _records(broker.bootstrap_servers, answers_topic, 3)
        assert sorted(m.key().decode() for m in records) == sorted(events)


@pytest.mark.parametrize("reset", ["checkpoints deleted", "offsets emptied"])
def test_a_checkpoint_reset_keeps_the_tables_and_skips_no_write(
        spark, tmp_path: Path, reset: str) -> None:
    """Batch ids start again at 0 after a checkpoint reset; the Delta transaction ids
    name the checkpoint's run, not its path, so the new batches' writes are not skipped
    as committed (before: the new events were answered only by the safety net, with
    ``no_result``)."""
    with _sidecar(tmp_path, "reset") as sidecar:
        config = _config(tmp_path, sidecar.target, writer="deltalake")
        first = StsPipeline(spark, config)
        first.start()
        try:
            _until(first, _write_events(tmp_path, "one", 3))
        finally:
            first.stop()
        run = first.run_ids["submit"]
        if reset == "checkpoints deleted":
            shutil.rmtree(tmp_path / "ckpt")  # the test's own folder
        else:
            for query in ("submit", "answers"):
                for part in ("offsets", "commits", "sources"):
                    shutil.rmtree(tmp_path / "ckpt" / query / part, ignore_errors=True)
        # a new checkpoint is a new query (its requests are its own): the first run's
        # files are moved out of the landing folder, as a reset that must not answer them
        # again does (docs/tables.md)
        shutil.move(tmp_path / "events", tmp_path / "events-read")
        second = StsPipeline(spark, config)
        second.start()
        try:
            answers = _until(second, _write_events(tmp_path, "two", 3) | {
                f"one-{i}" for i in range(3)})
            second.process_all_available()
        finally:
            second.stop()
    assert second.run_ids["submit"] != run
    assert len(answers) == 6
    assert {a["answer_source"] for a in answers.values()} == {"llm"}, answers


@pytest.mark.parametrize("where", ["out_dir", "checkpoint_dir"])
def test_an_object_store_the_session_cannot_reach_is_refused_in_one_line(
        spark, tmp_path: Path, where: str) -> None:
    """``s3://`` in a session without hadoop-aws: before, a raw ``Py4JJavaError ...
    UnsupportedFileSystemException: No FileSystem for scheme "s3"``; now one line that
    names the setting and what to add, before anything starts."""
    from spark_ext.exceptions import PipelineConfigError

    config = _config(tmp_path, "127.0.0.1:9", writer="spark",
                     sidecar={"check_at_start": False})
    setattr(config.output, where, "s3://no-such-bucket/sts")
    pipeline = StsPipeline(spark, config)
    with pytest.raises(PipelineConfigError) as err:
        pipeline.start()
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"output.{where} s3://no-such-bucket/sts")
    assert 'no file system for "s3://"' in message and "hadoop-aws" in message
    assert pipeline.queries == []


@pytest.mark.parametrize("writer_name", ["spark", "deltalake"])
def test_a_replayed_append_is_skipped_without_an_app_transaction_lookup(
        spark, tmp_path: Path, writer_name: str) -> None:
    """Appends in batch order are blind (no Delta app transaction: its lookup replays the
    whole table state); a batch the writer did not see come in order (a new writer
    object: a restarted query running its last batch again) finds its commit's marker
    in the history and writes nothing twice, also when the other writer wrote it."""
    import pyarrow as pa

    from spark_ext.config import OutputConfig
    from spark_ext.l4.answers import hour_of
    from spark_ext.l4.writers import writer_class

    output = OutputConfig(out_dir=str(tmp_path / "tables"),
                          checkpoint_dir=str(tmp_path / "ckpt"), writer=writer_name)
    other = "deltalake" if writer_name == "spark" else "spark"

    def frame(batch: int, kind: str = writer_name):
        at = 1_764_000_000_000 + batch
        rows = pa.table({"request_id": [f"b{batch}-{i}" for i in range(3)],
                         "enqueue_ts": [at] * 3, "enqueue_hour": [hour_of(at)] * 3})
        return rows if kind == "deltalake" else spark.createDataFrame(rows.to_pandas())

    def rows() -> list[str]:
        return sorted(spark.read.format("delta").load(str(tmp_path / "tables" / "requests"))
                      .select("request_id").toPandas()["request_id"])

    writer = writer_class(writer_name)(output, ("event_id",))
    for batch in range(3):
        writer.append("requests", frame(batch), app_id="run1/requests", version=batch)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{tmp_path / 'tables' / 'requests'}`") \
        .select("version", "userMetadata").collect()
    assert sorted(r["userMetadata"] for r in history) == [
        f"sts-append run1/requests {b}" for b in range(3)]
    restarted = writer_class(writer_name)(output, ("event_id",))
    restarted.append("requests", frame(2), app_id="run1/requests", version=2)  # the replay
    restarted.append("requests", frame(3), app_id="run1/requests", version=3)
    crossed = writer_class(other)(output, ("event_id",))  # the other writer continues
    crossed.append("requests", frame(3, other), app_id="run1/requests", version=3)
    assert rows() == sorted(f"b{b}-{i}" for b in range(4) for i in range(3))
    if writer_name == "spark":  # only the first append of each writer object looked up
        log = tmp_path / "tables" / "requests" / "_delta_log"
        with_txn = [f.name for f in sorted(log.glob("*.json")) if '"txn"' in f.read_text()]
        assert len(with_txn) == 1, with_txn
