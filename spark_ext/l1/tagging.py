"""L1: tag events as requests: ids, priority, deadlines, model and budget.

The prompt (L2) is added by :func:`spark_ext.l2.prompts.build_requests`.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sidecar.contract import PRIORITY_NAMES
from spark_ext.batch_time import batch_time_ms
from spark_ext.config import TaggingConfig

#: Columns :func:`tag_requests` adds (the prompt's two come from L2).
TAG_COLUMNS: tuple[str, ...] = (
    "request_id", "trace_id", "priority", "enqueue_ts", "deadline_ts", "model",
    "max_tokens", "temperature", "callback_topic",
)


#: A W3C ``traceparent``; group 1 is its trace id.
_TRACEPARENT_PATTERN = r"^[0-9a-e][0-9a-f]-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}"


def _expr(name_or_expr: str, df: DataFrame) -> Column:
    return F.col(name_or_expr) if name_or_expr in df.columns else F.expr(name_or_expr)


def tag_requests(df: DataFrame, config: TaggingConfig, *, needs: tuple[str, ...] = (),
                 namespace: str = "") -> DataFrame:
    """Return ``df`` with the :data:`TAG_COLUMNS` added (existing columns are kept);
    ``needs`` names further columns that must exist (the template's fields).

    ``request_id`` is a SHA-256 of ``namespace`` and the key columns, so a replayed
    event maps to the same id and the sidecar and the Delta MERGE drop the replay,
    while the same keys in another namespace (another query, or a new checkpoint of
    the same one: :attr:`spark_ext.LlmInference.namespace`) get other ids and never
    meet an earlier request's in the sidecar's de-duplication. Priorities
    are lower-cased; an unknown one is kept as is and refused by the sidecar with
    a ``rejected`` result (it is never dropped silently).

    Usage::

        tagged = tag_requests(events, TaggingConfig())
    """
    named = [*config.key_columns, *needs]
    if config.traceparent and config.traceparent.isidentifier():
        named.append(config.traceparent)
    missing = [c for c in named if c not in df.columns]
    if missing:
        raise ValueError(f"columns {missing} are missing from the events ({df.columns})")
    key = F.concat_ws("\u001f", *([F.lit(namespace)] if namespace else []),
                      *[F.coalesce(F.col(c).cast("string"), F.lit("")) for c in
                        config.key_columns])
    request_id = F.substring(F.sha2(key, 256), 1, 32)
    priority = F.lower(F.trim(_expr(config.priority, df).cast("string")))
    batch_time = batch_time_ms(df.sparkSession)
    enqueue = _expr(config.event_time_ms, df).cast("long") if config.event_time_ms \
        else batch_time
    max_tokens = F.lit(config.max_tokens)
    if config.max_tokens_column:
        own = _expr(config.max_tokens_column, df).cast("int")
        # greatest/least skip nulls, so a null budget is handled first
        max_tokens = F.when(own.isNull(), F.lit(config.max_tokens)).otherwise(
            F.least(F.greatest(own, F.lit(1)), F.lit(config.max_tokens)))
    sla = F.lit(None).cast("long")
    for p in reversed(PRIORITY_NAMES):
        sla = F.when(F.col("priority") == p, F.lit(config.sla_ms[p])).otherwise(sla)
    trace_id = F.col(config.trace_id).cast("string") if config.trace_id else F.col("request_id")
    if config.traceparent:  # the trace id of a valid W3C traceparent wins
        parent = F.regexp_extract(F.lower(F.trim(_expr(config.traceparent, df).cast("string"))),
                                  _TRACEPARENT_PATTERN, 1)
        trace_id = F.when(parent.isin("", "0" * 32), trace_id).otherwise(parent)
    out = (df.withColumn("request_id", request_id)
             .withColumn("trace_id", trace_id)
             .withColumn("priority", priority)
             .withColumn("enqueue_ts", F.coalesce(enqueue, batch_time))
             # unknown priority: give it the normal SLA; the sidecar refuses it anyway
             .withColumn("deadline_ts", F.col("enqueue_ts") + F.coalesce(
                 sla, F.lit(config.sla_ms["normal"])))
             .withColumn("model", F.lit(config.model))
             .withColumn("max_tokens", max_tokens.cast("int"))
             .withColumn("temperature", F.lit(config.temperature).cast("float"))
             # an unknown priority's row goes where the sidecar puts it: the normal topic
             .withColumn("callback_topic", F.replace(F.lit(config.callback_topic),
                                                     F.lit("{priority}"), F.when(
                                                         F.col("priority").isin(*PRIORITY_NAMES),
                                                         F.col("priority")).otherwise(
                                                         F.lit("normal")))))
    return out
