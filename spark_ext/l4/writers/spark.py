"""Delta on Spark (``output.writer: spark``): the executors write the tables, the driver
only coordinates, and nothing here keeps state between micro-batches, so the
``foreachBatch`` function that uses it runs on Spark Connect too (in the server's Python
process).

- **Appends are idempotent by Delta's own transaction ids** (``txnAppId`` = the query's
  run id and table, ``txnVersion`` = the batch id; PySpark's ``foreachBatch`` recipe):
  a re-run micro-batch is skipped by Delta. The answers' common case is such a blind
  append; nothing reads the table for it.
- **A MERGE only for the rare backfill** (and for a request the ledger no longer
  remembers): pruned to the rows' ``enqueue_hour`` partitions and ``enqueue_ts`` range
  (appends are written in time order, so Delta's file statistics skip every older
  file), so its cost does not grow with the table.
- **Tables by path or by catalog name** (``output.tables``), created with the documented
  columns, partitioned by ``enqueue_hour``, deletion vectors off (``deltalake`` cannot
  read them), file statistics on the time columns only (:data:`STATS_COLUMNS`) and the
  change data feed on for ``answers`` (the answers topic reads it)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType
from pyspark.sql.window import Window

from spark_ext.config import TABLE_NAMES
from spark_ext.l4.answers import PARTITION, answer_schema
from spark_ext.l4.ledger import RECORD, SHADOW_ANSWERS, STATS
from spark_ext.l4.replays import HISTORY_LOOKBACK, append_marker, last_marked
from spark_ext.l4.writers.base import BatchFrames, TableWriter
from spark_ext.schemas import spark_schema
from spark_ext.uris import is_local_uri

logger = logging.getLogger(__name__)

#: Delta checkpoints a table's log inside the commit whose version is a multiple of
#: ``delta.checkpointInterval``: with Delta's default, 10, one answers micro-batch in ten
#: took 2.3-3.3 s instead of 0.3-0.4 s (200 events/s, 2 cores), and the model's answers
#: of the next micro-batch waited for it. At 100 that append comes ten times less often,
#: and a reader that opens the table replays up to 99 small JSON commits (measured: +0.06
#: s for a Spark read, +0.015 s for delta-rs, on local disk). Writing the checkpoints from
#: a driver thread instead was tried: its Spark jobs took the task slots of both queries
#: and cost more than it saved on 2 cores (measured, not kept).
CHECKPOINT_INTERVAL = 100
#: Table properties of every table the writer creates: deletion vectors off (``deltalake``
#: reads the tables too), Delta's auto compaction on, so the one writer of a table
#: compacts the partition it just wrote once it holds enough small files (a post-commit
#: step of that same write: no second writer, nothing to conflict with), and the log
#: checkpointed every :data:`CHECKPOINT_INTERVAL` commits.
TABLE_PROPERTIES = {"delta.enableDeletionVectors": "false",
                    "delta.autoOptimize.autoCompact": "true",
                    "delta.checkpointInterval": str(CHECKPOINT_INTERVAL)}
#: The table property naming the columns Delta keeps file statistics (min, max, nulls)
#: on, for data skipping.
STATS_PROPERTY = "delta.dataSkippingStatsColumns"
#: Per table, its time columns: the only ones file statistics skip files by here
#: (appends come in time order; an id or a label spans every file), ``enqueue_ts`` among
#: them for the backfill MERGE. Delta's default, the first 32 columns, made each
#: micro-batch's append of the answers 20-25 % slower (the strings' statistics computed
#: and kept for nothing; measured on 2 cores).
STATS_COLUMNS = {
    "answers": ("enqueue_ts", "answered_ts"), SHADOW_ANSWERS: ("enqueue_ts", "answered_ts"),
    "requests": ("enqueue_ts", "submit_ts"), "results": ("enqueue_ts", "finish_ts"),
    "dead_letters": ("enqueue_ts", "dead_lettered_ts"),
    "review_queue": ("enqueue_ts", "flagged_ts"),
}
#: Properties by which an owner chose what Delta keeps statistics on (kept when set).
_STATS_CHOICES = (STATS_PROPERTY, "delta.dataSkippingNumIndexedCols")
#: Settings of the answers query, which makes every commit: no version checksum
#: (``<version>.crc``, optional in Delta's protocol, written after each commit since Delta
#: 4.0 for readers to validate the log against and to find protocol and metadata
#: without reading the log). Computing and writing it was 40-50 ms of each ~250 ms
#: answers append on 2 cores (measured); readers then read
#: protocol and metadata from the log, from its checkpoint on (one per
#: :data:`CHECKPOINT_INTERVAL` commits).
QUERY_CONFS = {"spark.databricks.delta.writeChecksumFile.enabled": "false"}
#: Of :data:`TABLE_PROPERTIES` and :data:`STATS_PROPERTY`, those a table of the pipeline
#: made without them gets at start: property -> (what it is, for the log; whether a
#: value its owner set is kept).
ALIGNED_PROPERTIES = {
    "delta.autoOptimize.autoCompact": ("auto compaction on", False),
    "delta.checkpointInterval": (f"a log checkpoint every {CHECKPOINT_INTERVAL} commits", True),
    STATS_PROPERTY: ("file statistics on its time columns only", True),
}
#: ... and of the ``answers`` and ``shadow_answers`` tables besides.
ANSWER_TABLE_PROPERTIES = {**TABLE_PROPERTIES, "delta.enableChangeDataFeed": "true"}


def hour_column(epoch_ms: str = "enqueue_ts") -> Column:
    """The UTC hour of an epoch-ms column, ``YYYY-MM-DDTHH`` (the tables' partition),
    whatever the session's time zone (:func:`spark_ext.l4.answers.hour_of` in Spark)."""
    utc = F.to_utc_timestamp(F.timestamp_millis(F.col(epoch_ms)), F.current_timezone())
    return F.date_format(utc, "yyyy-MM-dd'T'HH")


def stats_columns(name: str, columns: list[str]) -> str | None:
    """:data:`STATS_PROPERTY`'s value for table ``name`` with ``columns``: its
    :data:`STATS_COLUMNS` that it has (``None`` for none: Delta's default then)."""
    chosen = [c for c in STATS_COLUMNS.get(name, ("enqueue_ts",)) if c in columns]
    return ",".join(chosen) or None


def _sql_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class SparkWriter(TableWriter):
    """Delta on Spark. Holds configuration only (it travels to Spark Connect's server
    with the ``foreachBatch`` function); the session comes with each DataFrame.

    Args:
        output: The ``output`` section (``out_dir``, ``tables``).
        key_columns: The event's key columns (kept in ``answers`` as strings).
    """

    name = "spark"
    runs_on_connect = True
    records_interval_s = 10.0
    writes_with_spark = True
    query_confs = QUERY_CONFS

    def __init__(self, output: Any, key_columns: tuple[str, ...]) -> None:
        super().__init__(output, key_columns)
        self._appended: dict[str, int] = {}
        """The last batch this object appended (or found appended) per app id."""
        self._reader: Any = None
        """Reads local tables from their files (:meth:`read`); made on first use."""

    @classmethod
    def available(cls, spark: SparkSession) -> bool:
        return delta_on_spark(spark)

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
        from spark_ext.session import connect_errors_expected

        try:
            with connect_errors_expected():  # on Connect, "no table" is logged as an error
                spark.sql(f"DESCRIBE DETAIL {self.ref(name)}").collect()
        except Exception:  # noqa: BLE001 - no table there (yet)
            return False
        return True

    def create_tables(self, spark: SparkSession,
                      names: tuple[str, ...] = ("answers", SHADOW_ANSWERS)) -> None:
        """``answers`` and ``shadow_answers`` with their columns, partitioning and
        properties, unless they exist (a table of another shape at that place is left
        alone and the first write then says what is wrong); auto compaction and the
        checkpoint interval set on every table of the pipeline made without them."""
        fields = spark_schema(answer_schema(self.key_columns)).fields
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in fields)
        for name, extra in (("answers", ""), (SHADOW_ANSWERS, ", `model_text` string")):
            if name not in names:
                continue
            wanted = {**ANSWER_TABLE_PROPERTIES,
                      STATS_PROPERTY: stats_columns(name, [f.name for f in fields])}
            props = ", ".join(f"'{k}' = '{v}'" for k, v in wanted.items())
            spark.sql(f"CREATE TABLE IF NOT EXISTS {self.ref(name)} ({columns}{extra}) "
                      f"USING delta PARTITIONED BY (`{PARTITION}`) TBLPROPERTIES ({props})")
        for name, what in self._align_existing(spark, TABLE_NAMES).items():
            logger.info("Table %s: %s (made without).", name, ", ".join(what))

    def table(self, spark: SparkSession, name: str) -> DataFrame:
        if self.by_name(name):
            return spark.read.table(self.output.tables[name])
        return spark.read.format("delta").load(self.output.table(name))

    def read(self, spark: SparkSession, name: str, columns: list[str] | None = None
             ) -> pa.Table:
        """Table ``name`` as Arrow (``columns`` only, when given; empty when it does not
        exist yet)."""
        if not self.by_name(name) and is_local_uri(self.output.out_dir):
            # A local table is read from its files (delta-rs's log, pyarrow): collecting
            # it through Spark holds it all in the driver's JVM heap at once (the
            # summary of an hour at 200 events/s, 720,000 answers, ran out of it).
            return self._files_reader().read(name, columns)
        if not self.exists(spark, name):
            return pa.table({})
        df = self.table(spark, name)
        if columns is not None:
            df = df.select(*[c for c in columns if c in df.columns])
        return df.toArrow()

    def __getstate__(self) -> dict:
        """Configuration and counters only (it travels to Spark Connect's server with the
        answers batch): the reader holds open tables and a lock."""
        return {**self.__dict__, "_reader": None}

    def _files_reader(self) -> Any:
        from spark_ext.l4.answer_store import AnswerStore

        if self._reader is None:
            self._reader = AnswerStore(self.output.out_dir, key_columns=list(self.key_columns))
        return self._reader

    def version(self, spark: SparkSession, name: str) -> int:
        return int(spark.sql(f"DESCRIBE HISTORY {self.ref(name)} LIMIT 1")
                   .collect()[0]["version"])

    # ------------------------------------------------------------------ writes

    def frames(self, batch: DataFrame) -> "SparkFrames":
        return SparkFrames(batch, self.key_columns)

    def count(self, frame: DataFrame) -> int:
        return frame.count()

    def append(self, name: str, frame: DataFrame, *, app_id: str, version: int) -> None:
        """Append ``frame`` to table ``name`` once per ``(app_id, version)``. New columns
        are added to the table.

        **Once**: every append carries ``app_id`` and ``version`` in its commit's
        ``userMetadata`` (:mod:`spark_ext.l4.replays`). A version above the last one this
        object appended (or found appended) for ``app_id`` is new: a query runs its
        batches in order, once each, and only this object writes its app id. Any other
        (the first batch this object sees, after a restart: the one Spark may be running
        again) is first looked up in the table's recent history and skipped when a
        commit already has it; it also goes with Delta's own app transaction
        (``txnAppId``/``txnVersion``), which tables written by earlier versions carry.
        Delta looks an app transaction up in the whole table state (three Spark jobs of
        log replay, ~400 ms of a ~600 ms append on 2 cores, measured), which is why
        only that one batch asks for it.

        A micro-batch's rows are few (seconds of events), so they go out as one file per
        partition hour (``coalesce(1)``: one write task), not one per partition of the
        ledger's output (8): fewer tasks per commit, and 8x fewer small files for the
        auto compaction to rewrite."""
        spark = frame.sparkSession
        last = self._appended.get(app_id)
        follows = last is not None and version > last
        if not follows and version <= self.last_appended(spark, name, app_id):
            logger.info("Table %s already has batch %d of %s (a replayed micro-batch): "
                        "not appended again.", name, version, app_id)
            self._appended[app_id] = version
            return
        writer = (frame.coalesce(1).write.format("delta").mode("append")
                  .option("userMetadata", append_marker(app_id, version))
                  .option("mergeSchema", "true").partitionBy(PARTITION))
        if not follows:
            writer = writer.option("txnAppId", app_id).option("txnVersion", str(version))
        created = {**TABLE_PROPERTIES, STATS_PROPERTY: stats_columns(name, frame.columns)}
        for key, value in created.items():  # used when the append creates the table
            if value is not None:
                writer = writer.option(key, value)
        target = self.output.tables.get(name)
        self._retry(lambda: writer.saveAsTable(target) if target
                    else writer.save(self.output.table(name)), name)
        self._appended[app_id] = version

    def last_appended(self, spark: SparkSession, name: str, app_id: str, *,
                      history: int = HISTORY_LOOKBACK) -> int:
        """The highest batch of ``app_id`` that table ``name``'s last ``history`` commits
        have appended (by their marker, :mod:`spark_ext.l4.replays`); -1 for none (or no
        table). A replayed batch is the last one its query ran, so its commit, if any,
        is among the latest; reading the whole history instead would cost every new
        run (whose app id no commit has) a read of every commit file the table keeps."""
        from spark_ext.session import connect_errors_expected

        try:
            with connect_errors_expected():
                rows = spark.sql(f"DESCRIBE HISTORY {self.ref(name)} LIMIT {int(history)}") \
                    .select("userMetadata").collect()
        except Exception:  # noqa: BLE001 - no table there yet
            return -1
        found = last_marked([r[0] for r in rows], app_id)
        return -1 if found is None else found

    def merge_answers(self, name: str, frame: DataFrame, *, backfill: bool) -> dict[str, int]:
        """Merge answer rows into ``name`` (``answers`` or ``shadow_answers``): insert
        requests that have no row; with ``backfill``, a model's answer (``llm`` or
        ``backfill``) for a request answered with the fallback upgrades it to
        ``backfill``. Several rows for one request become one: the model's answer, as
        a backfill when a fallback came with it."""
        spark = frame.sparkSession
        bounds = frame.agg(F.collect_set(PARTITION).alias("hours"),
                           F.min("enqueue_ts").alias("first"),
                           F.max("enqueue_ts").alias("last")).collect()[0]
        if not bounds["hours"]:
            return {"inserted": 0, "updated": 0}
        source = _one_row_per_request(frame)
        view = f"sts_merge_{uuid.uuid4().hex}"
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
                  "backfilled_at = coalesce(s.backfilled_at, s.answered_ts) "
                  ) if backfill else ""
        statement = (f"MERGE INTO {self.ref(name)} t USING {view} s ON {' AND '.join(on)} "
                     f"{update}WHEN NOT MATCHED THEN INSERT *")
        try:
            metrics = self._retry(lambda: spark.sql(statement).collect(), name)
        finally:
            spark.catalog.dropTempView(view)
        row = metrics[0].asDict() if metrics else {}
        return {"inserted": int(row.get("num_inserted_rows") or 0),
                "updated": int(row.get("num_updated_rows") or 0)}

    def _retry(self, run, table: str):
        """``run()``, tried again (with a short random backoff) while it fails on a
        Delta write conflict (another writer committed to what it read: maintenance,
        or a second pipeline on the same tables); counted in ``conflicts_retried``."""
        import random
        import time

        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                return run()
            except Exception as e:  # noqa: BLE001 - only conflicts are retried
                if attempt == WRITE_ATTEMPTS or not any(c in str(e) for c in _CONFLICTS):
                    raise
                self.conflicts_retried += 1
                logger.info("Write to %s met a concurrent commit (attempt %d); trying again.",
                            table, attempt)
                time.sleep(random.uniform(0.05, 0.2) * attempt)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ upkeep

    def maintain(self, spark: SparkSession, names: tuple[str, ...], hours: list[str], *,
                 vacuum_retention_hours: int | None) -> None:
        """Vacuum files no longer in each table and older than the retention (nothing
        when ``vacuum_retention_hours`` is ``None``).

        Nothing here compacts: the writes do (``delta.autoOptimize.autoCompact``), so no
        second writer rewrites what the streaming writes commit to. A scheduled
        ``OPTIMIZE`` of the open hours from this thread stalled both queries for 2-3
        minutes every cycle at 200 events/s (it rewrote the whole hour each time) and
        collided with the backfill MERGE. ``VACUUM ... LITE`` finds the files to delete
        in the log instead of listing the table, so its cost follows what changed, not
        the table's size; when the log no longer reaches back far enough, a full
        vacuum."""
        if vacuum_retention_hours is None:
            return
        for name in names:
            if not self.exists(spark, name):
                continue
            retain = f"RETAIN {int(vacuum_retention_hours)} HOURS"
            try:
                spark.sql(f"VACUUM {self.ref(name)} LITE {retain}").collect()
            except Exception as e:  # noqa: BLE001 - LITE refused: the log is too short
                logger.info("VACUUM LITE of %s refused (%s); a full vacuum instead.",
                            name, str(e).splitlines()[0][:200])
                spark.sql(f"VACUUM {self.ref(name)} {retain}").collect()

    def _align_existing(self, spark: SparkSession, names: tuple[str, ...]
                        ) -> dict[str, list[str]]:
        """Set :data:`ALIGNED_PROPERTIES` on those of ``names`` that exist without them
        (made by ``deltalake`` or an earlier version; auto compaction is set when it is
        not on, the checkpoint interval and the statistics columns only when the table has
        no choice of its owner's); one metadata commit per table changed, made at start
        before any query writes. Files written before keep the statistics they have.
        Returns table -> what was set."""
        changed = {}
        for name in names:
            if not self.exists(spark, name):
                continue
            props = {r["key"]: r["value"] for r in
                     spark.sql(f"SHOW TBLPROPERTIES {self.ref(name)}").collect()}
            ours = {**TABLE_PROPERTIES,
                    STATS_PROPERTY: stats_columns(name, self.table(spark, name).columns)}
            owners = set(props) | ({STATS_PROPERTY} if any(k in props for k in _STATS_CHOICES)
                                   else set())
            wanted = {key: ours[key] for key, (_, owners_kept) in ALIGNED_PROPERTIES.items()
                      if ours[key] is not None and props.get(key) != ours[key]
                      and not (owners_kept and key in owners)}
            if not wanted:
                continue
            pairs = ", ".join(f"'{k}' = '{v}'" for k, v in wanted.items())
            self._retry(lambda: spark.sql(f"ALTER TABLE {self.ref(name)} SET TBLPROPERTIES "
                                          f"({pairs})").collect(), name)
            changed[name] = [ALIGNED_PROPERTIES[k][0] for k in wanted]
        return changed


#: Delta's optimistic-concurrency conflicts: another writer committed to what this
#: write read.
_CONFLICTS = ("DELTA_CONCURRENT", "ConcurrentAppendException", "ConcurrentDeleteReadException",
              "ConcurrentWriteException", "ConcurrentTransactionException")
#: How often a conflicting write is tried (every write here is idempotent).
WRITE_ATTEMPTS = 8


def _one_row_per_request(answers: DataFrame) -> DataFrame:
    """One row per ``request_id``: the model's answer when there is one (``backfill``
    when a fallback row came with it), else the first fallback."""
    by_id = Window.partitionBy("request_id")
    is_llm = F.col("answer_source").isin("llm", "backfill").cast("int")
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


class SparkFrames(BatchFrames):
    """The ledger's output as DataFrames over one cached copy (computed once)."""

    def __init__(self, batch: DataFrame, key_columns: tuple[str, ...]) -> None:
        self.batch = batch.persist(StorageLevel.MEMORY_AND_DISK)
        self.columns = answer_schema(key_columns).names

    def answers(self, table: str, kind: str) -> DataFrame:
        extra = ["model_text"] if table == SHADOW_ANSWERS else []
        return (self.batch.where((F.col("_kind") == kind) & (F.col("_table") == table))
                .select(*self.columns, *extra))

    def records(self, table: str, schema: StructType) -> DataFrame:
        rows = (self.batch.where((F.col("_kind") == RECORD) & (F.col("_table") == table))
                .select(F.from_json("_payload", schema).alias("r")).select("r.*"))
        return rows.withColumn(PARTITION, hour_column())

    def summary(self) -> list[dict]:
        """One small job: the control columns of every row (the payloads only of the
        rows that are counted, not written), aggregated here."""
        from spark_ext.l4.writers.base import summarize

        counted = (F.col("_kind") == STATS) | F.col("_table").startswith("_")
        rows = self.batch.select(
            "_kind", "_table", "answer_source", "status", "reason",
            F.when(counted, F.col("_payload")).alias("_payload")).toArrow()
        return summarize(rows)

    def release(self) -> None:
        self.batch.unpersist()


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
