"""The micro-batch time column (:mod:`spark_ext.batch_time`) on a real streaming query:
the batch's own time, and code compiled once rather than once per micro-batch."""

from __future__ import annotations

import json

from pyspark.sql import functions as F

from spark_ext.batch_time import batch_time_ms, reflect_allowed

BATCHES = 6


def _compiles(spark) -> int:
    """Classes janino compiled in this JVM so far (Spark's codegen metrics)."""
    metrics = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics
    return int(metrics.METRIC_COMPILATION_TIME().getCount())


def _run(spark, tmp_path, columns: dict, name: str) -> list[dict]:
    """A files stream of :data:`BATCHES` one-file micro-batches with ``columns`` added;
    per batch: the compiles its query made and each column's least and greatest value."""
    source = tmp_path / f"{name}-in"
    source.mkdir()
    for i in range(BATCHES):
        (source / f"{i}.json").write_text(
            "\n".join(json.dumps({"n": i * 10 + k}) for k in range(10)))
    seen: list[dict] = []

    def batch(df, batch_id: int) -> None:
        before = _compiles(spark)
        row = df.where(F.col("n") >= 0).agg(
            *[F.min(c).alias(f"{c}_lo") for c in columns],
            *[F.max(c).alias(f"{c}_hi") for c in columns], F.count("*").alias("rows")).collect()[0]
        seen.append({"compiles": _compiles(spark) - before, **row.asDict()})

    query = (spark.readStream.schema("n INT").option("maxFilesPerTrigger", 1)
             .json(str(source)).withColumns(columns)
             .writeStream.foreachBatch(batch)
             .option("checkpointLocation", str(tmp_path / f"{name}-cp"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert not query.isActive, f"{name}: the stream did not end"
    assert len(seen) == BATCHES
    return seen


def test_the_batch_time_is_the_batch_s_and_compiled_once(spark, tmp_path):
    assert reflect_allowed(spark)
    spark_s = F.unix_millis(F.current_timestamp())
    plain = _run(spark, tmp_path, {"spark": spark_s}, "plain")
    ours = _run(spark, tmp_path, {"now": batch_time_ms(spark)}, "ours")
    # Spark's own column: new code every micro-batch (what the module avoids) ...
    assert all(b["compiles"] >= 1 for b in plain[2:]), plain
    # ... ours: the first batches compile, then none.
    assert all(b["compiles"] == 0 for b in ours[2:]), ours
    both = _run(spark, tmp_path, {"now": batch_time_ms(spark), "spark": spark_s}, "both")
    for b in both:  # one time per batch: Spark's batch time
        assert b["rows"] == 10 and b["now_lo"] == b["now_hi"] == b["spark_lo"], b
    times = [b["now_hi"] for b in both]
    assert times == sorted(times) and len(set(times)) == BATCHES


class _Refusing:
    """A session whose queries fail, as one that refuses ``reflect`` would."""

    def range(self, *args, **kwargs):
        raise RuntimeError("reflect is not allowed here")


def test_a_session_that_refuses_reflect_gets_spark_s_own_column(spark):
    session = _Refusing()
    assert reflect_allowed(session) is False
    assert "reflect" not in str(batch_time_ms(session))
    assert "reflect" in str(batch_time_ms(spark))


def test_tagging_stamps_events_without_an_event_time_with_the_batch_time(spark):
    from spark_ext.config import TaggingConfig
    from spark_ext.l1.tagging import tag_requests

    events = spark.createDataFrame([("t1", "high", "hi")], "ticket_id string, priority string, "
                                   "prompt string")
    row = (tag_requests(events, TaggingConfig(key_columns=["ticket_id"], event_time_ms=None))
           .select("enqueue_ts", F.unix_millis(F.current_timestamp()).alias("now")).collect()[0])
    assert row["enqueue_ts"] is not None and abs(row["enqueue_ts"] - row["now"]) < 60_000
