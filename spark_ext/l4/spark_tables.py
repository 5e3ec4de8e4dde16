"""L4 on Delta on Spark (``output.writer: spark``): the executors write the tables, the
driver only coordinates, and nothing here keeps state between micro-batches, so the
``foreachBatch`` functions that use it run on Spark Connect too (in the server's Python
process).

- **Appends are idempotent by Delta's own transaction ids**: ``requests``, ``results``,
  ``review_queue`` and ``dead_letters`` are written with ``txnAppId`` = the query's run id
  and table, ``txnVersion`` = the batch id (PySpark's ``foreachBatch`` recipe), so a
  re-run micro-batch is skipped by Delta.
- **One answer per request, by MERGE**: the answer rows of a micro-batch are merged into
  ``answers`` on ``request_id``: a new request is inserted, a model's answer for a request
  answered with the fallback is the backfill (``answer_source = backfill``), anything
  else changes nothing. A replayed micro-batch merges to the same table. The target is
  pruned to the batch's ``enqueue_hour`` partitions and ``enqueue_ts`` range (appends are
  written in time order, so Delta's file statistics skip every older file): the cost of a
  micro-batch does not grow with the table.
- **Tables by path or by catalog name** (``output.tables``), created with the documented
  columns, partitioned by ``enqueue_hour``, deletion vectors off (``deltalake`` cannot
  read them) and the change data feed on for ``answers`` (the answers topic reads it).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from spark_ext.config import OutputConfig
from spark_ext.l4.answers import PARTITION, answer_schema
from spark_ext.schemas import spark_schema

logger = logging.getLogger(__name__)

#: Table properties of every table the writer creates.
TABLE_PROPERTIES = {"delta.enableDeletionVectors": "false"}
#: ... and of the ``answers`` and ``shadow_answers`` tables besides.
ANSWER_TABLE_PROPERTIES = {**TABLE_PROPERTIES, "delta.enableChangeDataFeed": "true"}


def _sql_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class SparkTables:
    """Where the tables are and how they are written, as plain data (it travels with the
    ``foreachBatch`` functions to Spark Connect's server).

    Args:
        output: The ``output`` section (``out_dir``, ``tables``).
        key_columns: The event's key columns (kept in ``answers`` as strings).
    """

    output: OutputConfig
    key_columns: tuple[str, ...]

    # ------------------------------------------------------------------ names

    def location(self, name: str) -> str:
        """The table's catalog name, or its path under ``out_dir``."""
        return self.output.tables.get(name) or self.output.table(name)

    def by_name(self, name: str) -> bool:
        return name in self.output.tables

    def ref(self, name: str) -> str:
        """The table in SQL: its name, or ``delta.`<path>```."""
        if self.by_name(name):
            return self.output.tables[name]
        return "delta.`" + self.output.table(name).replace("`", "``") + "`"

    # ------------------------------------------------------------------ tables

    def exists(self, spark: SparkSession, name: str) -> bool:
        try:
            spark.sql(f"DESCRIBE DETAIL {self.ref(name)}").collect()
        except Exception:  # noqa: BLE001 - no table there (yet)
            return False
        return True

    def create_answer_tables(self, spark: SparkSession) -> None:
        """``answers`` and ``shadow_answers`` with their columns, partitioning and
        properties, unless they exist (MERGE needs its target; a table of another shape
        at that place is left alone and the MERGE then says what is wrong)."""
        fields = spark_schema(answer_schema(self.key_columns)).fields
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in fields)
        for name, extra in (("answers", ""), ("shadow_answers", ", `model_text` string")):
            props = ", ".join(f"'{k}' = '{v}'" for k, v in ANSWER_TABLE_PROPERTIES.items())
            spark.sql(f"CREATE TABLE IF NOT EXISTS {self.ref(name)} ({columns}{extra}) "
                      f"USING delta PARTITIONED BY (`{PARTITION}`) TBLPROPERTIES ({props})")

    def read(self, spark: SparkSession, name: str) -> DataFrame:
        if self.by_name(name):
            return spark.read.table(self.output.tables[name])
        return spark.read.format("delta").load(self.output.table(name))

    def read_arrow(self, spark: SparkSession, name: str) -> pa.Table:
        """Table ``name`` as Arrow (empty when it does not exist yet)."""
        if not self.exists(spark, name):
            return pa.table({})
        return self.read(spark, name).toArrow()

    # ------------------------------------------------------------------ writes

    def append(self, df: DataFrame, name: str, *, app_id: str, version: int) -> None:
        """Append ``df`` to table ``name`` once per ``(app_id, version)`` (Delta skips a
        version it has committed for that app id). New columns are added to the table."""
        writer = (df.write.format("delta").mode("append")
                  .option("txnAppId", app_id).option("txnVersion", str(version))
                  .option("mergeSchema", "true").partitionBy(PARTITION))
        for key, value in TABLE_PROPERTIES.items():  # used when the append creates it
            writer = writer.option(key, value)
        if self.by_name(name):
            writer.saveAsTable(self.output.tables[name])
        else:
            writer.save(self.output.table(name))

    def merge_answers(self, answers: DataFrame, *, table: str = "answers",
                      backfill: bool = True) -> dict[str, int]:
        """Merge answer rows into ``table`` (``answers`` or ``shadow_answers``): insert
        requests that have no row; with ``backfill``, a model's answer (``llm``) for a
        request answered with the fallback upgrades it to ``backfill``. Several rows for
        one request in ``answers`` (a timeout row and its late ``ok`` row) become one: the
        model's answer, as a backfill when a fallback came with it.

        Returns:
            Delta's MERGE metrics (``num_inserted_rows``, ``num_updated_rows``, ...).
        """
        spark = answers.sparkSession
        bounds = answers.agg(F.collect_set(PARTITION).alias("hours"),
                             F.min("enqueue_ts").alias("first"),
                             F.max("enqueue_ts").alias("last")).collect()[0]
        if not bounds["hours"]:
            return {}
        source = _one_row_per_request(answers)
        view = f"sts_answers_{uuid.uuid4().hex}"
        source.createOrReplaceTempView(view)
        hours = ", ".join(_sql_literal(h) for h in sorted(bounds["hours"]))
        on = [f"t.`{PARTITION}` IN ({hours})", f"t.`{PARTITION}` = s.`{PARTITION}`",
              "t.request_id = s.request_id"]
        if bounds["first"] is not None:  # file statistics skip everything older or newer
            on[1:1] = [f"t.enqueue_ts >= {int(bounds['first'])}",
                       f"t.enqueue_ts <= {int(bounds['last'])}"]
        update = ("WHEN MATCHED AND t.answer_source = 'fallback' AND s.answer_source IN "
                  "('llm', 'backfill') THEN UPDATE SET answer = s.answer, "
                  "answer_source = 'backfill', status = 'ok', "
                  "finish_ts = s.finish_ts, received_ts = s.received_ts, "
                  "backfilled_at = s.answered_ts ") if backfill else ""
        statement = (f"MERGE INTO {self.ref(table)} t USING {view} s ON {' AND '.join(on)} "
                     f"{update}WHEN NOT MATCHED THEN INSERT *")
        try:
            metrics = _retry_conflicts(lambda: spark.sql(statement).collect(), table)
        finally:
            spark.catalog.dropTempView(view)
        return metrics[0].asDict() if metrics else {}

    # ------------------------------------------------------------------ upkeep

    def maintain(self, spark: SparkSession, names: tuple[str, ...], hours: list[str], *,
                 vacuum_retention_hours: int) -> None:
        """Compact ``hours`` of each table (``OPTIMIZE ... WHERE``) and vacuum files
        older than the retention."""
        in_hours = ", ".join(_sql_literal(h) for h in hours)
        for name in names:
            if not self.exists(spark, name):
                continue
            spark.sql(f"OPTIMIZE {self.ref(name)} WHERE `{PARTITION}` IN ({in_hours})").collect()
            spark.sql(f"VACUUM {self.ref(name)} RETAIN {int(vacuum_retention_hours)} HOURS"
                      ).collect()


#: Delta's optimistic-concurrency conflicts: another writer committed to what this
#: MERGE read (the submit and answers queries and the safety net all merge into
#: ``answers``; on Spark Connect they are separate processes).
_CONFLICTS = ("DELTA_CONCURRENT", "ConcurrentAppendException", "ConcurrentDeleteReadException",
              "ConcurrentWriteException", "ConcurrentTransactionException")
#: How often a conflicting MERGE is tried again (it is idempotent, so a retry is safe).
MERGE_ATTEMPTS = 8


def _retry_conflicts(run, table: str):
    """``run()``, tried again (with a short random backoff) while it fails on a Delta
    write conflict; any other error, or the last conflict, is raised."""
    import random
    import time

    for attempt in range(1, MERGE_ATTEMPTS + 1):
        try:
            return run()
        except Exception as e:  # noqa: BLE001 - only conflicts are retried
            if attempt == MERGE_ATTEMPTS or not any(c in str(e) for c in _CONFLICTS):
                raise
            logger.info("MERGE into %s met a concurrent commit (attempt %d); trying again.",
                        table, attempt)
            time.sleep(random.uniform(0.05, 0.2) * attempt)
    raise AssertionError("unreachable")


def _one_row_per_request(answers: DataFrame) -> DataFrame:
    """One row per ``request_id``: the model's answer when there is one (``backfill``
    when a fallback row came with it), else the first fallback."""
    by_id = Window.partitionBy("request_id")
    is_llm = (F.col("answer_source") == "llm").cast("int")
    ranked = (answers
              .withColumn("_fallback_too", F.max((F.col("answer_source") == "fallback")
                                                 .cast("int")).over(by_id))
              .withColumn("_rank", F.row_number().over(
                  by_id.orderBy(is_llm.desc(), F.col("answered_ts").asc_nulls_last()))))
    first = ranked.where(F.col("_rank") == 1)
    upgraded = (F.col("answer_source") == "llm") & (F.col("_fallback_too") == 1)
    return (first
            .withColumn("backfilled_at", F.when(upgraded, F.col("answered_ts"))
                        .otherwise(F.col("backfilled_at")))
            .withColumn("answer_source", F.when(upgraded, F.lit("backfill"))
                        .otherwise(F.col("answer_source")))
            .drop("_fallback_too", "_rank"))


class SparkStore:
    """The tables of the ``spark`` writer as the rest of the pipeline reads them (the
    demo, the tests, ``/metrics``): :meth:`read` returns Arrow, :attr:`stats` the
    counters of this process's writes.

    Args:
        spark: The session.
        tables: Where the tables are.
        counts: What this pipeline's handlers counted.
    """

    def __init__(self, spark: SparkSession, tables: SparkTables, counts) -> None:
        self.spark, self.tables, self.stats = spark, tables, counts
        self.key_columns = list(tables.key_columns)
        self.tracer = None  # L4 spans come from the deltalake writer (README "Tracing")

    def path(self, name: str) -> str:
        return self.tables.location(name)

    def exists(self, name: str) -> bool:
        return self.tables.exists(self.spark, name)

    def read(self, name: str, columns: list[str] | None = None, **_: object) -> pa.Table:
        """Table ``name`` as Arrow (``columns`` only, when given; empty when it does not
        exist yet)."""
        if not self.exists(name):
            return pa.table({})
        df = self.tables.read(self.spark, name)
        if columns is not None:
            df = df.select(*[c for c in columns if c in df.columns])
        return df.toArrow()


def delta_on_spark(spark: SparkSession) -> bool:
    """Whether Delta's classes load in ``spark``: on Databricks (classic or serverless),
    on Spark Connect (whose server decides; Connect runs the ``spark`` writer only), or
    in a session with delta-spark's SQL extension or catalog."""
    import os

    from pyspark.sql.utils import is_remote

    if os.environ.get("DATABRICKS_RUNTIME_VERSION") or is_remote():
        return True
    try:
        extensions = spark.conf.get("spark.sql.extensions", "") or ""
        catalog = spark.conf.get("spark.sql.catalog.spark_catalog", "") or ""
    except Exception:  # noqa: BLE001 - a conf that cannot be read is not Delta's
        return False
    return "DeltaSparkSessionExtension" in extensions or "DeltaCatalog" in catalog


def choose_writer(spark: SparkSession, output: OutputConfig) -> str:
    """``output.writer`` with ``auto`` resolved: ``spark`` or ``deltalake``.

    Raises:
        PipelineConfigError: ``spark`` was asked for where Delta's classes do not load,
            or ``deltalake`` on Spark Connect (its driver state cannot travel there).
    """
    from pyspark.sql.utils import is_remote

    from spark_ext.exceptions import PipelineConfigError

    available = delta_on_spark(spark)
    if output.writer == "auto":
        return "spark" if available else "deltalake"
    if output.writer == "spark" and not available:
        raise PipelineConfigError(
            "output.writer: spark needs Delta on Spark: start the session with delta-spark "
            "(spark.jars.packages io.delta:delta-spark_2.13, spark.sql.extensions "
            "io.delta.sql.DeltaSparkSessionExtension) or use output.writer: deltalake")
    if output.writer == "deltalake" and is_remote():
        raise PipelineConfigError("output.writer: deltalake cannot run on Spark Connect "
                                  "(its writes keep state in the driver): use spark")
    return output.writer
