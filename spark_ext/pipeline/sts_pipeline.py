"""Wiring: the whole STS pipeline from one :class:`PipelineConfig`.

Two streaming queries, neither of which waits on the model, plus two driver-side
tickers:

``sts-submit``   events -> L1/L2 tagging -> SubmitBatch (``mapInArrow``) -> ack rows,
                 materialised once per micro-batch (one Spark job): the rule/kb answers
                 of the events L1/L2 answered (they pass through the submission
                 unsent) and a fallback for every refused request in one commit, the
                 ``requests`` table, and the accepted ones handed to the safety net.
``sts-answers``  the sidecar's result rows (:mod:`spark_ext.sources.result_files`) -> the
                 ``results`` table and, statelessly, the answers: ``ok`` -> ``llm``,
                 anything else -> ``fallback``; an ``ok`` row for a request already
                 answered with the fallback (a late result) -> ``backfill``.
safety net       every ``safety_net_interval_s``: accepted requests with no answer by
                 ``deadline + grace`` -> ``fallback`` (``reason = no_result``), also
                 when no result arrives at all (sidecar killed).
maintenance      every ``maintenance.interval_s``: compaction and vacuum of the tables.

With a ``rollout`` mode other than ``full`` (:mod:`spark_ext.l4.rollout`), the submit
query answers the events of the rule arm at once and submits only the model's arm;
``shadow`` results go to the ``shadow_answers`` table (:mod:`spark_ext.l4.shadow`).

Every write is an idempotent Delta append (app transaction = query + batch id), and
the store's ledger keeps one answer row per request (:mod:`spark_ext.l4.answer_store`).
If a query or a ticker dies, the pipeline stops everything and :meth:`StsPipeline.check`
raises :class:`~spark_ext.exceptions.PipelineFailedError` with a one-line reason.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import re
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from sidecar.contract import now_ms
from spark_ext.config import QUERIES, PipelineConfig
from spark_ext.exceptions import PipelineConfigError, PipelineFailedError
from spark_ext.l2 import fast_path
from spark_ext.l2.prompts import build_requests
from spark_ext.l2.template import PromptTemplate
from spark_ext.l4.answer_store import AnswerStore
from spark_ext.l4.answers import (KB_IDS, answers_from_refusals, answers_from_results,
                                  fast_answers, invalid_results, reject_invalid, review_rows)
from spark_ext.l4.counts import PipelineCounts
from spark_ext.l4.rollout import ARM_COLUMN, SHADOW_ATTRIBUTE, rollout_answers, with_arm
from spark_ext.l4.safety_net import KEPT_COLUMNS, SafetyNet, TableSafetyNet, Ticker
from spark_ext.l4.shadow import ShadowAnswers, shadow_mask
from spark_ext.l4.spark_tables import SparkStore, SparkTables, choose_writer
from spark_ext.l4.validation import AnswerValidator
from spark_ext.pipeline.run_ids import is_new_checkpoint, query_run_id
from spark_ext.pipeline.spark_batches import (PIPELINE_ATTRIBUTE, SUBMIT_COLUMN, BatchContext,
                                              ResultBatchWriter, SubmitBatchWriter)
from spark_ext.sources.events import event_source
from spark_ext.sources.kafka import DEAD_LETTER_COLUMN, kafka_lag, split_dead_letters
from spark_ext.sources.results import read_results
from spark_ext.submit.submission import check_sidecars, submit_requests
from spark_ext.tracing import answer_spans
from spark_ext.uris import is_local_uri, local_path, resolve_local

logger = logging.getLogger(__name__)

#: Spark's idle poll interval of a streaming query (``output.idle_poll_ms``).
_POLLING_DELAY = "spark.sql.streaming.pollingDelay"

#: Spark's checkpoint file manager (an internal SQL conf, read when a query starts).
_CHECKPOINT_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
#: The Hadoop ``FileSystem``-based manager, by package across Spark 4.x releases.
_FILESYSTEM_MANAGERS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager",
)

#: Boolean column of the routed submit query: whether the row goes to the sidecar.
_SUBMIT_COLUMN = SUBMIT_COLUMN
#: How far past the longest deadline plus grace each sweep of the ``spark`` writer's
#: safety net looks back (a request whose ack lands that late is still answered).
_SAFETY_NET_LOOKBACK_MS = 120_000
#: The shortest interval between two sweeps of the ``spark`` writer's safety net.
_TABLE_SWEEP_MIN_S = 2.0


#: A line naming an exception, as Python and the JVM print them (``OSError: disk full``).
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?$")


def one_line_reason(e: BaseException) -> str:
    """The most telling line of an error: the last exception line of its text (for a
    failed ``foreachBatch``, the user function's own ``OSError: ...`` rather than Spark's
    "An exception was raised by the Python Proxy"), else its first line.

    Example:
        >>> one_line_reason(RuntimeError("Query failed: Traceback (most recent call last):\\n"
        ...                 '  File "job.py", line 3\\nOSError: disk full\\n at org.apache.X'))
        'OSError: disk full'
    """
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    named = [line for line in lines[1:] if _EXCEPTION_LINE.match(line)]
    if named:
        return named[-1]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def local_checkpoint_manager(spark: SparkSession) -> str | None:
    """The class of Spark's ``FileSystem``-based checkpoint manager, if this Spark has one.

    On a local folder it writes a query's offset and commit logs with the same
    write-then-rename as Spark's default (``FileContext``-based) manager, in about a
    third of the time (measured on Spark 4.3, 2 cores: 15 against 50 ms per log
    write), which every micro-batch pays twice. ``None`` when the user chose a
    manager (the conf is set) or no known class loads.
    """
    if spark.conf.get(_CHECKPOINT_MANAGER, None):
        return None
    try:
        jvm = spark.sparkContext._jvm  # Spark Connect has no JVM gateway here
    except Exception:  # noqa: BLE001 - then Spark keeps its own manager
        return None
    for name in _FILESYSTEM_MANAGERS:
        try:
            jvm.java.lang.Class.forName(name)
            return name
        except Exception:  # noqa: BLE001 - absent in this Spark, or no JVM gateway
            continue
    return None


def _await_sources(query: StreamingQuery, timeout_s: float = 60.0) -> None:
    """Wait until ``query`` has initialised its sources (or stopped, or ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while query.isActive and time.monotonic() < deadline:
        if not str(query.status.get("message", "")).startswith("Initializing"):
            return  # past "Initializing StreamExecution" and "Initializing sources"
        time.sleep(0.1)


class StsPipeline:
    """Builds and runs the STS queries on a SparkSession.

    Usage::

        pipeline = StsPipeline(spark, PipelineConfig.from_yaml("conf/pipeline.yaml"))
        pipeline.start()
        pipeline.await_termination(timeout_s=600)   # raises if a part died
        pipeline.stop()
    """

    def __init__(self, spark: SparkSession, config: PipelineConfig) -> None:
        self.spark = spark
        self.config = config
        self.template = PromptTemplate(stable=config.template.stable,
                                       dynamic=config.template.dynamic)
        out = config.output
        # Tags this pipeline's requests; stable across restarts of the same checkpoints.
        self.pipeline_id = hashlib.sha1(
            resolve_local(out.checkpoint_dir, Path.cwd()).encode()).hexdigest()[:12]
        self.run_ids: dict[str, str] = {}
        """Query -> its run id (:mod:`spark_ext.pipeline.run_ids`), set when it starts."""
        self.writer = choose_writer(spark, out)
        """Who writes the tables: ``spark`` (Delta on Spark) or ``deltalake``."""
        self.validator = AnswerValidator(config.validation)
        self.counts = PipelineCounts()
        """What the pipeline wrote since it started (:mod:`spark_ext.l4.counts`)."""
        self.fast_path_stats = fast_path.FastPathStats()
        """Routes and retrieval hits of L1/L2 since start (empty when both are off)."""
        answers_cfg = config.answers
        if self.writer == "spark":
            self.tables = SparkTables(out, tuple(config.tagging.key_columns))
            self.store = SparkStore(spark, self.tables, self.counts)
            longest = max(config.tagging.sla_ms.values()) + answers_cfg.grace_ms
            self.safety_net = TableSafetyNet(
                spark, self.tables, grace_ms=answers_cfg.grace_ms,
                fallback_text=answers_cfg.fallback_text,
                lookback_ms=longest + _SAFETY_NET_LOOKBACK_MS,
                first_lookback_ms=int(answers_cfg.ledger_horizon_s * 1000))
            self.shadow = None
        else:
            self.store = AnswerStore(out.out_dir, key_columns=config.tagging.key_columns,
                                     ledger_horizon_s=answers_cfg.ledger_horizon_s,
                                     storage_options=out.storage_options or None)
            self.store.tracer = answer_spans()  # L4 spans; None unless OTEL_* switch them on
            self.shadow = ShadowAnswers(self.store, horizon_s=answers_cfg.ledger_horizon_s)
            """The ``shadow_answers`` table (rollout ``shadow``, :mod:`spark_ext.l4.shadow`)."""
            self.safety_net = SafetyNet(self.store, grace_ms=answers_cfg.grace_ms,
                                        fallback_text=answers_cfg.fallback_text,
                                        app_id=f"sts-safety-net-{self.pipeline_id}/answers")
        self.queries: list[StreamingQuery] = []
        self.tickers: list[Ticker] = []
        self.metrics = None
        """The Prometheus exporter (:class:`~spark_ext.pipeline.metrics.PipelineMetrics`) when
        ``output.metrics_port`` is set; ``metrics_port`` is the port it serves."""
        self.metrics_port: int | None = None
        self.failure: str | None = None
        self._stopping = threading.Event()
        self.source = event_source(config)
        """The L0 reader of ``source.format`` (:mod:`spark_ext.sources.events`)."""
        folders = [config.sidecar.results_dir, out.out_dir, out.checkpoint_dir]
        if folder := self.source.local_folder():
            folders.append(folder)  # Spark's file source needs it to exist
        for d in folders:
            if is_local_uri(d):
                local_path(d).mkdir(parents=True, exist_ok=True)

    def _app_id(self, query: str, table: str) -> str:
        """Delta app-transaction id of ``query``'s writes to ``table``: its run id,
        stable across restarts of its checkpoint and new when the checkpoint starts over
        (so a reset checkpoint's batch ids never collide with committed versions)."""
        return f"sts-{query}-{self.run_ids.get(query, self.pipeline_id)}/{table}"

    @property
    def submitted(self) -> int:
        """Requests this pipeline submitted (ack rows of its micro-batches) since start."""
        return self.counts.submitted

    @property
    def dead_letters(self) -> int:
        """Source records that were not events (the ``dead_letters`` table) since start."""
        return self.counts.dead_letters

    @property
    def validation_failures(self) -> collections.Counter:
        """Answers replaced by the fallback since start, per validation rule."""
        return self.counts.validation_failures

    # -------------------------------------------------------------- DataFrames

    def events(self) -> DataFrame:
        return self.source.read_stream(self.spark)

    def requests(self, events: DataFrame | None = None) -> DataFrame:
        events = events if events is not None else self.events()
        if self.config.features.enabled:  # stream-static join, before the L1 rules
            from spark_ext.l2.features import join_features

            events = join_features(events, self.config.features, self.spark,
                                   self.config.output.storage_options)
        if fast_path.enabled(self.config):  # L1 routing / L2 retrieval: adds `route`
            events = fast_path.apply_fast_path(events, self.config)
        requests = build_requests(events, self.config.tagging, self.template)
        if self.config.rollout.mode != "full":  # canary/shadow/offline: adds `rollout_arm`
            requests = with_arm(requests, self.config.rollout)
        return requests

    def acks(self, events: DataFrame | None = None) -> DataFrame:
        return submit_requests(self.requests(events), self.config.sidecar,
                               self.config.tagging.key_columns,
                               {PIPELINE_ATTRIBUTE: self.pipeline_id},
                               traceparent_column=self.config.tagging.traceparent)

    def results(self) -> DataFrame:
        return read_results(self.spark, self.config)

    # -------------------------------------------------------------- batch writers

    def _write_submitted(self, batch: DataFrame, batch_id: int) -> None:
        """Every event went to the sidecar: record the ack rows (one materialisation)."""
        self._record_acks(batch.toArrow(), batch_id, answers=[])

    def _record_acks(self, table: pa.Table, batch_id: int, *, answers: list[dict]) -> None:
        """Answers first (``answers`` plus a fallback for every refusal, one Delta
        commit), then the ``requests`` table; the accepted requests go to the safety net."""
        self.counts.submitted += table.num_rows
        answers_cfg = self.config.answers
        refusals = table
        if table.num_rows and ARM_COLUMN in table.column_names:  # shadow: answered (rule)
            shadow = pc.fill_null(pc.equal(table.column(ARM_COLUMN), "shadow"), False)
            self.shadow.record_refusals(table.filter(shadow),
                                        fallback_text=answers_cfg.fallback_text,
                                        app_id=self._app_id("submit", "shadow"), version=batch_id)
            refusals = table.filter(pc.invert(shadow))
        answers = answers + answers_from_refusals(
            refusals, key_columns=self.config.tagging.key_columns,
            fallback_text=answers_cfg.fallback_text)
        if answers:
            self.store.record_answers(answers, app_id=self._app_id("submit", "answers"),
                                      version=batch_id)
        if table.num_rows == 0:
            return
        self.store.append("requests", table, app_id=self._app_id("submit", "requests"),
                          version=batch_id)
        accepted = refusals.filter(pc.fill_null(refusals.column("accepted"), False))
        keep = [c for c in (*KEPT_COLUMNS, *self.config.tagging.key_columns)
                if c in accepted.column_names]
        self.safety_net.watch(accepted.select(list(dict.fromkeys(keep))).to_pylist())

    def _routed_acks(self, events: DataFrame | None = None) -> DataFrame:
        """L1/L2 or a rollout mode on: every request row, with ack columns where it was
        submitted (route ``llm``, and the ``llm``/``shadow`` arm) and null ones where it
        was not, from one ``mapInArrow`` (:func:`~spark_ext.submit.submission.submit_requests`)."""
        from pyspark.sql import functions as F

        requests = self.requests(events)
        chosen = F.col("route") == "llm" if "route" in requests.columns else F.lit(True)
        if DEAD_LETTER_COLUMN in requests.columns:  # not an event: never submitted
            chosen = chosen & F.col(DEAD_LETTER_COLUMN).isNull()
        extra = {PIPELINE_ATTRIBUTE: self.pipeline_id}
        if ARM_COLUMN in requests.columns:
            chosen = chosen & F.col(ARM_COLUMN).isin("llm", "shadow")
            if self.config.rollout.mode == "shadow":
                extra[SHADOW_ATTRIBUTE] = "1"
        carried = [*self.config.tagging.key_columns,
                   *([KB_IDS] if KB_IDS in requests.columns else [])]
        requests = requests.withColumn(_SUBMIT_COLUMN, F.coalesce(chosen, F.lit(False)))
        return submit_requests(requests, self.config.sidecar, carried, extra,
                               traceparent_column=self.config.tagging.traceparent,
                               submit_when=_SUBMIT_COLUMN)

    def _write_routed(self, batch: DataFrame, batch_id: int) -> None:
        """L1/L2 on: events routed ``rule``/``drop``/``kb`` are answered at once, ``llm``
        ones were submitted in the same job (:meth:`_routed_acks`). With a rollout
        mode, ``rule``/``shadow`` arm events get the rule answer at once (``shadow``
        ones were submitted too, :mod:`spark_ext.l4.rollout`). Records that are not
        events (a Kafka source's dead letters) go to the ``dead_letters`` table. One
        Spark job, one commit to ``answers`` and one to ``requests`` per micro-batch."""
        table, dead = split_dead_letters(batch.toArrow(), now_ms=now_ms())
        if dead.num_rows:
            self._record_dead_letters(dead, batch_id)
        if table.num_rows == 0:
            return
        keys = self.config.tagging.key_columns
        answers: list[dict] = []
        if fast_path.enabled(self.config):
            self.fast_path_stats.add(table)
            direct = table.filter(pc.fill_null(pc.not_equal(table.column("route"), "llm"), True))
            answers += fast_answers(direct.to_pylist(), key_columns=keys,
                                              rule_text=self.config.routing.rule_text)
        if ARM_COLUMN in table.column_names:
            held = table.filter(pc.fill_null(
                pc.is_in(table.column(ARM_COLUMN), pa.array(["rule", "shadow"])), False))
            answers += rollout_answers(held.to_pylist(), mode=self.config.rollout.mode,
                                       key_columns=keys,
                                       rule_text=self.config.answers.fallback_text)
        submitted = table.filter(pc.fill_null(table.column(_SUBMIT_COLUMN), False))
        dropped = [c for c in (_SUBMIT_COLUMN, *fast_path.KB_ONLY_COLUMNS)
                   if c in table.column_names]
        self._record_acks(submitted.drop_columns(dropped), batch_id, answers=answers)

    def _record_dead_letters(self, dead: pa.Table, batch_id: int) -> None:
        """Records that are not events: kept with their bytes, offset and reason, counted,
        logged (the first ones, then every 1000th); never answered, never submitted."""
        if self.store.append("dead_letters", dead, app_id=self._app_id("submit", "dead-letters"),
                             version=batch_id):
            before = self.dead_letters
            self.counts.dead_letters += dead.num_rows
            if before < 10 or before // 1000 != self.dead_letters // 1000:
                first = dead.slice(0, 1).to_pylist()[0]
                logger.warning("Dead letters: %d record(s) are not events (%s, offset %s: %s); "
                               "%d so far, in the dead_letters table.", dead.num_rows,
                               first["topic"], first["offset"], first["error"],
                               self.dead_letters)

    def _write_results(self, batch: DataFrame, batch_id: int) -> None:
        table = batch.toArrow()
        if table.num_rows and not pc.all(pc.is_valid(table.column("status"))).as_py():
            unreadable = table.filter(pc.invert(pc.is_valid(table.column("status"))))
            logger.warning("Skipping %d result record(s) that do not parse (request ids %s); "
                           "their requests get the safety net's fallback.", unreadable.num_rows,
                           unreadable.column("request_id").to_pylist()[:5])
            table = table.filter(pc.is_valid(table.column("status")))
        if table.num_rows:  # results of other pipelines sharing the folder are not ours
            mine = pc.equal(pc.map_lookup(table.column("attributes"), PIPELINE_ATTRIBUTE,
                                          "first"), self.pipeline_id)
            table = table.filter(pc.fill_null(mine, False))
        if table.num_rows and pc.any(shadow := shadow_mask(table)).as_py():  # never served
            self.shadow.record_results(table.filter(shadow), check=self.validator.check,
                                       fallback_text=self.config.answers.fallback_text,
                                       app_id=self._app_id("answers", "shadow"),
                                       version=batch_id)
            table = table.filter(pc.invert(shadow))
        if table.num_rows == 0:
            return
        keys, fallback = self.config.tagging.key_columns, self.config.answers.fallback_text
        invalid = invalid_results(table, self.validator.check)
        late = pc.fill_null(table.column("late"), False) if "late" in table.column_names \
            else pa.array([False] * table.num_rows)
        terminal = table.filter(pc.invert(late))
        # The answers first: they are what a reader waits for.
        self.store.record_answers(
            reject_invalid(answers_from_results(terminal, key_columns=keys,
                                                fallback_text=fallback), invalid, fallback),
            app_id=self._app_id("answers", "answers"), version=batch_id)
        self.store.append("results", table, app_id=self._app_id("answers", "results"),
                          version=batch_id)
        if invalid:  # a person looks at them; a late invalid answer never backfills
            self.counts.validation_failures.update(invalid.values())
            logger.warning("Output validation: %d answers replaced by the fallback (%s).",
                           len(invalid), dict(collections.Counter(invalid.values())))
            self.store.append("review_queue", review_rows(
                table, invalid, key_columns=keys, fallback_text=fallback, now_ms=now_ms()),
                app_id=self._app_id("answers", "review"), version=batch_id)
            ok_invalid = pc.and_(pc.equal(table.column("status"), "ok"),
                                 pc.is_in(table.column("request_id"),
                                          pa.array(list(invalid), pa.string())))
            table = table.filter(pc.invert(pc.fill_null(ok_invalid, False)))
        self.store.backfill(table)

    # -------------------------------------------------------------- lifecycle

    def _start(self, df: DataFrame, query: str, write: object) -> StreamingQuery:
        """Start ``df`` as query ``sts-<query>`` with its checkpoint and trigger."""
        writer = (df.writeStream.queryName(f"sts-{query}").foreachBatch(write)
                  .option("checkpointLocation", self.config.output.checkpoint(query)))
        seconds = self.config.output.triggers[query]
        if seconds > 0:
            writer = writer.trigger(processingTime=f"{seconds} seconds")
        # A query copies the session's conf when it starts: set ours for our queries only.
        confs = {_POLLING_DELAY: f"{self.config.output.idle_poll_ms}ms"}
        if is_local_uri(self.config.output.checkpoint_dir) and (
                manager := local_checkpoint_manager(self.spark)):
            confs[_CHECKPOINT_MANAGER] = manager
        previous = {k: self.spark.conf.get(k, None) for k in confs}
        for k, v in list(confs.items()):
            try:
                self.spark.conf.set(k, v)
            except Exception as e:  # noqa: BLE001 - a server (Connect) that keeps its own
                logger.info("Keeping the session's %s (%s).", k, one_line_reason(e))
                del previous[k]
        try:
            return writer.start()
        finally:
            for k, v in previous.items():
                if v is None:
                    self.spark.conf.unset(k)
                else:
                    self.spark.conf.set(k, v)

    def start(self, *, events: DataFrame | None = None) -> list[StreamingQuery]:
        """Start the queries and the tickers (``events`` overrides the configured source).

        With the ``deltalake`` writer, first the ledger of recent answers and the safety
        net are refilled from the tables, so a restart neither answers twice nor forgets
        a request; the ``spark`` writer keeps no such state (its MERGE and its safety net
        ask the tables).
        """
        publish = self.config.answers.topic is not None
        for query in QUERIES if publish else ("submit", "answers"):
            self.run_ids[query] = query_run_id(self.spark, self.config.output.checkpoint(query))
        if self.writer == "spark":
            self.tables.create_answer_tables(self.spark)
        else:
            self.store.create_answers_table()
            self.store.load_ledger()
        if publish:  # the last version written before this start
            self._answers_version = self._table_version("answers")
            self.shadow.load()
            self.safety_net.watch(self.store.unanswered_requests())
        if self.config.sidecar.check_at_start:
            self.check_sidecars()
        if (port := self.config.output.metrics_port) is not None:
            from spark_ext.pipeline.metrics import PipelineMetrics

            self.metrics = PipelineMetrics(self)
            self.spark.streams.addListener(self.metrics)
            self.metrics_port = self.metrics.serve(port, self.config.output.metrics_addr)
            logger.info("Spark-side metrics on http://%s:%d/metrics",
                        self.config.output.metrics_addr, self.metrics_port)
        submit_write, results_write = self._batch_writers()
        # The answers query first: its results source starts a Python worker that must
        # connect back within Spark's fixed timeout, which L1/L2's start (model loads in
        # every worker) can exceed on a busy machine.
        answers = self._start(self.results(), "answers", results_write)
        try:
            _await_sources(answers)
            if self._routed():
                if fast_path.enabled(self.config):
                    fast_path.warm_up(self.spark, self.config)
                self._warm_up_plan()
                submit = self._start(self._routed_acks(events), "submit", submit_write)
            else:
                submit = self._start(self.acks(events), "submit", submit_write)
        except BaseException:
            answers.stop()
            raise
        self.queries = [submit, answers]
        if publish:
            try:
                self.queries.append(self._start_publisher())
            except BaseException:
                for q in self.queries:
                    q.stop()
                raise
        self.tickers = [
            Ticker("sts-safety-net", self._safety_net_interval_s(), self.safety_net.sweep),
            Ticker("sts-maintenance", self.config.maintenance.interval_s, self._maintain),
            Ticker("sts-health", 0.5, self._watch_health),
        ]
        for t in self.tickers:
            t.start()
        return self.queries

    def _start_publisher(self) -> StreamingQuery:
        """``sts-publish``: the answers' change feed -> the answers topic
        (:mod:`spark_ext.l4.answers_topic`); needs Delta on Spark to read the feed."""
        from spark_ext.l4.answers_topic import AnswerPublisher
        from spark_ext.l4.spark_tables import SparkTables, delta_on_spark

        if not delta_on_spark(self.spark):
            raise PipelineConfigError("answers.topic needs Delta on Spark (delta-spark) to "
                                      "read the answers' change feed")
        tables = SparkTables(self.config.output, tuple(self.config.tagging.key_columns))
        # A new checkpoint starts at the table's current version, published from the
        # next one on (Delta refuses a starting version past the latest); a checkpoint
        # that exists resumes from its own offsets.
        skip_through = None
        if is_new_checkpoint(self.spark, self.config.output.checkpoint("publish")):
            skip_through = self._answers_version
        reader = (self.spark.readStream.format("delta").option("readChangeFeed", "true")
                  .option("startingVersion", str(self._answers_version)))
        changes = (reader.table(tables.location("answers")) if tables.by_name("answers")
                   else reader.load(tables.location("answers")))
        publisher = AnswerPublisher(
            topic=self.config.answers.topic, producer_config=self.config.kafka.producer_config(),
            run_id=self.run_ids["publish"], key_columns=tuple(self.config.tagging.key_columns),
            skip_through=skip_through)
        self._publisher = publisher  # closed when the pipeline stops (classic sessions)
        return self._start(changes, "publish", publisher)

    def _table_version(self, name: str) -> int:
        """The latest version of table ``name`` (Delta's history, through Spark)."""
        tables = SparkTables(self.config.output, tuple(self.config.tagging.key_columns))
        return int(self.spark.sql(f"DESCRIBE HISTORY {tables.ref(name)} LIMIT 1")
                   .collect()[0]["version"])

    def _routed(self) -> bool:
        """Whether the submit query passes some rows through unsent (L1/L2 answers them,
        a rollout mode holds them, or the source has dead letters)."""
        return (fast_path.enabled(self.config) or self.config.rollout.mode != "full"
                or self.source.has_dead_letters)

    def _batch_writers(self):
        """The ``foreachBatch`` functions of the submit and answers queries: with the
        ``spark`` writer plain objects that carry configuration only (they may run in
        Spark Connect's server), with ``deltalake`` this pipeline's own methods."""
        if self.writer != "spark":
            return (self._write_routed if self._routed() else self._write_submitted,
                    self._write_results)
        answers = self.config.answers
        ctx = BatchContext(
            tables=self.tables, pipeline_id=self.pipeline_id,
            app_ids={q: f"sts-{q}-{run}" for q, run in self.run_ids.items()},
            fallback_text=answers.fallback_text, rule_text=self.config.routing.rule_text,
            rollout_mode=self.config.rollout.mode, validation=self.config.validation,
            counts=self.counts,
            fast_path_stats=self.fast_path_stats if fast_path.enabled(self.config) else None)
        return SubmitBatchWriter(ctx), ResultBatchWriter(ctx)

    def _safety_net_interval_s(self) -> float:
        """``answers.safety_net_interval_s``; with the ``spark`` writer each sweep is a
        Spark query, so at least :data:`_TABLE_SWEEP_MIN_S`."""
        interval = self.config.answers.safety_net_interval_s
        return max(interval, _TABLE_SWEEP_MIN_S) if self.writer == "spark" else interval

    def _maintain(self) -> None:
        maintenance = self.config.maintenance
        if self.writer == "spark":
            from spark_ext.config import TABLE_NAMES
            from spark_ext.l4.answers import hours_between

            now = now_ms()
            self.tables.maintain(self.spark, TABLE_NAMES, hours_between(now - 3_600_000, now),
                                 vacuum_retention_hours=maintenance.vacuum_retention_hours)
        else:
            self.store.maintain(vacuum_retention_hours=maintenance.vacuum_retention_hours)

    def _warm_up_plan(self) -> None:
        """Run the submit query's request plan once over one all-null event read the way
        the source reads its events (:meth:`~spark_ext.sources.events.EventSource.warm_up_events`;
        file sources: a file written once per format and schema into
        ``<checkpoint_dir>/plan-warm-up/<format>-<hash>`` and reused, never overwritten
        or deleted), writing nothing (``noop``) and submitting nothing, so Spark
        compiles its generated code before the first micro-batch instead of in it
        (measured: the first micro-batch's job 2.0 s -> 0.28 s with L1/L2). A failure is
        logged and skipped, never fatal."""
        src = self.config.source
        tag = hashlib.sha1(src.schema.encode()).hexdigest()[:10]
        folder = self.config.output.checkpoint(f"plan-warm-up/{src.format}-{tag}")
        started = time.monotonic()
        try:
            events = self.source.warm_up_events(self.spark, folder)
            if events is None:
                return
            self.requests(events).write.format("noop").mode("overwrite").save()
        except Exception as e:  # only a warm-up: the first micro-batch compiles instead
            logger.warning("Plan warm-up skipped: %s", one_line_reason(e))
            return
        logger.info("Submit plan warmed up in %.1f s.", time.monotonic() - started)

    def kafka_lag(self) -> dict[str, dict[str, int]]:
        """Per query, the records of each Kafka topic partition it has not read yet, at
        its last micro-batch (``"topic/partition" -> records``; empty for other sources)."""
        out: dict[str, dict[str, int]] = {}
        for q in self.queries:
            progress = q.lastProgress or {}
            lag = {f"{t}/{p}": n for source in progress.get("sources", [])
                   for (t, p), n in kafka_lag(source).items()}
            if lag:
                out[q.name] = lag
        return out

    def check_sidecars(self) -> list[dict]:
        """Ask from the executors' Python tasks whether their sidecar serves; log the
        answer (see :attr:`~spark_ext.config.SidecarEndpointConfig.check_at_start`)."""
        started = time.monotonic()
        rows = check_sidecars(self.spark, self.config.sidecar)
        down = [r for r in rows if not r["serving"]]
        for r in down:
            logger.warning("Sidecar %s is not serving for task %d%s: its requests get the "
                           "fallback until it is.", r["endpoint"], r["partition"],
                           f" ({r['error']})" if r["error"] else "")
        logger.info("Sidecar check from %d task(s): %d serving (%.1f s).", len(rows),
                    len(rows) - len(down), time.monotonic() - started)
        return rows

    def _watch_health(self) -> None:
        """Stop everything when one part died (a query with nobody reading answers
        must not go on submitting)."""
        if self.failure is None and (why := self._find_failure()):
            self.failure = why
            logger.error("sts pipeline stopping: %s", why)
            threading.Thread(target=self.stop, name="sts-stop", daemon=True).start()

    def _find_failure(self) -> str | None:
        for q in self.queries:
            if (e := q.exception()) is not None:
                return f"query {q.name} failed: {one_line_reason(e)}"
            if not q.isActive and not self._stopping.is_set():
                return f"query {q.name} stopped"
        for t in self.tickers:
            if t.error is not None:
                return f"{t.name} failed: {one_line_reason(t.error)}"
        return None

    def check(self) -> None:
        """Raise :class:`PipelineFailedError` if a query or a ticker has died."""
        why = self.failure or self._find_failure()
        if why:
            self.failure = why
            raise PipelineFailedError(why)

    def await_termination(self, timeout_s: float | None = None) -> None:
        """Run until ``timeout_s`` passes (``None``: until stopped); raise on failure."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._stopping.is_set():
            self.check()
            if deadline is not None and time.monotonic() >= deadline:
                return
            time.sleep(0.5)
        self.check()

    def process_all_available(self) -> None:
        """Let every query process what is there (Spark's ``processAllAvailable()``), then
        raise if a part died. The safety net runs on its own ticker, not here."""
        for q in self.queries:
            q.processAllAvailable()
        self.check()

    def stop(self) -> None:
        """Stop the tickers and the queries. Idempotent."""
        self._stopping.set()
        for t in self.tickers:
            t.stop()
        for t in self.tickers:  # a sweep under way ends before the queries and Spark do
            if t is not threading.current_thread():
                t.join(timeout=60)
        for q in self.queries:
            try:
                q.stop()
            except Exception:  # stopping a failed query may raise again
                logger.debug("Stopping %s raised.", q.name, exc_info=True)
        if (publisher := getattr(self, "_publisher", None)) is not None:
            publisher.close()
        if self.store.tracer is not None:
            self.store.tracer.flush()
        if self.metrics is not None:
            try:
                self.spark.streams.removeListener(self.metrics)
            except Exception:  # the session may be gone already
                logger.debug("Removing the metrics listener raised.", exc_info=True)
            self.metrics.close()
            self.metrics = None
