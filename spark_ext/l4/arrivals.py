"""The answers query's input: everything that arrives for this pipeline's requests, as
ledger candidates in buckets (:mod:`spark_ext.l4.ledger`).

Three streams are one: the sidecar's **results**, the submit tasks' **acks**
(:mod:`spark_ext.submit.ack_channel`) and the **clock** (:mod:`spark_ext.sources.clock`).
The results and acks come from the result channel's Spark side
(:mod:`spark_ext.l4.channels`: two landing folders on ``files``, one Kafka source over
the result and acks topics on ``kafka``). Every arrival becomes the
candidates of :mod:`spark_ext.l4.candidates` (on the executors), with the micro-batch's
time, then goes to bucket ``keys[pmod(hash(request_id), len(keys))]`` of the ledger's
bucket keys (:mod:`spark_ext.l4.buckets`); the clock gives each bucket a tick.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (BinaryType, IntegerType, LongType, StringType, StructField,
                               StructType)

from spark_ext.batch_time import batch_time_ms
from spark_ext.config import PipelineConfig
from spark_ext.l2.fast_path import KB_ONLY_COLUMNS
from spark_ext.l4.candidates import ACK, EVENTS, NOW, PAYLOAD, RESULT, arrival_candidates
from spark_ext.l4.channels.base import ChannelSide
from spark_ext.l4.ledger import CLOCK, ledger_schema
from spark_ext.schemas import spark_schema
from spark_ext.sources.kafka import DEAD_LETTER_COLUMN, DEAD_LETTER_META

#: Request attribute naming the pipeline that submitted it (echoed on its result).
PIPELINE_ATTRIBUTE = "sts.pipeline"
#: Boolean column of the routed submit query: whether the row goes to the sidecar.
SUBMIT_COLUMN = "_sts_submit"
#: The ``dead_letters`` table's columns, from an ack row of a dead letter.
_DEAD_LETTER = {
    "topic": "_kafka_topic", "partition": "_kafka_partition", "offset": "_kafka_offset",
    "timestamp_ms": "_kafka_timestamp_ms", "key": "_kafka_key", "value": "_kafka_value",
    "error": DEAD_LETTER_COLUMN,
}


def request_columns(ack_schema: StructType) -> list[str]:
    """The ack columns the ``requests`` table keeps (not the routing flag, not L2's
    answer texts, not a dead letter's raw record)."""
    dropped = {SUBMIT_COLUMN, *KB_ONLY_COLUMNS, DEAD_LETTER_COLUMN, *DEAD_LETTER_META}
    return [f.name for f in ack_schema.fields if f.name not in dropped]


#: The ``dead_letters`` table's record.
DEAD_LETTER_SCHEMA = StructType([
    StructField("topic", StringType()), StructField("partition", IntegerType()),
    StructField("offset", LongType()), StructField("timestamp_ms", LongType()),
    StructField("key", BinaryType()), StructField("value", BinaryType()),
    StructField("error", StringType()), StructField("dead_lettered_ts", LongType()),
    StructField("enqueue_ts", LongType()),
])


def record_schemas(ack_schema: StructType, key_columns: tuple[str, ...]) -> dict:
    """Table -> the Spark schema of its records (what the record JSON holds)."""
    from sidecar.contract import RESULT_SCHEMA
    from spark_ext.l4.candidates import review_schema

    requests = StructType([StructField(c, ack_schema[c].dataType, True)
                           for c in request_columns(ack_schema)])
    return {"requests": requests, "results": spark_schema(RESULT_SCHEMA),
            "dead_letters": DEAD_LETTER_SCHEMA,
            "review_queue": spark_schema(review_schema(key_columns))}


def _ack_payload(ack_schema: StructType, now: Column) -> Column:
    """An ack row's record JSON: its ``dead_letters`` row (dead-lettered at ``now``),
    else its ``requests`` row."""
    request = F.to_json(F.struct(*[F.col(c) for c in request_columns(ack_schema)]))
    if DEAD_LETTER_COLUMN not in ack_schema.fieldNames():
        return request
    dead = F.to_json(F.struct(*[F.col(src).alias(name) for name, src in _DEAD_LETTER.items()],
                              now.alias("dead_lettered_ts"),
                              F.coalesce(F.col("_kafka_timestamp_ms"), now).alias("enqueue_ts")))
    return F.when(F.col(DEAD_LETTER_COLUMN).isNotNull(), dead).otherwise(request)


def _events(ack_schema: StructType) -> Column:
    """L1/L2's figures of an event (route, retrieval) as JSON, when routing ran."""
    names = [c for c in ("route", "kb_ids", "kb_top_score") if c in ack_schema.fieldNames()]
    if "route" not in names:
        return F.lit(None).cast("string")
    return F.to_json(F.struct(*[F.col(c) for c in names]))


def _as_arrivals(df: DataFrame, kind: str, other: StructType, payload: Column,
                 events: Column | None = None, *, exclude: tuple[str, ...] = ()) -> DataFrame:
    """``df``'s rows as arrivals of ``kind`` (a struct of the row but ``exclude``), the
    other kind null."""
    row = F.struct(*[F.col(c) for c in df.columns if c not in exclude])
    nothing = F.lit(None).cast(other)
    cols = {RESULT: row if kind == RESULT else nothing, ACK: row if kind == ACK else nothing}
    return df.select(cols[RESULT].alias(RESULT), cols[ACK].alias(ACK),
                     payload.alias(PAYLOAD),
                     (events if events is not None else F.lit(None).cast("string")).alias(EVENTS))


def _mine(results: DataFrame, pipeline_id: str) -> DataFrame:
    """Result rows of this pipeline's requests (other pipelines may share the channel);
    rows that do not parse (``status`` null) are kept, to be counted."""
    return results.where(F.col("status").isNull()
                         | (F.col("attributes")[PIPELINE_ATTRIBUTE] == F.lit(pipeline_id)))


def arrivals(spark: SparkSession, channel: ChannelSide, *, ack_schema: StructType
             ) -> DataFrame:
    """Result and ack rows of ``channel.pipeline_id`` as one stream of arrivals."""
    from sidecar.contract import RESULT_SCHEMA

    streams = channel.streams(spark, ack_schema)
    mine = _mine(streams.results, channel.pipeline_id)
    result_arrivals = _as_arrivals(mine, RESULT, ack_schema, streams.payload,
                                   exclude=streams.exclude)
    ack_arrivals = _as_arrivals(streams.acks, ACK, spark_schema(RESULT_SCHEMA),
                                _ack_payload(ack_schema, batch_time_ms(spark)),
                                _events(ack_schema))
    return result_arrivals.unionByName(ack_arrivals)


def ledger_input(arrivals_df: DataFrame, clock: DataFrame, config: PipelineConfig, *,
                 hold_ms: int, rule_text: str, count_events: bool,
                 submit_column: str | None, bucket_keys: Sequence[int]) -> DataFrame:
    """Candidates of the arrivals and the clock's ticks, each with its ``_bucket``: one
    of ``bucket_keys`` (:mod:`spark_ext.l4.buckets`) by the hash of its ``request_id``
    (of its payload without one); the clock gives a tick to each."""
    keys = tuple(config.tagging.key_columns)
    schema = spark_schema(ledger_schema(keys))
    answers = config.answers
    options = dict(key_columns=keys, fallback_text=answers.fallback_text,
                   grace_ms=answers.grace_ms, hold_ms=hold_ms)
    fn = functools.partial(
        arrival_candidates,
        results=dict(options, validation=config.validation),
        acks=dict(options, rule_text=rule_text, rollout_mode=config.rollout.mode,
                  submit_column=submit_column, dead_letter_column=DEAD_LETTER_COLUMN,
                  count_events=count_events))
    now = batch_time_ms(arrivals_df.sparkSession)
    timed = arrivals_df.withColumn(NOW, now)
    candidates = timed.mapInArrow(fn, schema)
    which = F.pmod(F.hash(F.coalesce(F.col("request_id"), F.col(PAYLOAD))),
                   F.lit(len(bucket_keys)))
    bucket = F.element_at(F.array(*[F.lit(k) for k in bucket_keys]), which + 1)
    candidates = candidates.withColumn("_bucket", bucket.cast("int"))
    ticks = clock.select(*[
        (F.col("bucket").cast("int") if f.name == "_bucket"
         else F.lit(CLOCK) if f.name == "_kind"
         else now if f.name == NOW
         else F.lit(None).cast(f.dataType)).alias(f.name) for f in schema.fields])
    return candidates.unionByName(ticks)
