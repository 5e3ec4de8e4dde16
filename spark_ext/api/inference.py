"""Non-blocking LLM inference inside your own Spark query: :class:`LlmInference`.

Your job keeps its source, its joins, its sink and its checkpoints; sts-spark adds three
steps on DataFrames, the way ``predict_batch_udf`` or Ray Data's processors do:

1. :meth:`LlmInference.requests`: any DataFrame (streaming or static) -> the request
   columns (``request_id`` from your key columns, the prompt with its stable part
   first, priority, deadline, budget, fallback text);
2. :meth:`LlmInference.submit`: the requests -> one ack row per request, fire-and-forget
   (the sidecar acknowledges at once; nothing waits for the model);
3. :meth:`LlmInference.answers`: a streaming DataFrame with **one terminal answer per
   request**: the model's, or its fallback at the deadline (also when the sidecar died
   and no result will ever come), and later the backfill of a model answer that came
   after the fallback. Write it with your own ``writeStream``: to a Delta table with
   :meth:`LlmInference.delta_writer`, to a Kafka topic, or with your own
   ``foreachBatch``.

:meth:`LlmInference.start` starts both queries in one call. Every request id is
namespaced by the query's identity (:attr:`LlmInference.namespace`: its checkpoint and
that checkpoint's run), so two jobs over the same keys, or the same job on a new
checkpoint, never meet each other's requests, results or acks.

Example (a complete job; the sidecar runs beside it, ``sts sidecar``)::

    from spark_ext import LlmInference

    events = spark.readStream.format("kafka").option("subscribe", "tickets")...load()
    llm = LlmInference(spark, key="ticket_id", checkpoint_location="/chk/tickets-llm",
                       fallback_text="We will get back to you shortly.")
    requests = llm.requests(events, template="You triage tickets.\\nTicket: {text}",
                            priority="priority", sla_ms={"high": 3000, "normal": 10000,
                                                         "low": 30000})
    submit, answers = llm.start(requests, answers_table="main.support.llm_answers")
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_ext.config import OutputConfig, PipelineConfig, TaggingConfig
from spark_ext.exceptions import PipelineConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery
    from pyspark.sql.types import StructType

    from spark_ext.l2.template import PromptTemplate
    from spark_ext.l4.channels import ChannelSide
    from spark_ext.l4.writers.base import TableWriter

logger = logging.getLogger(__name__)

#: The priorities a request may have (the sidecar refuses any other with ``rejected``).
PRIORITIES = ("high", "normal", "low")

#: Control column of :meth:`LlmInference.answers`: ``append`` (a request's first and
#: only answer) or ``merge`` (a backfill: the model's answer after the fallback, or an
#: answer the ledger could not decide alone, e.g. right after a new answers checkpoint).
WRITE_COLUMN = "write"

#: How often, at the latest, the answers query wakes up to answer what fell due (ms): a
#: backstop behind the listener that wakes it when a fallback falls due.
TICK_INTERVAL_MS = 5000
#: The same on Spark Connect, where it is the only clock (no listener runs there): a
#: fallback lands within this plus a micro-batch of its due time.
CONNECT_TICK_INTERVAL_MS = 2000

#: Temporary column names used while the request columns are built.
_PRIORITY, _ENQUEUE, _TRACE_ID = "_sts_priority", "_sts_enqueue_ts", "_sts_trace_id"

#: Columns a request carries besides the user's own (those :meth:`LlmInference.requests` adds).
REQUEST_COLUMNS: tuple[str, ...] = (
    "request_id", "trace_id", "priority", "enqueue_ts", "deadline_ts", "model", "prompt",
    "max_tokens", "temperature", "cache_key", "callback_topic",
)


def query_namespace(checkpoint_location: str, run_id: str) -> str:
    """The identity of a query: its checkpoint's location and the id kept in it (new when
    the folder is made anew), as 12 hex digits.

    Example:
        >>> query_namespace("/chk/a", "r1") == query_namespace("/chk/a", "r1")
        True
        >>> query_namespace("/chk/a", "r1") != query_namespace("/chk/a", "r2")
        True
    """
    return hashlib.sha1(f"{checkpoint_location}|{run_id}".encode()).hexdigest()[:12]


@dataclass(frozen=True)
class InferenceQueries:
    """The two queries of :meth:`LlmInference.start` (iterating gives both).

    Example:
        >>> queries = llm.start(llm.requests(spark.readStream.format("rate").load()
        ...     .selectExpr("cast(value as string) as id", "'hi' as text"),
        ...     template="Say hello back.\\nMessage: {text}"), answers_table=str(tmp / "ans"),
        ...     warm_up=False)
        >>> queries.submit.isActive and queries.answers.isActive
        True
        >>> queries.stop()
        >>> queries.answers.isActive
        False
    """

    submit: StreamingQuery
    """Events -> requests -> the sidecar (writes no table)."""
    answers: StreamingQuery
    """Results + acks + a clock -> one answer per request -> your sink."""
    inference: "LlmInference" = field(repr=False)
    """Who started them (closed by :meth:`stop`)."""

    def __iter__(self) -> Iterator[StreamingQuery]:
        return iter((self.submit, self.answers))

    def stop(self) -> None:
        """Stop both (the submit query first), then :meth:`LlmInference.close`."""
        for q in (self.submit, self.answers):
            try:
                q.stop()
            except Exception:  # noqa: BLE001 - a failed query may raise again on stop
                logger.debug("Stopping %s raised.", q.name, exc_info=True)
        self.inference.close()


class LlmInference:
    """Non-blocking LLM inference for a user's own Spark query (see the module docstring).

    Args:
        spark: The session (classic or Spark Connect).
        key: The event's key column(s): one request per distinct key; replays of the
            same key in the same query are the same request (never generated twice).
        checkpoint_location: Where the two queries keep their checkpoints
            (``<it>/submit``, ``<it>/answers``; :meth:`checkpoint`). It is the query's
            identity: its run (new when the checkpoint starts over) names the requests.
        fallback_text: The answer of a request the model did not answer by its deadline
            (a request's own ``fallback_text`` wins; then the sidecar pool's).
        sidecar: The sidecar's address (``host:port`` or ``unix:///path.sock``).
        results_dir: With the ``files`` channel, the folder the sidecar writes results
            to (its ``results.results_dir``); the acks go to
            ``<results_dir>/acks/<namespace>``.
        result_channel: ``files`` or ``kafka`` (results on ``llm.result.{priority}``,
            acks on ``llm.acks``; needs ``kafka_bootstrap_servers``).
        kafka_bootstrap_servers: The Kafka cluster of the ``kafka`` channel.
        grace_ms: A request with no result by ``deadline_ts + grace_ms`` gets its
            fallback from the safety net.
        validate: Check the model's answers (length, PII, forbidden patterns) before
            they are served; a failed one is replaced by the fallback.
        tick_interval_ms: The answers query wakes up when a fallback falls due (its
            observed metrics tell this driver when); at the latest every this many ms
            (a backstop, and the clock on Spark Connect, where no listener runs).
            Default: :data:`TICK_INTERVAL_MS`, or :data:`CONNECT_TICK_INTERVAL_MS` on
            Spark Connect.
        options: Further settings by section, as in the pipeline's YAML (e.g.
            ``{"sidecar": {"token_file": "/etc/sts/token"}}``).

    Raises:
        PipelineConfigError: a setting is wrong (one line naming it).

    Example:
        >>> llm = LlmInference(spark, key="id", checkpoint_location=str(tmp / "chk"),
        ...                    fallback_text="Later.", results_dir=str(tmp / "results"))
        >>> len(llm.namespace)
        12
    """

    def __init__(self, spark: SparkSession, *, key: str | Sequence[str],
                 checkpoint_location: str, fallback_text: str,
                 sidecar: str = "127.0.0.1:50051", results_dir: str = "./sts-results",
                 result_channel: str = "files", kafka_bootstrap_servers: str | None = None,
                 grace_ms: int = 2000, validate: bool = True,
                 tick_interval_ms: int | None = None,
                 options: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        from sidecar import build_sections

        keys = [key] if isinstance(key, str) else list(key)
        if not keys:
            raise PipelineConfigError("key: name at least one key column")
        if tick_interval_ms is None:
            from spark_ext.session import is_connect

            tick_interval_ms = CONNECT_TICK_INTERVAL_MS if is_connect(spark) else TICK_INTERVAL_MS
        if tick_interval_ms <= 0:
            raise PipelineConfigError(f"{tick_interval_ms=} must be > 0")
        data: dict[str, dict[str, Any]] = {
            "tagging": {"key_columns": keys},
            "sidecar": {"endpoint": sidecar, "results_dir": results_dir,
                        "result_channel": result_channel},
            "answers": {"grace_ms": grace_ms, "fallback_text": fallback_text},
            "output": {"checkpoint_dir": checkpoint_location},
            "validation": {"enabled": validate},
        }
        if kafka_bootstrap_servers:
            data["kafka"] = {"bootstrap_servers": kafka_bootstrap_servers}
        for section, values in (options or {}).items():
            data.setdefault(section, {}).update(values)
        config = PipelineConfig(**build_sections(PipelineConfig.sections(), data,
                                                 what="LlmInference options",
                                                 error=PipelineConfigError))
        config.check(with_source=False)
        self._init(spark, config.with_derived_defaults(), tick_interval_ms=tick_interval_ms)

    @classmethod
    def from_config(cls, spark: SparkSession, config: PipelineConfig, *,
                    tick_interval_ms: int | None = None) -> "LlmInference":
        """The inference of a whole pipeline config (what :class:`StsPipeline` runs):
        its ``tagging``, ``sidecar``, ``answers``, ``validation`` and ``output``
        sections. ``tick_interval_ms``: ``None`` when the answers' writer leaves the
        clock its hints (:meth:`answers` with ``ledger_output=True``)."""
        self = cls.__new__(cls)
        self._init(spark, config.with_derived_defaults(), tick_interval_ms=tick_interval_ms)
        return self

    def _init(self, spark: SparkSession, config: PipelineConfig, *,
              tick_interval_ms: int | None) -> None:
        self.spark = spark
        self.config = config
        self.tick_interval_ms = tick_interval_ms
        self._submit_run = None
        self._namespace: str | None = None
        self._channel = None
        self.ack_schema: StructType | None = None
        """The schema of :meth:`submit`'s acks (set by it; :meth:`answers` reads them)."""
        self.answers_run = None
        """The answers query's run (read from its checkpoint when first needed)."""

    @property
    def submit_run(self):
        """The submit query's run (:class:`~spark_ext.run_ids.QueryRun`): kept in
        its checkpoint while that has offsets, new when it starts over."""
        from spark_ext.run_ids import query_run
        from spark_ext.uris import is_local_uri, local_path

        if self._submit_run is None:
            if is_local_uri(self.config.output.checkpoint_dir):
                local_path(self.config.output.checkpoint_dir).mkdir(parents=True,
                                                                    exist_ok=True)
            self._submit_run = query_run(self.spark, self.checkpoint("submit"))
        return self._submit_run

    @property
    def namespace(self) -> str:
        """The query's identity (12 hex digits): its checkpoint folder and the id kept in it
        from the first start until the folder is deleted
        (:func:`~spark_ext.run_ids.checkpoint_namespace_id`). Request ids, acks and results
        are this query's alone: the same keys in another query, or after its checkpoint
        folder was deleted, are other requests."""
        from spark_ext.run_ids import checkpoint_namespace_id
        from spark_ext.uris import is_local_uri, local_path, resolve_local

        if self._namespace is None:
            checkpoint_dir = self.config.output.checkpoint_dir
            if is_local_uri(checkpoint_dir):
                local_path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
            self._namespace = query_namespace(
                resolve_local(checkpoint_dir, Path.cwd()),
                checkpoint_namespace_id(self.spark, checkpoint_dir))
        return self._namespace

    @property
    def channel(self) -> ChannelSide:
        """The Spark side of the result channel (:mod:`spark_ext.l4.channels`); its local
        folders are made when it is first asked for."""
        from spark_ext.l4.channels import channel_side
        from spark_ext.uris import is_local_uri, local_path

        if self._channel is None:
            self._channel = channel_side(self.config, self.namespace)
            for d in self._channel.folders():
                if is_local_uri(d):
                    local_path(d).mkdir(parents=True, exist_ok=True)
        return self._channel

    # ------------------------------------------------------------------ requests

    @property
    def key_columns(self) -> list[str]:
        """The event's key columns."""
        return list(self.config.tagging.key_columns)

    def checkpoint(self, query: str) -> str:
        """The checkpoint location of ``query`` (``submit`` or ``answers``)."""
        return self.config.output.checkpoint(query)

    def requests(self, df: DataFrame, *, prompt: Column | None = None,
                 template: PromptTemplate | str | None = None,
                 priority: Column | str = "normal",
                 sla_ms: int | Mapping[str, int] | None = None,
                 deadline_ts: Column | str | None = None,
                 enqueue_ts: Column | str | None = None,
                 max_tokens: int | str | Column = 64, max_tokens_cap: int = 4096,
                 model: str = "", temperature: float = 0.0,
                 fallback_text: Column | str | None = None,
                 trace_id: Column | str | None = None,
                 traceparent: str | None = None) -> DataFrame:
        """``df`` with the request columns added (:data:`REQUEST_COLUMNS`; ``df``'s own
        columns are kept).

        Args:
            df: Events, streaming or static; it must have the key columns.
            prompt: The prompt as a Column (``cache_key`` null), or
            template: A :class:`~spark_ext.PromptTemplate` or one string split at its
                first ``{column}``: a stable part first (shared by every request, so
                vLLM's prefix cache serves it), then the per-event fields;
                ``cache_key`` is the hash of the stable part. Templates with the
                per-event part first are refused.
            priority: ``high``, ``normal`` or ``low`` for all, or a column (a name, a
                SQL expression or a Column) holding them (an unknown value is
                ``rejected`` by the sidecar).
            sla_ms: ``deadline_ts = enqueue_ts + sla_ms``: one number for all, or one
                per priority (default 3 s / 10 s / 30 s).
            deadline_ts: The deadline (epoch ms) as a column; overrides ``sla_ms``.
            enqueue_ts: When the event happened (epoch ms) as a column (a name, a SQL
                expression or a Column); default: when the micro-batch began.
            max_tokens: The generation budget: a number; a column's name (its values
                clamped to ``1..max_tokens_cap``, null: the cap); or a Column, as it is
                (the sidecar refuses one above its own cap).
            max_tokens_cap: See ``max_tokens``.
            model: The model name the sidecar serves (empty: its default).
            temperature: Sampling temperature.
            fallback_text: This request's own fallback (a string or a Column).
            trace_id: A column with the event's trace id (default: the request id).
            traceparent: A column with the event's W3C ``traceparent``.

        Returns:
            The request rows, ready for :meth:`submit`.

        Example:
            >>> events = spark.createDataFrame([("t1", "My order is late", "high")],
            ...                                "id string, text string, p string")
            >>> reqs = llm.requests(events, template="You triage tickets.\\nTicket: {text}",
            ...                     priority="p", sla_ms=5000)
            >>> row = reqs.first()
            >>> row.priority, row.deadline_ts - row.enqueue_ts, row.prompt[:20]
            ('high', 5000, 'You triage tickets.\\n')
        """
        from pyspark.sql import Column as SparkColumn
        from pyspark.sql import functions as F

        from spark_ext.l1.tagging import tag_requests
        from spark_ext.l2.template import PromptTemplate

        if (prompt is None) == (template is None):
            raise PipelineConfigError("requests: give one of prompt (a Column) or template")
        if isinstance(template, str):
            template = PromptTemplate.from_string(template)
        df, tagging = self._tagging(df, priority=priority, sla_ms=sla_ms,
                                    enqueue_ts=enqueue_ts, max_tokens=max_tokens,
                                    max_tokens_cap=max_tokens_cap, trace_id=trace_id,
                                    traceparent=traceparent)
        tagging.model, tagging.temperature = model, temperature
        needs = tuple(template.fields) if template is not None else ()
        out = tag_requests(df, tagging, needs=needs, namespace=self.namespace)
        if deadline_ts is not None:
            out = out.withColumn("deadline_ts", (F.col(deadline_ts) if isinstance(
                deadline_ts, str) else deadline_ts).cast("long"))
        if isinstance(max_tokens, SparkColumn):
            out = out.withColumn("max_tokens", max_tokens.cast("int"))
        if template is not None:
            out = (out.withColumn("prompt", template.column())
                      .withColumn("cache_key", F.lit(template.cache_key)))
        else:
            out = (out.withColumn("prompt", prompt.cast("string"))
                      .withColumn("cache_key", F.lit(None).cast("string")))
        if fallback_text is not None:
            from spark_ext.l4.answers import REQUEST_FALLBACK

            out = out.withColumn(REQUEST_FALLBACK, (F.lit(fallback_text) if isinstance(
                fallback_text, str) else fallback_text).cast("string"))
        return out.drop(*[c for c in (_PRIORITY, _ENQUEUE, _TRACE_ID)
                          if c in out.columns])

    def _tagging(self, df: DataFrame, *, priority: Column | str,
                 sla_ms: int | Mapping[str, int] | None, enqueue_ts: Column | str | None,
                 max_tokens: int | str | Column, max_tokens_cap: int,
                 trace_id: Column | str | None, traceparent: str | None
                 ) -> tuple[DataFrame, TaggingConfig]:
        """The tagging settings of :meth:`requests`' arguments (a Column argument becomes a
        temporary column of ``df``, dropped after)."""
        from pyspark.sql import Column as SparkColumn

        tagging = TaggingConfig(**{**vars(self.config.tagging), "trace_id": None,
                                   "traceparent": traceparent, "max_tokens_column": None})
        if isinstance(priority, SparkColumn):
            df, tagging.priority = df.withColumn(_PRIORITY, priority), _PRIORITY
        elif priority not in df.columns and str(priority).lower() in PRIORITIES:
            tagging.priority = f"'{str(priority).lower()}'"
        else:  # a column's name, or a SQL expression over the columns
            tagging.priority = priority
        if sla_ms is not None:
            tagging.sla_ms = ({p: int(sla_ms) for p in PRIORITIES} if isinstance(sla_ms, int)
                              else {**tagging.sla_ms, **dict(sla_ms)})
        if isinstance(enqueue_ts, SparkColumn):
            df, tagging.event_time_ms = df.withColumn(_ENQUEUE, enqueue_ts), _ENQUEUE
        else:  # a column's name or a SQL expression; None: the micro-batch's start
            tagging.event_time_ms = enqueue_ts
        if isinstance(max_tokens, int):
            tagging.max_tokens = max_tokens
        elif isinstance(max_tokens, str):  # a column's budgets, clamped to 1..the cap
            tagging.max_tokens, tagging.max_tokens_column = max_tokens_cap, max_tokens
        if isinstance(trace_id, SparkColumn):
            df, tagging.trace_id = df.withColumn(_TRACE_ID, trace_id), _TRACE_ID
        else:
            tagging.trace_id = trace_id
        return df, tagging

    # ------------------------------------------------------------------ submit

    def submit(self, requests: DataFrame, *, submit_when: str | None = None,
               attribute_columns: Sequence[str] = (),
               extra_attributes: Mapping[str, str] | None = None) -> DataFrame:
        """Send each request to the sidecar, fire-and-forget: one ack row per request
        (the request's columns but the prompt, plus ``accepted``, ``reason``,
        ``detail``, ``duplicate``, ``submit_ts``, ``sidecar_id``, ``endpoint``,
        ``sidecar_fallback_text``), as soon as the sidecar admitted or refused it. An
        unreachable sidecar is ``accepted = false`` with reason ``unavailable`` (the
        fallback answers it), never a failed query. The acks also go to the answers
        query (the result channel's twin), so write the acks anywhere or nowhere
        (``format("noop")``), with ``checkpointLocation`` = :meth:`checkpoint`
        (``"submit"``); never a table write here (its latency would be every
        request's).

        Args:
            requests: The rows of :meth:`requests`.
            submit_when: A boolean column: only the rows where it is true go to the
                sidecar; the others pass with null ack columns (answered elsewhere).
            attribute_columns: Further columns each request carries to its result
                (the key columns always do).
            extra_attributes: Fixed attributes of every request.

        Example:
            >>> acks = llm.submit(reqs)   # a DataFrame; nothing runs until it is written
            >>> "accepted" in acks.columns and "prompt" not in acks.columns
            True
        """
        from spark_ext.l4.answers import REQUEST_FALLBACK
        from spark_ext.l4.arrivals import PIPELINE_ATTRIBUTE
        from spark_ext.submit.submission import STREAM_START_WAIT_S, submit_requests

        if missing := [c for c in ("request_id", "prompt", "deadline_ts")
                       if c not in requests.columns]:
            raise PipelineConfigError(f"submit: the rows lack {missing}: build them with "
                                      "LlmInference.requests")
        carried = list(dict.fromkeys([*self.key_columns, *attribute_columns, *(
            [REQUEST_FALLBACK] if REQUEST_FALLBACK in requests.columns else [])]))
        extra = {**(extra_attributes or {}), PIPELINE_ATTRIBUTE: self.namespace}
        run = self.submit_run
        acks = submit_requests(requests, self.config.sidecar, carried, extra,
                               traceparent_column=self.config.tagging.traceparent,
                               submit_when=submit_when,
                               ack_channel=self.channel.ack_channel(run.id, run.started_ms),
                               start_wait_s=STREAM_START_WAIT_S,
                               delivery_ms=self.config.answers.delivery_ms)
        self.ack_schema = acks.schema
        return acks

    # ------------------------------------------------------------------ answers

    def hint_path(self) -> str:
        """The clock's hint file (:mod:`spark_ext.sources.clock`), on the driver."""
        import os
        import tempfile

        name = f"sts-clock-{self.namespace}-{self._answers_run().id}.json"
        return os.path.join(tempfile.gettempdir(), "sts-spark", name)

    def _answers_run(self):
        from spark_ext.run_ids import query_run

        if self.answers_run is None:
            self.answers_run = query_run(self.spark, self.checkpoint("answers"))
        return self.answers_run

    def answers(self, *, ack_schema: StructType | None = None,
                ledger_output: bool = False, bucket_keys: tuple[int, ...] | None = None,
                routed: bool = False, count_events: bool = False,
                records_interval_s: float = 0.0) -> DataFrame:
        """The answers as a streaming DataFrame: **one row per request** (``write =
        'append'``), then for a request answered with the fallback whose model answer
        came later, its backfill (``write = 'merge'``, ``answer_source = 'backfill'``).

        Columns: ``request_id``, ``trace_id``, ``priority``, ``answer``,
        ``answer_source`` (``llm``, ``fallback``, ``backfill``), ``status``, ``reason``,
        ``fallback_text``, ``enqueue_ts``, ``submit_ts``, ``received_ts``,
        ``finish_ts``, ``deadline_ts``, ``answered_ts``, ``latency_ms``,
        ``deadline_met``, ``backfilled_at``, ``kb_ids``, ``enqueue_hour``, the key
        columns (as strings), and ``write``.

        Start it with ``outputMode("update")`` and ``checkpointLocation`` =
        :meth:`checkpoint` (``"answers"``): the answers of requests accepted before a
        restart are still given once (the ledger's state is in that checkpoint).
        :meth:`start` does both.

        Args:
            ack_schema: The acks' schema, when :meth:`submit` ran in another process.
            ledger_output: The ledger's whole output instead (every table's rows and
                its bookkeeping, for :class:`~spark_ext.StsPipeline`'s tables writer,
                which leaves the clock its hints).
            bucket_keys: The ledger's bucket keys (default: those the checkpoint keeps,
                else one per task slot, at most 8).
            routed: Some ack rows were not submitted (``submit_when``): they are
                answered by their ``route``/``rollout_arm`` (the pipeline's L1/L2).
            count_events: Pass L1/L2's figures through (``ledger_output`` only).
            records_interval_s: How often the ledger lets the record tables' rows out
                (``ledger_output`` only; 0: every micro-batch).

        Example:
            >>> acks = llm.submit(reqs)
            >>> answers = llm.answers()
            >>> answers.isStreaming, "answer" in answers.columns
            (True, True)
        """
        from pyspark.sql import functions as F
        from pyspark.sql.streaming.state import GroupStateTimeout

        from spark_ext.l4.arrivals import SUBMIT_COLUMN, arrivals, ledger_input
        from spark_ext.l4.answers import answer_schema
        from spark_ext.l4.ledger import (ANSWERS, APPEND, MERGE, STATE_HOLD_MS, STATS,
                                         BucketLedger, ledger_schema)
        from spark_ext.schemas import spark_schema
        from spark_ext.sources.clock import SOURCE_NAME as CLOCK_SOURCE
        from spark_ext.sources.clock import register_clock_source

        schema = ack_schema or self.ack_schema
        if schema is None:
            raise PipelineConfigError("answers: call submit() first, or pass ack_schema "
                                      "(the acks' schema) when it ran in another process")
        config, spark = self.config, self.spark
        if bucket_keys is None:
            bucket_keys = self._buckets()
        register_clock_source(spark)
        clock = (spark.readStream.format(CLOCK_SOURCE).option("hintPath", self.hint_path())
                 .option("bucketIds", ",".join(map(str, bucket_keys))))
        if self.tick_interval_ms and not ledger_output:
            clock = clock.option("everyMs", str(self.tick_interval_ms))
        candidates = ledger_input(
            arrivals(spark, self.channel, ack_schema=schema), clock.load(), config,
            hold_ms=STATE_HOLD_MS, rule_text=config.routing.rule_text,
            count_events=count_events, submit_column=SUBMIT_COLUMN if routed else None,
            bucket_keys=bucket_keys)
        keys = tuple(config.tagging.key_columns)
        ledger = BucketLedger(keys, merge_before=self._answers_run().started_ms,
                              records_every_ms=int(records_interval_s * 1000))
        out = candidates.groupBy("_bucket").applyInPandasWithState(
            ledger, spark_schema(ledger_schema(keys)), BucketLedger.STATE_DDL, "update",
            GroupStateTimeout.NoTimeout)
        if ledger_output:
            return out
        # The ledger's next due times reach the clock through Spark's observed metrics
        # and a listener on this driver (the user's sink writes no hint).
        name = f"sts_clock_{self.namespace}"
        out = out.observe(name, F.collect_list(F.when(F.col("_kind") == STATS,
                                                      F.col("_payload"))).alias("stats"))
        self._watch_clock(name)
        columns = answer_schema(keys).names
        return (out.where((F.col("_table") == ANSWERS) & F.col("_kind").isin(APPEND, MERGE))
                .select(*columns, F.col("_kind").alias(WRITE_COLUMN)))

    def close(self) -> None:
        """Remove the streaming listener :meth:`answers` added (once its query stopped;
        idempotent). :meth:`InferenceQueries.stop` calls it."""
        listener, self._clock_listener = getattr(self, "_clock_listener", None), None
        if listener is not None:
            try:
                self.spark.streams.removeListener(listener)
            except Exception:  # noqa: BLE001 - the session may be gone already
                logger.debug("Removing the clock listener raised.", exc_info=True)

    def _watch_clock(self, name: str) -> None:
        """Register (once) the listener that leaves the clock its hints from the
        answers query's observed metric ``name``."""
        from spark_ext.session import is_connect

        if is_connect(self.spark):  # PySpark 4.2's Connect client drops its listeners
            return  # on the first observed metric: the clock's periodic tick serves
        if getattr(self, "_clock_listener", None) is None:
            self._clock_listener = ClockHints(name, self.hint_path())
            self.spark.streams.addListener(self._clock_listener)

    def delta_writer(self, table: str, *, storage_options: Mapping[str, str] | None = None,
                     writer: str = "auto") -> "DeltaAnswersWriter":
        """A ``foreachBatch`` function that writes :meth:`answers` to one Delta table:
        new answers as blind appends, idempotent per micro-batch (a replayed batch
        writes nothing twice), a backfill as a ``MERGE`` of its row. The table is
        created when missing (partitioned by ``enqueue_hour``, change data feed on).

        Args:
            table: A catalog name (``main.support.answers``) or a path/URI
                (``/data/answers``, ``s3://bucket/answers``).
            storage_options: Object-store settings for delta-rs (``writer='deltalake'``).
            writer: ``spark`` (Delta on Spark), ``deltalake`` (delta-rs from the driver,
                paths only) or ``auto`` (``spark`` where Delta's classes load).

        Example:
            >>> write = llm.delta_writer(str(tmp / "answers"))
            >>> callable(write)
            True
        """
        from spark_ext.l4.writers import choose_writer

        by_path = "/" in table or ":" in table
        output = _OneTableOutput(
            out_dir=self.config.output.checkpoint_dir, writer=writer,
            tables={} if by_path else {"answers": table},
            storage_options=dict(storage_options or self.config.output.storage_options),
            answers_path=table if by_path else "")
        tables = choose_writer(self.spark, output, tuple(self.key_columns))
        return DeltaAnswersWriter(tables, app_id=f"sts-answers-{self._answers_run().id}")

    def answer_batch(self, requests: DataFrame, *, timeout_s: float | None = None
                     ) -> DataFrame:
        """A batch job's answers: submit every row of a static ``requests`` DataFrame,
        then run the answers query until each request has its answer (at the latest until
        the last deadline plus the grace has passed and the safety net answered it), and
        return the answers as a static DataFrame (the answer columns; one row per
        request). The answers query keeps its checkpoint (:meth:`checkpoint`
        ``"answers"``), so a second call goes on from the first.

        Args:
            requests: The rows of :meth:`requests` over a static DataFrame.
            timeout_s: Stop waiting after this long (default: the last deadline, plus
                the grace, plus two clock ticks and a minute).

        Raises:
            PipelineConfigError: ``requests`` is a stream (use :meth:`start`).
        """
        import time

        from pyspark.sql import functions as F

        from spark_ext.l4.answers import answer_schema
        from spark_ext.schemas import spark_schema

        if requests.isStreaming:
            raise PipelineConfigError("answer_batch: the requests are a stream; use start()")
        self._answers_run()  # its run begins before these requests: they are its own
        acks = self.submit(requests).toArrow()  # submitted now; the acks go to the channel
        ids = set(acks.column("request_id").to_pylist())
        last_deadline = max(acks.column("deadline_ts").to_pylist(), default=0) or 0
        grace_ms = self.config.answers.grace_ms
        wait_s = (timeout_s if timeout_s is not None else
                  max(0.0, last_deadline + grace_ms - time.time() * 1000) / 1000
                  + 2 * (self.tick_interval_ms or 0) / 1000 + 60)
        name = f"sts_batch_{self.namespace}"
        query = (self.answers().writeStream.format("memory").queryName(name)
                 .outputMode("update").option("checkpointLocation", self.checkpoint("answers"))
                 .start())
        try:
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if query.exception() is not None:
                    raise query.exception()
                got = {r[0] for r in self.spark.table(name).select("request_id").collect()}
                if ids <= got:
                    break
                time.sleep(0.5)
            rows = self.spark.table(name).where(F.col(WRITE_COLUMN) == "append").toArrow()
        finally:
            query.stop()
            self.close()
        schema = spark_schema(answer_schema(self.key_columns))
        return self.spark.createDataFrame(rows.select(schema.fieldNames()).to_pandas(),
                                          schema)

    # ------------------------------------------------------------------ both queries

    def start(self, requests: DataFrame, *, answers_table: str | None = None,
              answers_writer: Callable[[DataFrame], DataStreamWriter] | None = None,
              acks_writer: Callable[[DataFrame], DataStreamWriter] | None = None,
              trigger_seconds: float = 0.0, warm_up: bool = True) -> InferenceQueries:
        """Start the submit and answers queries with their checkpoints.

        Args:
            requests: The rows of :meth:`requests` (a stream).
            answers_table: Write the answers to this Delta table (name or path,
                :meth:`delta_writer`), or
            answers_writer: your own: a function of the answers DataFrame returning its
                ``DataStreamWriter`` (format and options; the checkpoint, the output
                mode and the query name are set here), e.g. to a Kafka topic.
            acks_writer: The same for the acks (default: ``noop``).
            trigger_seconds: Micro-batch interval of both (0: as fast as they go).
            warm_up: Before the first event is submitted: ask the sidecars from the
                executors whether they serve (a warning names one that does not; it
                also starts the Python workers submission reuses), start the answers
                query and wait (at most a minute) for its first micro-batch, so the
                first requests do not wait for cold queries.

        Returns:
            The two :class:`StreamingQuery` handles.
        """
        if (answers_table is None) == (answers_writer is None):
            raise PipelineConfigError("start: give one of answers_table or answers_writer")
        if warm_up:  # before any query starts
            from spark_ext.submit.channel_check import refuse_channel_mismatch

            refuse_channel_mismatch(self.check_sidecars(), self.config.sidecar.result_channel)
        from spark_ext.submit.executor_ready import announce

        announce(self.spark, self.config.sidecar)  # new executors wait for their sidecar
        acks = self.submit(requests)
        answers = self.answers()
        if answers_table is not None:
            writer = answers.writeStream.foreachBatch(self.delta_writer(answers_table))
        else:
            writer = answers_writer(answers)
        buckets = self.spark.conf.get("spark.sql.shuffle.partitions", None)
        try:  # the ledger's buckets: one shuffle partition each (kept by the checkpoint)
            self.spark.conf.set("spark.sql.shuffle.partitions", str(len(self._buckets())))
            answers_query = self._started(writer, "answers", trigger_seconds)
        finally:
            if buckets is not None:
                self.spark.conf.set("spark.sql.shuffle.partitions", buckets)
        try:
            if warm_up:
                _await_first_batch(answers_query, timeout_s=60.0)
            submit_writer = (acks_writer(acks) if acks_writer is not None
                             else acks.writeStream.format("noop"))
            submit_query = self._started(submit_writer, "submit", trigger_seconds)
        except BaseException:
            answers_query.stop()
            raise
        return InferenceQueries(submit_query, answers_query, self)

    def check_sidecars(self) -> list[dict]:
        """Ask from Python tasks on the executors whether their sidecar serves; a warning
        names each that does not (its requests get the fallback until it does). It also
        starts the Python workers submission reuses.

        Returns:
            One dict per task: ``partition``, ``endpoint``, ``serving``, ``error``,
            ``sidecar_id`` and the sidecar's scale signal.
        """
        from spark_ext.submit.submission import check_sidecars

        rows = check_sidecars(self.spark, self.config.sidecar)
        for r in rows:
            if not r["serving"]:
                logger.warning("Sidecar %s is not serving for task %d%s: its requests get "
                               "the fallback until it is.", r["endpoint"], r["partition"],
                               f" ({r['error']})" if r["error"] else "")
        return rows

    def _buckets(self) -> tuple[int, ...]:
        """The ledger's bucket keys (:mod:`spark_ext.l4.buckets`): those the answers
        checkpoint keeps, else one per task slot (at most 8); read once."""
        from spark_ext.l4.buckets import MAX_BUCKETS, checkpoint_bucket_keys
        from spark_ext.run_ids import is_new_checkpoint
        from spark_ext.session import task_slots

        if getattr(self, "_bucket_keys", None) is None:
            checkpoint = self.checkpoint("answers")
            self._bucket_keys = checkpoint_bucket_keys(
                self.spark, checkpoint, new_run=is_new_checkpoint(self.spark, checkpoint),
                partitions=max(1, min(MAX_BUCKETS, task_slots(self.spark))))
        return self._bucket_keys

    def _started(self, writer: DataStreamWriter, query: str, seconds: float
                 ) -> StreamingQuery:
        writer = (writer.queryName(f"sts-{query}-{self.namespace}")
                  .outputMode("update" if query == "answers" else "append")
                  .option("checkpointLocation", self.checkpoint(query)))
        if seconds > 0:
            writer = writer.trigger(processingTime=f"{seconds} seconds")
        return writer.start()


def _listener_base() -> type:
    from pyspark.sql.streaming import StreamingQueryListener

    return StreamingQueryListener


class ClockHints(_listener_base()):  # type: ignore[misc]
    """A streaming listener that writes the answers query's next due times (its observed
    metric ``name``: the ledger's per-bucket stats) to the clock's hint file, so the
    safety net's fallbacks come on time with any sink, and no micro-batch runs while
    nothing is due."""

    def __init__(self, name: str, hint_path: str) -> None:
        self.name, self.hint_path = name, hint_path

    def onQueryStarted(self, event) -> None:  # noqa: N802 - PySpark's interface
        pass

    def onQueryProgress(self, event) -> None:  # noqa: N802
        import json

        from spark_ext.sources.clock import write_hint

        row = (event.progress.observedMetrics or {}).get(self.name)
        if row is None:
            return
        due = {}
        for payload in row["stats"] or []:
            stats = json.loads(payload)
            due[stats["bucket"]] = stats["next_due_ts"]
        if due:
            try:
                write_hint(self.hint_path, due)
            except OSError as e:  # then the clock's periodic tick is the backstop
                logger.warning("Cannot write the clock hint %s: %s", self.hint_path, e)

    def onQueryIdle(self, event) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event) -> None:  # noqa: N802
        pass


def _await_first_batch(query: StreamingQuery, *, timeout_s: float) -> None:
    """Wait until ``query`` has run a micro-batch (or stopped, or ``timeout_s``)."""
    import time

    deadline = time.monotonic() + timeout_s
    while query.isActive and query.lastProgress is None and time.monotonic() < deadline:
        time.sleep(0.1)


@dataclass
class _OneTableOutput(OutputConfig):
    """An ``output`` section with one answers table, at ``answers_path`` when set."""

    answers_path: str = ""
    """The answers table's path (empty: ``tables['answers']``, a catalog name)."""

    def table(self, name: str) -> str:
        return self.answers_path if name == "answers" and self.answers_path else \
            super().table(name)


@dataclass
class DeltaAnswersWriter:
    """``foreachBatch`` of :meth:`LlmInference.answers` into one Delta table (from
    :meth:`LlmInference.delta_writer`). Plain data (a writer and an id), so it pickles
    to a Spark Connect server, where it then runs.

    Example:
        >>> import pickle
        >>> write = llm.delta_writer(str(tmp / "answers"))
        >>> copy = pickle.loads(pickle.dumps(write))
        >>> type(copy).__name__, copy.app_id == write.app_id, write.app_id[:12]
        ('DeltaAnswersWriter', True, 'sts-answers-')

    Args:
        tables: Who writes the table (:mod:`spark_ext.l4.writers`).
        app_id: Prefix of the Delta app transaction ids (the answers query's run).
    """

    tables: TableWriter
    app_id: str
    created: bool = field(default=False, repr=False)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from spark_ext.java_errors import short_java_errors

        with short_java_errors():  # a stop mid-batch: no Java stack for Spark to parse
            self._write(batch, batch_id)

    def _write(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        from spark_ext.l4.ledger import ANSWERS, APPEND, MERGE

        writer = self.tables
        if not self.created:
            writer.create_tables(batch.sparkSession, names=(ANSWERS,))
            self.created = True
        ledger = (batch.withColumnRenamed(WRITE_COLUMN, "_kind")
                  .withColumn("_table", F.lit(ANSWERS))
                  .withColumn("_payload", F.lit(None).cast("string")))
        frames = writer.frames(ledger)
        try:
            kinds = {r["_kind"] for r in frames.summary() if r.get("n")}
            if APPEND in kinds:
                writer.append(ANSWERS, frames.answers(ANSWERS, APPEND),
                              app_id=f"{self.app_id}/{ANSWERS}", version=batch_id)
            if MERGE in kinds:
                writer.merge_answers(ANSWERS, frames.answers(ANSWERS, MERGE), backfill=True)
        finally:
            frames.release()


__all__ = ["ClockHints", "DeltaAnswersWriter", "InferenceQueries", "LlmInference",
           "query_namespace"]
