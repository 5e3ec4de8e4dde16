"""The ``foreachBatch`` functions of the queries when Delta on Spark writes the tables
(``output.writer: spark``): plain objects holding configuration only, so Spark can
pickle them to Spark Connect's server, where they run in the query's Python process;
in a classic session they run in the driver. The executors compute the answer rows
(``mapInArrow``, :mod:`spark_ext.l4.answer_batches`) and write every table
(:class:`~spark_ext.l4.spark_tables.SparkTables`); nothing is collected to the driver
but a few bounds and counts.

Each micro-batch is computed once: it is persisted before its first write, so the
submission (a ``mapInArrow`` with a side effect) runs once per attempt; a re-run batch is
safe anyway (the sidecar drops repeated request ids, the appends are skipped by Delta's
transaction ids, and the MERGE of the answers is idempotent).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_ext.config import ValidationConfig
from spark_ext.l2.fast_path import KB_ONLY_COLUMNS, FastPathStats
from spark_ext.l4.answer_batches import (ack_answers, result_answers, review_queue_rows,
                                         review_schema, shadow_schema)
from spark_ext.l4.answers import PARTITION, answer_schema
from spark_ext.l4.counts import PipelineCounts
from spark_ext.l4.rollout import SHADOW_ATTRIBUTE
from spark_ext.l4.spark_tables import SparkTables
from spark_ext.schemas import spark_schema
from spark_ext.sources.kafka import DEAD_LETTER_COLUMN, DEAD_LETTER_META

logger = logging.getLogger(__name__)

#: Request attribute naming the pipeline that submitted it (echoed on its result).
PIPELINE_ATTRIBUTE = "sts.pipeline"
#: Boolean column of the routed submit query: whether the row goes to the sidecar.
SUBMIT_COLUMN = "_sts_submit"


def hour_column(epoch_ms: str = "enqueue_ts") -> Column:
    """The UTC hour of an epoch-ms column, ``YYYY-MM-DDTHH`` (the tables' partition),
    whatever the session's time zone (:func:`spark_ext.l4.answers.hour_of` in Spark)."""
    utc = F.to_utc_timestamp(F.timestamp_millis(F.col(epoch_ms)), F.current_timezone())
    return F.date_format(utc, "yyyy-MM-dd'T'HH")


@dataclass
class BatchContext:
    """What the handlers need, as plain data."""

    tables: SparkTables
    pipeline_id: str
    app_ids: dict[str, str]
    """Query -> the prefix of its Delta transaction ids (the query's run id)."""
    fallback_text: str
    rule_text: str
    rollout_mode: str
    validation: ValidationConfig
    counts: PipelineCounts = field(default_factory=PipelineCounts)
    fast_path_stats: FastPathStats | None = None
    """L1/L2's routes and retrieval hits (the routed submit query; ``None``: not counted)."""

    @property
    def key_columns(self) -> tuple[str, ...]:
        return self.tables.key_columns

    def app_id(self, query: str, table: str) -> str:
        return f"{self.app_ids[query]}/{table}"

    def merge(self, answers: DataFrame, *, table: str = "answers", backfill: bool = True) -> None:
        answers = answers.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            offered = answers.groupBy("answer_source", "status").agg(
                F.count("*").alias("n")).collect()
            if not offered:
                return
            metrics = self.tables.merge_answers(answers, table=table, backfill=backfill)
            if table == "answers":
                self.counts.add_merge(metrics, [r.asDict() for r in offered])
        finally:
            answers.unpersist()


def _arrow_map(df: DataFrame, fn, schema, **kwargs) -> DataFrame:
    return df.mapInArrow(functools.partial(fn, **kwargs), spark_schema(schema))


class SubmitBatchWriter:
    """The submit query's micro-batch: dead letters, the answers given at once (L1/L2,
    the rollout's rule arm, refusals), then the ``requests`` table."""

    def __init__(self, ctx: BatchContext) -> None:
        self.ctx = ctx

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        ctx = self.ctx
        batch = batch.persist(StorageLevel.MEMORY_AND_DISK)  # submitted once per attempt
        try:
            if DEAD_LETTER_COLUMN in batch.columns:
                self._dead_letters(batch.where(F.col(DEAD_LETTER_COLUMN).isNotNull()), batch_id)
                batch = batch.where(F.col(DEAD_LETTER_COLUMN).isNull()).drop(
                    DEAD_LETTER_COLUMN, *DEAD_LETTER_META)
            submit_column = SUBMIT_COLUMN if SUBMIT_COLUMN in batch.columns else None
            if ctx.fast_path_stats is not None and "route" in batch.columns:
                counted = [c for c in ("route", "kb_ids", "kb_top_score") if c in batch.columns]
                ctx.fast_path_stats.add(batch.select(*counted).toArrow())
            options = dict(key_columns=ctx.key_columns, fallback_text=ctx.fallback_text,
                           rule_text=ctx.rule_text, rollout_mode=ctx.rollout_mode,
                           submit_column=submit_column)
            ctx.merge(_arrow_map(batch, ack_answers, answer_schema(ctx.key_columns), **options))
            if ctx.rollout_mode == "shadow":
                ctx.merge(_arrow_map(batch, ack_answers, shadow_schema(ctx.key_columns),
                                     shadow=True, **options),
                          table="shadow_answers", backfill=False)
            requests = batch.where(F.col(submit_column)) if submit_column else batch
            dropped = [c for c in (SUBMIT_COLUMN, *KB_ONLY_COLUMNS) if c in requests.columns]
            requests = requests.drop(*dropped).drop("prompt")
            if n := requests.count():
                ctx.tables.append(requests.withColumn(PARTITION, hour_column()), "requests",
                                  app_id=ctx.app_id("submit", "requests"), version=batch_id)
                ctx.counts.submitted += n
        finally:
            batch.unpersist()

    def _dead_letters(self, dead: DataFrame, batch_id: int) -> None:
        now = F.unix_millis(F.current_timestamp())
        rows = dead.select(
            F.col("_kafka_topic").alias("topic"), F.col("_kafka_partition").alias("partition"),
            F.col("_kafka_offset").alias("offset"),
            F.col("_kafka_timestamp_ms").alias("timestamp_ms"), F.col("_kafka_key").alias("key"),
            F.col("_kafka_value").alias("value"), F.col(DEAD_LETTER_COLUMN).alias("error"),
            now.alias("dead_lettered_ts"),
            F.coalesce(F.col("_kafka_timestamp_ms"), now).alias("enqueue_ts"))
        n = rows.count()
        if n:
            self.ctx.tables.append(rows.withColumn(PARTITION, hour_column()), "dead_letters",
                                   app_id=self.ctx.app_id("submit", "dead-letters"),
                                   version=batch_id)
            self.ctx.counts.dead_letters += n
            logger.warning("Dead letters: %d record(s) of this micro-batch are not events "
                           "(the dead_letters table).", n)


class ResultBatchWriter:
    """The answers query's micro-batch: this pipeline's result rows to ``results``, the
    answers and backfills merged into ``answers`` (shadow rows into ``shadow_answers``),
    invalid answers to ``review_queue``."""

    def __init__(self, ctx: BatchContext) -> None:
        self.ctx = ctx

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        ctx = self.ctx
        mine = F.col("attributes")[PIPELINE_ATTRIBUTE] == F.lit(ctx.pipeline_id)
        batch = batch.where(F.col("status").isNotNull() & mine).persist(
            StorageLevel.MEMORY_AND_DISK)
        try:
            shadow = F.coalesce(F.col("attributes")[SHADOW_ATTRIBUTE] == F.lit("1"), F.lit(False))
            served = batch.where(~shadow)
            options = dict(key_columns=ctx.key_columns, fallback_text=ctx.fallback_text,
                           validation=ctx.validation)
            # The answers first: they are what a reader waits for.
            ctx.merge(_arrow_map(served, result_answers, answer_schema(ctx.key_columns),
                                 **options))
            if ctx.rollout_mode == "shadow":
                ctx.merge(_arrow_map(batch.where(shadow), result_answers,
                                     shadow_schema(ctx.key_columns), shadow=True, **options),
                          table="shadow_answers", backfill=False)
            ctx.tables.append(batch.withColumn(PARTITION, hour_column()), "results",
                              app_id=ctx.app_id("answers", "results"), version=batch_id)
            if ctx.validation.enabled:
                review = _arrow_map(served.where(F.col("status") == "ok"), review_queue_rows,
                                    review_schema(ctx.key_columns), **options).persist()
                try:
                    rules = review.groupBy("rule").count().collect()
                    if rules:
                        ctx.tables.append(review, "review_queue",
                                          app_id=ctx.app_id("answers", "review"),
                                          version=batch_id)
                        ctx.counts.validation_failures.update(
                            {r["rule"]: r["count"] for r in rules})
                        logger.warning("Output validation: %d answers replaced by the "
                                       "fallback (%s).", sum(r["count"] for r in rules),
                                       {r["rule"]: r["count"] for r in rules})
                finally:
                    review.unpersist()
        finally:
            batch.unpersist()
