"""L4 downstream in Spark's Real-Time Mode: the model's answers on ``answers.topic`` as
their results arrive (``output.triggers.publish: realtime``).

On micro-batches an answer reaches the answers topic after the answers query wrote it to
Delta and the ``sts-publish`` query read the table's change feed: seconds after the model
finished. Here a fourth query, ``sts-publish-realtime``, reads the result topics in
Real-Time Mode (Spark's Kafka source, whose long-running tasks hand each record on as it
arrives) and turns each of this pipeline's ``ok`` results (not a late one) into the
answer record the micro-batch publisher would have written, with built-in expressions
only (RTM runs no Python): the same key (the event's key column), the same JSON fields.

What stays on micro-batches, published by ``sts-publish`` from the change feed as before:
every answer that is not the model's on-time result (fallbacks of refusals, timeouts and
the safety net, rule and fast-path answers) and every backfill. ``sts-publish`` skips the
model answers whose result finished at or after this query's run began
(:func:`published_in_realtime`), so each is published by one of the two. A model answer
that lands after its fallback (a result delayed past ``deadline + grace``) has three
records: the model's (here), the fallback and the backfill (``sts-publish``); a
compacted topic keeps the latest, the model's.

**At least once**: Spark's Kafka sink is not transactional, and a real-time batch that
runs again (after a stop or a crash) writes its records again; a replay repeats a record
with the same key and answer. Consumers that act once per event keep the first record per
key (or read the compacted topic). Validation (Python) must be off, one key column.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_ext.l4.answers import ANSWER_SCHEMA, KB_IDS
from spark_ext.l4.arrivals import PIPELINE_ATTRIBUTE

#: The session time zone of the query: ``enqueue_hour`` is a UTC hour, as in the tables.
UTC_CONF = {"spark.sql.session.timeZone": "UTC"}


def result_records(spark: SparkSession, options: dict[str, str], topics: list[str], *,
                   since_ms: int) -> DataFrame:
    """The result topics read by Spark's Kafka source (the only source RTM runs), from
    ``since_ms`` on for a new checkpoint (an existing one resumes from its offsets)."""
    return (spark.readStream.format("kafka").options(**options)
            .option("subscribe", ",".join(topics))
            .option("startingTimestamp", str(since_ms))
            # a partition with nothing that new starts at its end, not with an error
            .option("startingOffsetsByTimestampStrategy", "latest").load())


def model_answers(records: DataFrame, *, pipeline_id: str, key_column: str,
                  since_ms: int) -> DataFrame:
    """``key`` and ``value`` of the answer record of each of ``pipeline_id``'s on-time
    model results among Kafka ``records`` (``topic``, ``value``, ``timestamp``) that
    finished at or after ``since_ms``: the fields of an ``answers`` row, in its column
    order, nulls included; ``answered_ts`` is when the result reached its topic.

    Usage::

        answers = model_answers(result_records(spark, opts, topics, since_ms=t0),
                                pipeline_id="p1", key_column="event_id", since_ms=t0)
    """
    from sidecar.contract import RESULT_SCHEMA
    from spark_ext.schemas import spark_schema

    r = F.from_json(F.col("value").cast("string"), spark_schema(RESULT_SCHEMA))
    rows = records.select(r.alias("r"), F.unix_millis(F.col("timestamp")).alias("_at"))
    mine = rows.where((F.col("r.status") == "ok") & ~F.coalesce(F.col("r.late"), F.lit(False))
                      & (F.col("r.attributes")[PIPELINE_ATTRIBUTE] == F.lit(pipeline_id))
                      & (F.col("r.finish_ts") >= F.lit(since_ms)))
    answered, enqueue = F.col("_at"), F.col("r.enqueue_ts")
    fields: dict[str, Column] = {
        "request_id": F.col("r.request_id"), "trace_id": F.col("r.trace_id"),
        "priority": F.col("r.priority"), "answer": F.col("r.text"),
        "answer_source": F.lit("llm"), "status": F.lit("ok"),
        "reason": F.lit(None).cast("string"), "fallback_text": F.lit(None).cast("string"),
        "enqueue_ts": enqueue, "submit_ts": F.col("r.submit_ts"),
        "received_ts": F.col("r.received_ts"), "finish_ts": F.col("r.finish_ts"),
        "deadline_ts": F.col("r.deadline_ts"), "answered_ts": answered,
        "latency_ms": answered - enqueue, "deadline_met": answered <= F.col("r.deadline_ts"),
        "backfilled_at": F.lit(None).cast("long"),
        "kb_ids": F.col("r.attributes")[KB_IDS],
        "enqueue_hour": F.date_format(F.timestamp_millis(enqueue), "yyyy-MM-dd'T'HH"),
    }
    assert list(fields) == ANSWER_SCHEMA.names  # the micro-batch publisher's fields
    key = F.col("r.attributes")[key_column]
    if key_column not in fields:
        fields[key_column] = key
    value = F.to_json(F.struct(*[c.alias(n) for n, c in fields.items()]),
                      {"ignoreNullFields": "false"})
    return mine.select(F.coalesce(key, F.lit("")).alias("key"), value.alias("value"))


def published_in_realtime(since_ms: int) -> Column:
    """Change-feed rows of ``sts-publish`` that ``sts-publish-realtime`` publishes: new
    model answers whose result finished at or after ``since_ms`` (its run's start)."""
    return F.coalesce((F.col("_change_type") == "insert") & (F.col("answer_source") == "llm")
                      & (F.col("finish_ts") >= F.lit(since_ms)), F.lit(False))
