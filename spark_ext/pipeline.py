"""Wiring: the whole STS pipeline from one :class:`PipelineConfig`.

Three streaming queries, none of which waits on the model:

``sts-submit``   events -> L1/L2 tagging -> SubmitBatch (mapInArrow) -> ack rows:
                 acks landing (Parquet), ``requests`` table, and fallback answers
                 for refused requests at once.
``sts-answers``  acks LEFT OUTER JOIN results (watermarks, time bound) ->
                 ``answers`` (``llm`` or ``fallback``).
``sts-results``  results -> ``results`` table, and backfill of late ``ok`` results
                 into ``answers``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from sidecar.contract import RESULT_SCHEMA, now_ms, write_parquet_atomically
from spark_ext.config import PipelineConfig
from spark_ext.join import join_answers, refused_answers
from spark_ext.results import HEARTBEAT_ID, read_results
from spark_ext.sink import DeltaSink, backfill_answers
from spark_ext.submit import submit_requests
from spark_ext.tagging import build_requests
from spark_ext.template import PromptTemplate

logger = logging.getLogger(__name__)


def stamp_answered(answers: pa.Table) -> pa.Table:
    """Set ``answered_ts`` to now (when the answer lands in Delta), and derive
    ``latency_ms`` and ``deadline_met`` from it: end-to-end as a reader sees it."""
    now = now_ms()
    n = answers.num_rows
    enqueue = answers.column("enqueue_ts")
    deadline = answers.column("deadline_ts")
    replace = {
        "answered_ts": pa.array([now] * n, pa.int64()),
        "latency_ms": pc.subtract(pa.scalar(now, pa.int64()), enqueue),
        "deadline_met": pc.less_equal(pa.scalar(now, pa.int64()), deadline),
    }
    for name, values in replace.items():
        answers = answers.set_column(answers.schema.get_field_index(name), name, values)
    return answers


class StsPipeline:
    """Builds and runs the STS queries on a SparkSession.

    Usage::

        pipeline = StsPipeline(spark, PipelineConfig.from_yaml("conf/pipeline.yaml"))
        queries = pipeline.start()
        pipeline.drain(); pipeline.stop()
    """

    def __init__(self, spark: SparkSession, config: PipelineConfig) -> None:
        self.spark = spark
        self.config = config
        self.template = PromptTemplate(stable=config.template.stable,
                                       dynamic=config.template.dynamic)
        out = config.output
        self.answers = DeltaSink(out.table("answers"))
        self.requests_table = DeltaSink(out.table("requests"))
        self.results_table = DeltaSink(out.table("results"))
        self.queries: list[StreamingQuery] = []
        folders = [out.acks_dir, config.sidecar.results_dir, out.out_dir, out.checkpoint_dir]
        if config.source.format != "rate" and "://" not in config.source.path:
            folders.append(config.source.path)  # Spark's file source needs it to exist
        for d in folders:
            Path(d).mkdir(parents=True, exist_ok=True)

    # -------------------------------------------------------------- DataFrames

    def events(self) -> DataFrame:
        src = self.config.source
        reader = self.spark.readStream
        if src.format == "rate":
            return reader.format("rate").options(**src.options).load()
        return reader.schema(src.schema).options(**src.options).format(src.format).load(src.path)

    def requests(self, events: DataFrame | None = None) -> DataFrame:
        return build_requests(events if events is not None else self.events(),
                              self.config.tagging, self.template)

    def acks(self, events: DataFrame | None = None) -> DataFrame:
        return submit_requests(self.requests(events), self.config.sidecar)

    # -------------------------------------------------------------- batch writers

    def _write_acks(self, batch: DataFrame, batch_id: int) -> None:
        table = batch.toArrow()
        if table.num_rows == 0:
            return
        write_parquet_atomically(table, self.config.output.acks_dir, f"acks-{batch_id:09d}.parquet")
        self.requests_table.insert_new(table)
        refused = refused_answers(batch, self.config.join, self.config.tagging.key_columns)
        self.answers.insert_new(stamp_answered(refused.toArrow()))

    def _write_answers(self, batch: DataFrame, batch_id: int) -> None:
        table = batch.toArrow()
        if table.num_rows == 0:
            return
        self.answers.insert_new(stamp_answered(table))
        # A result that reached the results table before this fallback row existed
        # would be missed by the results query's backfill: merge it now (reading
        # only this batch's fallback ids, not the whole table).
        fallback_ids = table.filter(pc.equal(table.column("answer_source"), "fallback")
                                    ).column("request_id").to_pylist()
        if fallback_ids and self.results_table.exists():
            backfill_answers(self.answers, self.results_table.read(
                ["request_id", "status", "text", "finish_ts"],
                filters=[("request_id", "in", fallback_ids)]))

    def _write_results(self, batch: DataFrame, batch_id: int) -> None:
        table = batch.drop("result_time").toArrow()
        table = table.filter(pc.not_equal(table.column("request_id"), HEARTBEAT_ID))
        if table.num_rows == 0:
            return
        self.results_table.insert_new(table)
        backfill_answers(self.answers, table)

    # -------------------------------------------------------------- lifecycle

    def start(self, *, events: DataFrame | None = None) -> list[StreamingQuery]:
        """Start the three queries (``events`` overrides the configured source)."""
        self.spark.conf.set("spark.sql.streaming.multipleWatermarkPolicy", "max")
        out = self.config.output
        trigger = {"processingTime": f"{out.trigger_s} seconds"}
        acks = self.acks(events)
        q_submit = (acks.writeStream.queryName("sts-submit").foreachBatch(self._write_acks)
                    .option("checkpointLocation", out.checkpoint("submit"))
                    .trigger(**trigger).start())
        results = read_results(self.spark, self.config.sidecar.results_dir)
        ack_stream = self.spark.readStream.schema(acks.schema).parquet(out.acks_dir)
        answers = join_answers(ack_stream, results, join=self.config.join,
                               tagging=self.config.tagging)
        q_answers = (answers.writeStream.queryName("sts-answers")
                     .foreachBatch(self._write_answers)
                     .option("checkpointLocation", out.checkpoint("answers"))
                     .trigger(**trigger).start())
        q_results = (read_results(self.spark, self.config.sidecar.results_dir)
                     .writeStream.queryName("sts-results").foreachBatch(self._write_results)
                     .option("checkpointLocation", out.checkpoint("results"))
                     .trigger(**trigger).start())
        self.queries = [q_submit, q_answers, q_results]
        return self.queries

    def drain(self) -> None:
        """Write a heartbeat result far in the future so the answers query's
        watermark passes every open window and emits the remaining fallbacks
        (needed at the end of a finite run: with no new events, the watermark
        stops)."""
        far = now_ms() + 10 * (max(self.config.tagging.sla_ms.values())
                               + self.config.join.grace_ms)
        row = {f.name: [None] for f in RESULT_SCHEMA}
        row.update(request_id=[HEARTBEAT_ID], status=["heartbeat"], finish_ts=[far])
        write_parquet_atomically(pa.table(row, schema=RESULT_SCHEMA),
                                 self.config.sidecar.results_dir,
                                 f"heartbeat-{now_ms()}.parquet")

    def process_all_available(self) -> None:
        for q in self.queries:
            q.processAllAvailable()

    def stop(self) -> None:
        for q in self.queries:
            q.stop()
