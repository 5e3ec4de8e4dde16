"""Wiring: the whole STS pipeline from one :class:`PipelineConfig`.

Two streaming queries, neither of which waits on the model, plus two driver-side
tickers:

``sts-submit``   events -> L1/L2 tagging -> SubmitBatch (``mapInArrow``) -> ack rows.
                 It writes no table: each task leaves its ack rows (accepted, refused,
                 and the events L1/L2 or the rollout answered without the model) on the
                 ack channel (:mod:`spark_ext.submit.ack_channel`), so its micro-batch
                 is the time from an event to the sidecar and nothing more.
``sts-answers``  results + acks + the clock (:mod:`spark_ext.l4.arrivals`) -> the ledger
                 (:mod:`spark_ext.l4.ledger`, a Spark stateful operator keyed by bucket)
                 -> every table, through the writer (:mod:`spark_ext.l4.answers_batch`):
                 the first answer of each request appended, a fallback for an accepted
                 request with no answer by ``deadline + grace`` (also when nothing
                 arrives at all: the clock ticks), a model's late answer merged as the
                 backfill, the ``requests``/``results``/``dead_letters``/``review_queue``
                 records appended. One query writes each table.
maintenance      every ``maintenance.interval_s``: compaction and vacuum of the tables.
health           every 0.5 s: a query or ticker that died stops the pipeline.

With a ``rollout`` mode other than ``full`` (:mod:`spark_ext.l4.rollout`), the submit
query answers the events of the rule arm at once and submits only the model's arm;
``shadow`` results go to the ``shadow_answers`` table.

Every append carries its query's run and batch id as a Delta app transaction, so a
replayed micro-batch writes nothing twice; the ledger's state is in the answers query's
checkpoint, so a restart neither answers twice nor forgets a request. If a query or a
ticker dies, the pipeline stops everything and :meth:`StsPipeline.check` raises
:class:`~spark_ext.exceptions.PipelineFailedError` with a one-line reason.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType

from sidecar.contract import now_ms
from spark_ext.config import QUERIES, REALTIME, REALTIME_PUBLISH, TABLE_NAMES, PipelineConfig
from spark_ext.exceptions import PipelineConfigError, PipelineFailedError
from spark_ext.l2 import fast_path
from spark_ext.l2.template import PromptTemplate
from spark_ext.l4.answers import KB_IDS, hours_between
from spark_ext.l4.answers_batch import AnswersBatch
from spark_ext.l4.arrivals import (PIPELINE_ATTRIBUTE, SUBMIT_COLUMN, record_schemas)
from spark_ext.l4.buckets import MAX_BUCKETS, checkpoint_bucket_keys
from spark_ext.l4.counts import PipelineCounts
from spark_ext.api.inference import LlmInference
from spark_ext.l4.channels import ChannelSide
from spark_ext.l4.rollout import ARM_COLUMN, SHADOW_ATTRIBUTE, with_arm
from spark_ext.l4.validation import AnswerValidator
from spark_ext.pipeline.ticker import Ticker
from spark_ext import storage
from spark_ext.l4.writers import TableWriter, choose_writer
from spark_ext.run_ids import QueryRun, is_new_checkpoint, query_run
from spark_ext.pipeline.executor_warmup import ExecutorWarmup
from spark_ext.pipeline.scaling import (ScaleController, SparkExecutors, pipeline_scale,
                                        scaling_step)
from spark_ext.session import REALTIME_STOP_LOGGERS, is_connect, jvm_loggers_off, task_slots
from spark_ext.sources.events import event_source
from spark_ext.sources.kafka import DEAD_LETTER_COLUMN, kafka_lag
from spark_ext.submit.channel_check import refuse_channel_mismatch, refuse_intake_mismatch
from spark_ext.submit.executor_ready import announce, plugin_loaded
from spark_ext.submit.realtime import REALTIME_BATCH, request_records
from spark_ext.submit.submission import (ack_schema, check_sidecars)
from spark_ext.tracing import answer_spans
from spark_ext.uris import is_local_uri, join_uri, local_path
from spark_ext.worker_pool import warm_up_workers

logger = logging.getLogger(__name__)

#: How often, with the driver's ``/metrics`` on, the executors ask their sidecars for the
#: scale signal (a small Spark job; ``sts_spark_scale``).
SCALE_CHECK_INTERVAL_S = 30.0

#: Spark's idle poll interval of a streaming query (``output.idle_poll_ms``).
_POLLING_DELAY = "spark.sql.streaming.pollingDelay"

#: Spark's checkpoint file manager (an internal SQL conf, read when a query starts).
_CHECKPOINT_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
#: The Hadoop ``FileSystem``-based manager, by package across Spark 4.x releases.
_FILESYSTEM_MANAGERS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager",
)


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


def _progress_ms(progress) -> int:
    """When a micro-batch began (its progress's ``timestamp``, ISO 8601 UTC), epoch ms."""
    import datetime

    stamp = progress["timestamp"].replace("Z", "+00:00")
    return int(datetime.datetime.fromisoformat(stamp).timestamp() * 1000)


class PipelineTables:
    """The pipeline's tables as the demo, the tests and ``/metrics`` read them:
    :meth:`read` returns Arrow, :attr:`stats` the counters of this process's writes."""

    def __init__(self, spark: SparkSession, writer: TableWriter, counts: PipelineCounts) -> None:
        self.spark, self.writer, self.stats = spark, writer, counts

    def path(self, name: str) -> str:
        return self.writer.location(name)

    def exists(self, name: str) -> bool:
        return self.writer.exists(self.spark, name)

    def read(self, name: str, columns: list[str] | None = None) -> pa.Table:
        """Table ``name`` as Arrow (``columns`` only, when given; empty when it does not
        exist yet)."""
        return self.writer.read(self.spark, name, columns)


class StsPipeline:
    """Builds and runs the STS queries on a SparkSession: a preset of
    :class:`~spark_ext.LlmInference` with a source, L1/L2, the tables and their upkeep.

    Usage::

        pipeline = StsPipeline(spark, PipelineConfig.from_yaml("conf/pipeline.yaml"))
        pipeline.start()
        pipeline.await_termination(timeout_s=600)   # raises if a part died
        pipeline.stop()

    Example (built, not started):
        >>> from spark_ext import PipelineConfig
        >>> pipeline = StsPipeline(spark, PipelineConfig.from_dict({
        ...     "source": {"path": str(tmp / "events")},
        ...     "output": {"out_dir": str(tmp / "out"), "checkpoint_dir": str(tmp / "ck")}}))
        >>> len(pipeline.pipeline_id), pipeline.writer
        (12, 'spark')
    """

    def __init__(self, spark: SparkSession, config: PipelineConfig) -> None:
        if config.scaling.enabled and is_connect(spark):
            raise PipelineConfigError(
                "scaling.enabled needs a classic session: on Spark Connect the driver cannot "
                "ask for executors (scale on the sidecars' /metrics signal instead)")
        fast_path.require_modules(config)
        self.spark = spark
        self.config = config = config.with_derived_defaults()
        self.template = PromptTemplate(stable=config.template.stable,
                                       dynamic=config.template.dynamic)
        out = config.output
        self.inference = LlmInference.from_config(spark, config)
        """The requests, the submission and the answers (:class:`~spark_ext.LlmInference`)."""
        self.runs: dict[str, QueryRun] = {}
        """Query -> its run (:mod:`spark_ext.run_ids`), set when it starts."""
        self.tables = choose_writer(spark, out, tuple(config.tagging.key_columns))
        """Who writes the tables (:mod:`spark_ext.l4.writers`)."""
        if self.tables.traces_answers:
            self.tables.tracer = answer_spans()  # L4 spans; None unless OTEL_* switch them on
        self.validator = AnswerValidator(config.validation)
        """The output validation's rules (the answers are checked in the executors)."""
        self.counts = PipelineCounts()
        """What the pipeline wrote since it started (:mod:`spark_ext.l4.counts`)."""
        self.store = PipelineTables(spark, self.tables, self.counts)
        """The tables, to read (:class:`PipelineTables`)."""
        self.fast_path_stats = fast_path.FastPathStats()
        """Routes and retrieval hits of L1/L2 since start (empty when both are off)."""
        self.queries: list[StreamingQuery] = []
        self.tickers: list[Ticker] = []
        self._vacuumed_at = time.monotonic()  # the last vacuum (none yet: the start)
        self.metrics = None
        """The Prometheus exporter (:class:`~spark_ext.pipeline.metrics.PipelineMetrics`) when
        ``output.metrics_port`` is set; :attr:`metrics_port` is the port it serves."""
        self.failure: str | None = None
        self._stopping = threading.Event()
        self._events_by_batch: dict[int, int] = {}
        self.source = event_source(config)
        """The L0 reader of ``source.format`` (:mod:`spark_ext.sources.events`)."""
        folders = [out.out_dir, out.checkpoint_dir]
        if folder := self.source.local_folder():
            folders.append(folder)  # Spark's file source needs it to exist
        for d in folders:
            if is_local_uri(d):
                local_path(d).mkdir(parents=True, exist_ok=True)

    @property
    def pipeline_id(self) -> str:
        """Tags this pipeline's requests, acks and results: its checkpoint folder and the id
        kept in it (:attr:`LlmInference.namespace`), stable across restarts, new when the
        folder is deleted."""
        return self.inference.namespace

    @property
    def channel(self) -> ChannelSide:
        """The Spark side of the result channel (:mod:`spark_ext.l4.channels`)."""
        return self.inference.channel

    @property
    def writer(self) -> str:
        """The tables' writer: ``spark`` (Delta on Spark) or ``deltalake``."""
        return self.tables.name

    @property
    def metrics_port(self) -> int | None:
        """The port the driver's ``/metrics`` is served on (``None``: not served)."""
        return None if self.metrics is None else self.metrics.port

    @property
    def run_ids(self) -> dict[str, str]:
        """Query -> its run id."""
        return {q: run.id for q, run in self.runs.items()}

    def _app_id(self, query: str) -> str:
        """Prefix of the Delta app-transaction ids of ``query``'s writes: its run id,
        stable across restarts of its checkpoint and new when the checkpoint starts over
        (so a reset checkpoint's batch ids never collide with committed versions)."""
        return f"sts-{query}-{self.runs[query].id}"

    @property
    def submitted(self) -> int:
        """Requests this pipeline submitted (the ``requests`` rows it wrote) since start."""
        return self.counts.submitted

    @property
    def dead_letters(self) -> int:
        """Source records that were not events (the ``dead_letters`` table) since start."""
        return self.counts.dead_letters

    @property
    def validation_failures(self) -> collections.Counter:
        """Answers replaced by the fallback since start, per validation rule."""
        return self.counts.validation_failures

    def events_read(self) -> int:
        """Events (source records) the submit query has read since start, from its
        micro-batches' progress."""
        if self.queries:
            for p in self.queries[0].recentProgress:
                self._events_by_batch[p["batchId"]] = p["numInputRows"]
        return sum(self._events_by_batch.values())

    def answers_caught_up(self) -> bool:
        """Whether the answers query has run a micro-batch that began after the submit
        query's last micro-batch with input ended: it has then read every ack that batch
        left (until then an event's request may be missing from :attr:`open_requests`:
        its result can arrive before its ack)."""
        if len(self.queries) < 2:
            return False
        submit, answers = self.queries[0], self.queries[1]
        ended = [_progress_ms(p) + int((p["durationMs"] or {}).get("triggerExecution") or 0)
                 for p in submit.recentProgress if p["numInputRows"]]
        began = [_progress_ms(p) for p in answers.recentProgress]
        return bool(began) and (not ended or max(began) > max(ended))

    @property
    def open_requests(self) -> int:
        """Accepted requests still waiting for their answer (at the last micro-batch)."""
        return self.counts.open_requests

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
        tagging = self.config.tagging
        requests = self.inference.requests(
            events, template=self.template, priority=tagging.priority,
            sla_ms=tagging.sla_ms, enqueue_ts=tagging.event_time_ms,
            max_tokens=tagging.max_tokens_column or tagging.max_tokens,
            max_tokens_cap=tagging.max_tokens, model=tagging.model,
            temperature=tagging.temperature, trace_id=tagging.trace_id,
            traceparent=tagging.traceparent)
        if self.config.rollout.mode != "full":  # canary/shadow/offline: adds `rollout_arm`
            requests = with_arm(requests, self.config.rollout)
        return requests

    def acks(self, events: DataFrame | None = None) -> DataFrame:
        """The submit query's output: one ack row per event. With L1/L2, a rollout mode
        or a source with dead letters, every row, with ack columns where it was submitted
        (route ``llm``, the ``llm``/``shadow`` arm) and null ones where it was not."""
        requests, carried, extra, submit_when = self._to_submit(events)
        return self.inference.submit(requests, submit_when=submit_when,
                                     attribute_columns=carried, extra_attributes=extra)

    def request_records(self, events: DataFrame | None = None) -> tuple[DataFrame, StructType]:
        """The real-time submit query's output (``output.triggers.submit: realtime``): a
        Kafka record per event, the requests to ``kafka.requests_topic`` for the
        sidecars to read (:mod:`spark_ext.submit.realtime`), and the schema the answers
        query reads those records with as acks."""
        requests, carried, extra, submit_when = self._to_submit(events)
        records = request_records(requests, pipeline_id=self.pipeline_id,
                                  requests_topic=self.config.kafka.requests_topic,
                                  acks_topic=self.config.sidecar.acks_topic,
                                  attribute_columns=carried, extra_attributes=extra,
                                  submit_when=submit_when,
                                  delivery_ms=self.config.answers.delivery_ms)
        return records, ack_schema(requests)

    def _to_submit(self, events: DataFrame | None
                   ) -> tuple[DataFrame, list[str], dict[str, str], str | None]:
        """The request rows, the columns and fixed values each request carries as
        attributes, and the boolean column that picks the rows to submit (``None``: all)."""
        from pyspark.sql import functions as F

        requests = self.requests(events)
        extra = {PIPELINE_ATTRIBUTE: self.pipeline_id}
        if not self._routed():
            return requests, list(self.config.tagging.key_columns), extra, None
        chosen = F.col("route") == "llm" if "route" in requests.columns else F.lit(True)
        if DEAD_LETTER_COLUMN in requests.columns:  # not an event: never submitted
            chosen = chosen & F.col(DEAD_LETTER_COLUMN).isNull()
        if ARM_COLUMN in requests.columns:
            chosen = chosen & F.col(ARM_COLUMN).isin("llm", "shadow")
            if self.config.rollout.mode == "shadow":
                extra[SHADOW_ATTRIBUTE] = "1"
        carried = [*self.config.tagging.key_columns,
                   *([KB_IDS] if KB_IDS in requests.columns else [])]
        requests = requests.withColumn(SUBMIT_COLUMN, F.coalesce(chosen, F.lit(False)))
        return requests, carried, extra, SUBMIT_COLUMN

    def results(self) -> DataFrame:
        """The sidecar's result rows as a stream (the result channel's reader)."""
        return self.channel.results(self.spark)

    def hint_path(self) -> str:
        """The clock's hint file (:mod:`spark_ext.sources.clock`): local to the driver,
        where the answers query's writer and the clock source both run."""
        return self.inference.hint_path()

    def answers_input(self, ack_schema, bucket_keys: tuple[int, ...]) -> DataFrame:
        """The answers query's stream: the ledger's output (:mod:`spark_ext.l4.ledger`)
        over the results, the acks of ``ack_schema`` and the clock, in the buckets
        ``bucket_keys`` (:mod:`spark_ext.l4.buckets`)."""
        every = self.config.output.records_interval_s
        if every is None:
            every = self.tables.records_interval_s
        return self.inference.answers(
            ack_schema=ack_schema, ledger_output=True, bucket_keys=bucket_keys,
            routed=self._routed(), count_events=fast_path.enabled(self.config),
            records_interval_s=every)

    # -------------------------------------------------------------- lifecycle

    def _start(self, df: DataFrame, query: str, *, foreach: object = None,
               output_mode: str = "append", sink: str | None = None,
               confs: dict[str, str] | None = None,
               options: dict[str, str] | None = None,
               trigger: float | str | None = None) -> StreamingQuery:
        """Start ``df`` as query ``sts-<query>`` with its checkpoint and trigger
        (``output.triggers``, or ``trigger``), into ``foreach`` (a ``foreachBatch``
        function) or the ``sink`` format (with ``options``), with ``confs`` set for this
        query only."""
        writer = (df.writeStream.queryName(f"sts-{query}").outputMode(output_mode)
                  .option("checkpointLocation", self.config.output.checkpoint(query)))
        writer = writer.foreachBatch(foreach) if foreach is not None else writer.format(sink)
        if options:
            writer = writer.options(**options)
        seconds = self.config.output.triggers[query] if trigger is None else trigger
        if seconds == REALTIME:
            writer = writer.trigger(realTime=REALTIME_BATCH)
        elif seconds > 0:
            writer = writer.trigger(processingTime=f"{seconds} seconds")
        # A query copies the session's conf when it starts: set ours for our queries only.
        confs = {_POLLING_DELAY: f"{self.config.output.idle_poll_ms}ms", **(confs or {})}
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

        The answers query starts first, reading the ack channel with the schema of the
        submit query's output; a restart continues from both checkpoints (the ledger's
        state included: a request accepted before the stop is still answered)."""
        publish = self.config.answers.topic is not None
        self._check_locations()
        self._set_aside_stale_state()
        answers_checkpoint = self.config.output.checkpoint("answers")
        new_answers_run = is_new_checkpoint(self.spark, answers_checkpoint)
        for query in QUERIES if publish else ("submit", "answers"):
            self.runs[query] = (self.inference.submit_run if query == "submit" else
                                query_run(self.spark, self.config.output.checkpoint(query)))
        self.inference.answers_run = self.runs["answers"]
        # The ledger's state has one value per bucket and one bucket per shuffle
        # partition (Spark's default of 200 would run 200 tasks a micro-batch); a
        # checkpoint keeps the buckets, and the partitions, its first run chose.
        ledger_buckets = checkpoint_bucket_keys(
            self.spark, answers_checkpoint, new_run=new_answers_run,
            partitions=max(1, min(MAX_BUCKETS, task_slots(self.spark))))
        realtime_since = self._realtime_publish_since() \
            if publish and self.config.output.realtime_publish else None
        checked = None
        if self.config.sidecar.check_at_start:  # before anything is written or served
            checked = self.check_sidecars()
            refuse_channel_mismatch(checked, self.config.sidecar.result_channel)
            if self.config.output.realtime_submit:
                refuse_intake_mismatch(checked, self.config.kafka.requests_topic)
        announce(self.spark, self.config.sidecar)  # new executors wait for their sidecar
        self.tables.create_tables(self.spark)
        # The last version written before this start: the answers topic publishes after it.
        answers_version = self._table_version("answers") if publish else 0
        self._serve_metrics(checked)
        self.channel.prepare()  # e.g. the result and acks topics
        realtime = self.config.output.realtime_submit
        if realtime:  # requests as records on a topic the sidecars read
            submit_df, acks = self.request_records(events)
        else:
            submit_df = self.acks(events)
            acks = submit_df.schema
        keys = tuple(self.config.tagging.key_columns)
        batch_writer = AnswersBatch(
            self.tables, app_id=self._app_id("answers"),
            record_schemas=record_schemas(acks, keys), hint_path=self.hint_path(),
            counts=self.counts,
            fast_path_stats=self.fast_path_stats if fast_path.enabled(self.config) else None)
        # The answers query first: its sources start Python workers that must connect
        # back within Spark's fixed timeout, which L1/L2's start (model loads in every
        # worker) can exceed on a busy machine.
        answers = self._start(self.answers_input(acks, ledger_buckets), "answers",
                              foreach=batch_writer, output_mode="update",
                              confs={"spark.sql.shuffle.partitions": str(len(ledger_buckets)),
                                     **self.tables.query_confs})
        try:
            _await_sources(answers)
            if fast_path.enabled(self.config):
                fast_path.warm_up(self.spark, self.config)
            if realtime:
                submit = self._start(submit_df, "submit", sink="kafka", output_mode="update",
                                     options=self.config.kafka.spark_options())
            else:
                self._warm_up_plan()
                submit = self._start(submit_df, "submit", sink="noop")
        except BaseException:
            answers.stop()
            raise
        self.queries = [submit, answers]
        if publish:
            try:
                self.queries.append(self._start_publisher(answers_version, realtime_since))
                if realtime_since is not None:
                    self.queries.append(self._start_realtime_publisher(realtime_since))
            except BaseException:
                for q in self.queries:
                    q.stop()
                raise
        self._vacuumed_at = time.monotonic()
        self.tickers = [
            Ticker("sts-maintenance", self.config.maintenance.interval_s, self._maintain),
            Ticker("sts-health", 0.5, self._watch_health),
        ]
        if self.metrics is not None or self.config.scaling.enabled:
            self.tickers.append(Ticker("sts-scale", SCALE_CHECK_INTERVAL_S, self._scaler()))
        for t in self.tickers:
            t.start()
        return self.queries

    def _check_locations(self) -> None:
        """Refuse, in one line that says what to add, a table or checkpoint location this
        Spark cannot reach at all (an object store without its Hadoop connector)."""
        out = self.config.output
        places = {"output.checkpoint_dir": out.checkpoint_dir}
        if self.tables.writes_with_spark:
            places["output.out_dir"] = out.out_dir
        for name, uri in places.items():
            if why := storage.unreachable(self.spark, uri):
                raise PipelineConfigError(
                    f"{name} {uri}: {why}; add hadoop-aws to the session "
                    "(spark-submit --packages \"$(python -m spark_ext.jvm_packages --with s3)\", "
                    "or local_session(..., jvm_features=(\"kafka\", \"delta\", \"s3\"))) and "
                    "for s3:// also spark.hadoop.fs.s3.impl="
                    "org.apache.hadoop.fs.s3a.S3AFileSystem (docs/tables.md, \"Object stores\")")

    def _set_aside_stale_state(self) -> None:
        """A checkpoint emptied of its offsets but not of its state (a partial reset)
        starts a new run, and Spark refuses state left from the old one
        (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``): a local one is moved aside to
        ``state-before-<time>`` (kept, not deleted); on an object store the start is
        refused with what to remove."""
        checkpoint = self.config.output.checkpoint("answers")
        state = f"{checkpoint.rstrip('/')}/state"
        if not is_new_checkpoint(self.spark, checkpoint):
            return
        if is_local_uri(state):
            folder = local_path(state)
            if folder.is_dir():
                aside = folder.with_name(f"state-before-{now_ms()}")
                folder.rename(aside)
                logger.warning("Checkpoint %s had state but no offsets (a partial reset): "
                               "its old state moved to %s.", checkpoint, aside)
        elif storage.has_files(self.spark, state):
            raise PipelineConfigError(
                f"checkpoint {checkpoint} has state but no offsets (a partial reset): "
                f"remove {state} or the whole checkpoint")

    def _realtime_publish_since(self) -> int:
        """When ``sts-publish-realtime`` began publishing the model's answers (epoch ms):
        kept in its checkpoint (``sts-realtime-since``) from its first start on, so that
        it and ``sts-publish``'s skip keep one instant across restarts. (Not the run id's
        time: a real-time query writes its first offsets only when its first batch ends,
        and a pipeline stopped before that would start a new run with a later instant,
        publishing the answers in between twice.)"""
        marker = join_uri(self.config.output.checkpoint(REALTIME_PUBLISH), "sts-realtime-since")
        kept = (storage.read_text(self.spark, marker) or "").strip()
        if kept.isdigit():
            return int(kept)
        since = now_ms()
        storage.write_text(self.spark, marker, str(since))
        return since

    def _start_realtime_publisher(self, since: int) -> StreamingQuery:
        """``sts-publish-realtime``: the model's answers from the result topics to the
        answers topic in Real-Time Mode (:mod:`spark_ext.l4.answers_realtime`)."""
        from spark_ext.l4.answers_realtime import UTC_CONF, model_answers, result_records
        from spark_ext.sources.kafka import ensure_topics

        config = self.config
        topics = config.result_topics()
        ensure_topics(config.kafka.producer_config(), [*topics, config.answers.topic])
        records = result_records(self.spark, config.kafka.spark_options(), topics,
                                 since_ms=since)
        answers = model_answers(records, pipeline_id=self.pipeline_id,
                                key_column=config.tagging.key_columns[0], since_ms=since)
        return self._start(answers, REALTIME_PUBLISH, sink="kafka", output_mode="update",
                           options={**config.kafka.spark_options(),
                                    "topic": config.answers.topic},
                           confs=UTC_CONF, trigger=REALTIME)

    def _start_publisher(self, answers_version: int,
                         realtime_since: int | None = None) -> StreamingQuery:
        """``sts-publish``: the answers' change feed -> the answers topic
        (:mod:`spark_ext.l4.answers_topic`), from ``answers_version`` (the table's last
        before this start) on, without the model answers the real-time publisher
        publishes (from ``realtime_since``); needs Delta on Spark to read the feed."""
        from spark_ext.l4.answers_topic import AnswerPublisher
        from spark_ext.l4.writers.spark import SparkWriter, delta_on_spark

        if not delta_on_spark(self.spark):
            raise PipelineConfigError("answers.topic needs Delta on Spark (delta-spark) to "
                                      "read the answers' change feed")
        tables = SparkWriter(self.config.output, tuple(self.config.tagging.key_columns))
        # A new checkpoint starts at the table's current version, published from the
        # next one on (Delta refuses a starting version past the latest); a checkpoint
        # that exists resumes from its own offsets.
        skip_through = None
        if is_new_checkpoint(self.spark, self.config.output.checkpoint("publish")):
            skip_through = answers_version
        reader = (self.spark.readStream.format("delta").option("readChangeFeed", "true")
                  .option("startingVersion", str(answers_version)))
        changes = (reader.table(tables.location("answers")) if tables.by_name("answers")
                   else reader.load(tables.location("answers")))
        publisher = AnswerPublisher(
            topic=self.config.answers.topic, producer_config=self.config.kafka.producer_config(),
            run_id=self.runs["publish"].id, key_columns=tuple(self.config.tagging.key_columns),
            skip_through=skip_through,
            realtime_since=realtime_since)
        self._publisher = publisher  # closed when the pipeline stops (classic sessions)
        # with a real-time publisher, the rest of the answers as fast as micro-batches go
        return self._start(changes, "publish", foreach=publisher,
                           trigger=0.0 if self.config.output.realtime_publish else None)

    def _table_version(self, name: str) -> int:
        """The latest version of table ``name`` (Delta's history, through Spark)."""
        from spark_ext.l4.writers.spark import SparkWriter

        return SparkWriter(self.config.output, tuple(self.config.tagging.key_columns)
                           ).version(self.spark, name)

    def _routed(self) -> bool:
        """Whether the submit query passes some rows through unsent (L1/L2 answers them,
        a rollout mode holds them, or the source has dead letters)."""
        return (fast_path.enabled(self.config) or self.config.rollout.mode != "full"
                or self.source.has_dead_letters)

    def _maintain(self) -> None:
        """One maintenance run: the writer's compaction, and a vacuum when
        ``maintenance.vacuum_interval_s`` has passed since the last (or the start)."""
        now = now_ms()
        upkeep = self.config.maintenance
        vacuum = time.monotonic() - self._vacuumed_at >= upkeep.vacuum_interval_s
        self.tables.maintain(self.spark, TABLE_NAMES, hours_between(now - 3_600_000, now),
                             vacuum_retention_hours=upkeep.vacuum_retention_hours if vacuum
                             else None)
        if vacuum:
            self._vacuumed_at = time.monotonic()

    def _warm_up_plan(self) -> None:
        """Run the submit query's request plan once over one all-null event read the way
        the source reads its events (:meth:`~spark_ext.sources.events.EventSource.warm_up_events`;
        file sources: a file written once per format and schema into
        ``<checkpoint_dir>/plan-warm-up/<format>-<hash>`` and reused, never overwritten
        or deleted), writing nothing (``noop``) and submitting nothing, so Spark
        compiles its generated code before the first micro-batch instead of in it
        (measured: the first micro-batch's job 2.0 s -> 0.28 s with L1/L2), in the Python
        workers the stream gets (:func:`~spark_ext.worker_pool.warm_up_workers`: on
        Spark Connect a stream over the event, written once to ``<folder>-rows``). A
        failure is logged and skipped, never fatal."""
        src = self.config.source
        tag = hashlib.sha1(src.schema.encode()).hexdigest()[:10]
        folder = self.config.output.checkpoint(f"plan-warm-up/{src.format}-{tag}")
        started = time.monotonic()
        try:
            events = self.source.warm_up_events(self.spark, folder)
            if events is None:
                return
            warm_up_workers(self.spark, events, self.requests, f"{folder}-rows")
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

    def _serve_metrics(self, checked: list[dict] | None) -> None:
        """The driver's ``/metrics`` when ``output.metrics_port`` is set, with the start-up
        check's rows (``checked``) already counted."""
        if (port := self.config.output.metrics_port) is None:
            return
        from spark_ext.pipeline.metrics import PipelineMetrics

        self.metrics = PipelineMetrics(self)
        self.spark.streams.addListener(self.metrics)
        self.metrics.serve(port, self.config.output.metrics_addr)
        logger.info("Spark-side metrics on http://%s:%d/metrics",
                    self.config.output.metrics_addr, self.metrics_port)
        if checked is not None:
            self.metrics.sidecars_checked(checked)

    def check_sidecars(self, *, log_level: int = logging.INFO) -> list[dict]:
        """Ask from the executors' Python tasks whether their sidecar serves; log the
        answer (see :attr:`~spark_ext.config.SidecarEndpointConfig.check_at_start`; a
        sidecar that does not serve is a warning, the rest at ``log_level``). With the
        driver's ``/metrics`` on, their scale signal, summed, goes there
        (``sts_spark_scale``); it is asked again every :data:`SCALE_CHECK_INTERVAL_S`."""
        started = time.monotonic()
        rows = check_sidecars(self.spark, self.config.sidecar)
        down = [r for r in rows if not r["serving"]]
        for r in down:
            logger.warning("Sidecar %s is not serving for task %d%s: its requests get the "
                           "fallback until it is.", r["endpoint"], r["partition"],
                           f" ({r['error']})" if r["error"] else "")
        logger.log(log_level, "Sidecar check from %d task(s): %d serving (%.1f s).", len(rows),
                   len(rows) - len(down), time.monotonic() - started)
        if self.metrics is not None:
            self.metrics.sidecars_checked(rows)
        return rows

    def _scaler(self) -> Callable[[], object]:
        """Every check of the scale signal: the sidecars asked (``/metrics``), and with
        ``scaling.enabled`` the GPU executors asked for or released
        (:mod:`spark_ext.pipeline.scaling`). A check that fails is a warning, never the
        pipeline's failure (an executor may go away during one)."""
        scaling = self.config.scaling
        controller = ScaleController(scaling) if scaling.enabled else None
        executors = SparkExecutors(self.spark) if scaling.enabled else None
        # The executor-ready plugin holds a new executor until its sidecar serves; the
        # warm-up's tasks would only take the serving executors' slots then.
        warm_up = executors is not None and scaling.warm_up and not plugin_loaded(self.spark)
        warmup = None if executors is None or not warm_up else ExecutorWarmup(
            executors.starting, lambda: check_sidecars(self.spark, self.config.sidecar),
            stopping=self._stopping)

        def step() -> object:
            try:
                rows = self.check_sidecars(log_level=logging.DEBUG)
                scale = pipeline_scale(rows)
                if controller is None or executors is None or not scale["desired_gpus"]:
                    return None
                decision = scaling_step(controller, executors, scale["desired_gpus_exact"])
                if decision.action == "up" and decision.applied and warmup is not None:
                    warmup.start(decision.target, {r["executor"] for r in rows})
                return decision
            except Exception as e:  # the next check tries again
                logger.warning("The scale check failed (the next one in %.0f s): %s",
                               SCALE_CHECK_INTERVAL_S, one_line_reason(e))
                return None
        return step

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
        for t in self.tickers:  # a tick under way ends before the queries and Spark do
            if t is not threading.current_thread():
                t.join(timeout=60)
        realtime = self.config.output.realtime_submit or self.config.output.realtime_publish
        with jvm_loggers_off(self.spark, REALTIME_STOP_LOGGERS if realtime else ()):
            for q in self.queries:
                try:
                    q.stop()
                except Exception:  # stopping a failed query may raise again
                    logger.debug("Stopping %s raised.", q.name, exc_info=True)
        if (publisher := getattr(self, "_publisher", None)) is not None:
            publisher.close()
        if (tracer := getattr(self.tables, "tracer", None)) is not None:
            tracer.flush()
        if self.metrics is not None:
            try:
                self.spark.streams.removeListener(self.metrics)
            except Exception:  # the session may be gone already
                logger.debug("Removing the metrics listener raised.", exc_info=True)
            self.metrics.close()
            self.metrics = None
