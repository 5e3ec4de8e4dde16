"""L4: requests (acks) LEFT OUTER JOIN results, with watermarks and a time bound.

Request side event time is ``deadline_time``; a result matches when it is ``ok``
or not, arrives with ``result_time <= deadline_time + grace``. Rows still
unmatched when the watermark passes that bound come out with null result
columns and become fallback answers; the late result is merged in later by the
backfill query. Requests the sidecar refused (or never saw) are answered with
the fallback at once, outside the join.

Watermarks: the request side uses a delay equal to the largest SLA, so a
``low`` request (deadline far ahead) never pushes the watermark past the wall
clock and cuts a ``high`` request's window short. The answers query must run
with ``spark.sql.streaming.multipleWatermarkPolicy=max``: the results side
(finish times, close to now) then drives the watermark, and a stalled results
stream (sidecar down) does not hold fallbacks back (DESIGN.md, measured).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_ext.config import JoinConfig, TaggingConfig

#: Columns of the answers table (plus the event's key columns).
ANSWER_COLUMNS: tuple[str, ...] = (
    "request_id", "trace_id", "priority", "answer", "answer_source", "status", "fallback_text",
    "enqueue_ts", "deadline_ts", "answered_ts", "latency_ms", "deadline_met", "backfilled_at",
)


def _answer_columns(key_columns: list[str]) -> list[str]:
    return list(ANSWER_COLUMNS) + [c for c in key_columns if c not in ANSWER_COLUMNS]


def _unstamped(df: DataFrame) -> DataFrame:
    """Timing columns are set when the answer lands (``pipeline.stamp_answered``)."""
    return (df.withColumn("answered_ts", F.lit(None).cast("long"))
              .withColumn("latency_ms", F.lit(None).cast("long"))
              .withColumn("deadline_met", F.lit(None).cast("boolean"))
              .withColumn("backfilled_at", F.lit(None).cast("long")))


def _fallback(sidecar_text: str, join: JoinConfig) -> "F.Column":
    """The sidecar pool's rule answer when it sent one, else the pipeline's."""
    return F.coalesce(F.nullif(F.col(sidecar_text), F.lit("")), F.lit(join.fallback_text))


def refused_answers(acks: DataFrame, join: JoinConfig, key_columns: list[str]) -> DataFrame:
    """Fallback answers for requests the sidecar did not accept (at once)."""
    out = (acks.filter(~F.col("accepted"))
           .withColumn("fallback_text", _fallback("sidecar_fallback_text", join))
           .withColumn("answer", F.col("fallback_text"))
           .withColumn("answer_source", F.lit("fallback"))
           .withColumn("status", F.coalesce(F.col("reason"), F.lit("unavailable"))))
    return _unstamped(out).select(*_answer_columns(key_columns))


def join_answers(acks: DataFrame, results: DataFrame, *, join: JoinConfig,
                 tagging: TaggingConfig) -> DataFrame:
    """Stream of answers for accepted requests: ``llm`` when an ``ok`` result came in
    time, else ``fallback`` (with the result's status, or ``timeout`` if none came).

    Args:
        acks: Ack rows (:func:`spark_ext.submit.submit_requests` output), streaming.
        results: :func:`spark_ext.results.read_results` output.
    """
    max_sla_ms = max(tagging.sla_ms.values())
    req = (acks.filter(F.col("accepted"))
           .withColumn("deadline_time", F.timestamp_millis("deadline_ts"))
           .withWatermark("deadline_time", f"{max_sla_ms} milliseconds")
           .alias("req"))
    res = (results.select(F.col("request_id").alias("res_request_id"),
                          F.col("status").alias("res_status"),
                          F.col("text").alias("res_text"),
                          F.col("fallback_text").alias("res_fallback_text"),
                          "result_time")
           .withWatermark("result_time", join.results_watermark)
           .alias("res"))
    window = F.expr(f"INTERVAL {max_sla_ms + join.grace_ms} MILLISECONDS")
    grace = F.expr(f"INTERVAL {join.grace_ms} MILLISECONDS")
    joined = req.join(
        res,
        (F.col("req.request_id") == F.col("res.res_request_id"))
        & (F.col("res.result_time") >= F.col("req.deadline_time") - window)
        & (F.col("res.result_time") <= F.col("req.deadline_time") + grace),
        "leftOuter",
    )
    is_llm = F.col("res_status") == "ok"
    out = (joined
           .withColumn("fallback_text", _fallback("res_fallback_text", join))
           .withColumn("answer", F.when(is_llm, F.col("res_text"))
                       .otherwise(F.col("fallback_text")))
           .withColumn("answer_source", F.when(is_llm, F.lit("llm")).otherwise(F.lit("fallback")))
           .withColumn("status", F.coalesce(F.col("res_status"), F.lit("timeout"))))
    return _unstamped(out).select(*_answer_columns(tagging.key_columns))
