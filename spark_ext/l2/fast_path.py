"""L1 + L2 in the pipeline: route events, retrieve context, answer what needs no LLM.

Off unless configured (``routing.enabled``, ``knowledge_base.enabled``). When on, the
submit query's events go through one pandas UDF (:func:`fast_path_udf`: embed once,
classify with the L1 model, one Milvus search per Arrow batch), then the L1 rules, before
tagging, and every event gets a final ``route``:

``llm``   submitted to the sidecar (its prompt may carry ``{kb_context}``);
``rule``  answered at once with ``routing.rule_text`` (``answer_source = rule``);
``drop``  answered at once with an empty answer (``answer_source = rule``,
          ``status = dropped``): spam gets a row too, so every event has one;
``kb``    the best hit was an FAQ article at or above ``faq_min_score``: answered
          at once with the article (``answer_source = kb``, ``reason = kb:<id>``).

A rule that routes ``llm`` explicitly does not stop the FAQ short-circuit; ``rule`` and
``drop`` win over ``kb``.
"""

from __future__ import annotations

import collections
import functools
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa

from spark_ext.config import PipelineConfig
from spark_ext.exceptions import PipelineConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Final routes: the L1 ones plus ``kb`` (answered by L2).
FINAL_ROUTES: tuple[str, ...] = ("llm", "rule", "drop", "kb")
#: Retrieval columns only L2's own answers use: not sent with, nor recorded for,
#: a submitted request (``kb_ids`` is, as an attribute).
KB_ONLY_COLUMNS: tuple[str, ...] = ("kb_texts", "kb_context", "kb_answer", "kb_answer_id")


def enabled(config: PipelineConfig) -> bool:
    """Whether L1 routing or L2 retrieval runs in the pipeline."""
    return config.routing.enabled or config.knowledge_base.enabled


#: Modules each layer needs (the ``l1l2`` extra): layer -> (section, modules).
_LAYER_MODULES = {"routing": ("sentence_transformers", "sklearn"),
                  "knowledge_base": ("sentence_transformers", "pymilvus")}


def require_modules(config: PipelineConfig) -> None:
    """Refuse, at start and in one line naming the extra, an enabled layer whose modules
    are not installed (never an ImportError inside a Spark task).

    Raises:
        PipelineConfigError: ``routing.enabled`` or ``knowledge_base.enabled`` without
            the ``l1l2`` extra.
    """
    import importlib.util

    from spark_ext.exceptions import PipelineConfigError

    for section, modules in _LAYER_MODULES.items():
        if not getattr(config, section).enabled:
            continue
        if missing := [m for m in modules if importlib.util.find_spec(m) is None]:
            raise PipelineConfigError(
                f"{section}.enabled needs module {missing[0]!r}: pip install "
                "'sts-spark[spark,l1l2]' on the driver and the executors")


def _model_file(config: PipelineConfig) -> str | None:
    """The L1 classifier's file (absolute), or ``None`` when routing uses no model."""
    routing = config.routing
    return str(Path(routing.model_file).resolve()) \
        if routing.enabled and routing.model_file else None


def open_in_worker(config: PipelineConfig) -> str:
    """Load what the fast path keeps per Python process: the embedding model, the L1
    classifier and this process's knowledge-base reader (each cached, so a second call
    costs nothing), then freeze them out of the per-task garbage collection
    (:mod:`spark_ext.worker_gc`). Returns the device the model is on."""
    from spark_ext.l1.embedding import load_encoder, task_device
    from spark_ext.l2.knowledge_base import shared_reader
    from spark_ext.l1.routing import cached_model
    from spark_ext.worker_gc import freeze_loaded

    device = task_device(config.embedding.device)
    load_encoder(config.embedding, device)
    if model_file := _model_file(config):
        cached_model(model_file)
    if config.knowledge_base.enabled:
        shared_reader(config.knowledge_base)
    # PySpark collects garbage after every task: not through the model each time.
    freeze_loaded(f"fast_path {config.embedding.model} {_model_file(config)} "
                  f"{config.knowledge_base.uri if config.knowledge_base.enabled else ''}")
    return device


#: Spark type of the L1 part of the fused UDF.
_L1_TYPE = ("priority string, route string, priority_confidence float, "
            "route_confidence float")


def fast_path_udf(config: PipelineConfig) -> Any:
    """One pandas UDF ``text -> struct`` doing L1 and L2 in one Python pass per Arrow
    batch: embed once, classify (when ``routing.model_file`` is set), one Milvus search
    (when ``knowledge_base.enabled``). One UDF keeps one Python worker per task, so each
    worker loads the model once (three chained UDFs spread a task over three workers,
    each of which may end up loading it)."""
    import numpy as np
    from pyspark.sql import functions as F

    from spark_ext.l1.embedding import embed_texts
    from spark_ext.l2.knowledge_base import KnowledgeBaseReader, shared_reader
    from spark_ext.l2.retrieval import RETRIEVAL_TYPE, retrieval_rows
    from spark_ext.l1.routing import RouterModel, cached_model

    embedding, kb = config.embedding, config.knowledge_base
    model_file = _model_file(config)
    if model_file:
        RouterModel.load(model_file)  # fail on the driver, not in a task
    if kb.enabled:
        KnowledgeBaseReader(kb).close()
    parts = [p for p, on in ((_L1_TYPE, bool(model_file)), (RETRIEVAL_TYPE, kb.enabled)) if on]

    @F.pandas_udf(", ".join(parts))  # type: ignore[call-overload]
    def l1l2(batches: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
        device = open_in_worker(config)
        for texts in batches:
            x = embed_texts(texts.tolist(), embedding, device=device)
            cols: dict[str, Any] = {}
            if model_file:
                out = cached_model(model_file).predict(x)
                cols.update(priority=out["priority"][0], route=out["route"][0],
                            priority_confidence=out["priority"][1].astype(np.float32),
                            route_confidence=out["route"][1].astype(np.float32))
            if kb.enabled:
                hits = shared_reader(kb).search(x, kb.top_k) if len(x) else []
                cols.update(retrieval_rows(hits, kb))
            yield pd.DataFrame(cols)

    return l1l2


def apply_fast_path(events: "DataFrame", config: PipelineConfig) -> "DataFrame":
    """``events`` with ``route`` (see the module docstring) and, per section enabled,
    the routing and retrieval columns, computed by :func:`fast_path_udf`."""
    from pyspark.sql import functions as F

    from spark_ext.l2.retrieval import RETRIEVAL_COLUMNS
    from spark_ext.l1.routing import apply_rules

    routing, kb = config.routing, config.knowledge_base
    model = routing.enabled and bool(routing.model_file)
    texts = {c for c, on in ((routing.text_column, model), (kb.text_column, kb.enabled)) if on}
    if len(texts) > 1:
        raise PipelineConfigError(f"routing.text_column and knowledge_base.text_column differ "
                                  f"({sorted(texts)}): L1 and L2 share one embedding")
    if missing := texts - set(events.columns):
        raise PipelineConfigError(f"text column {sorted(missing)} is not a column of the "
                                  f"events ({events.columns})")
    out = events
    if texts:
        text = F.col(next(iter(texts))).cast("string")
        out = out.withColumn("_l1l2", fast_path_udf(config)(text))
    if model:
        for c in ("priority", "route", "priority_confidence", "route_confidence"):
            out = out.withColumn(c, F.col(f"_l1l2.{c}"))
    else:
        out = out.withColumn("route", F.lit("llm"))
    if kb.enabled:
        for c in RETRIEVAL_COLUMNS:
            out = out.withColumn(c, F.col(f"_l1l2.{c}"))
    if routing.enabled:
        out = apply_rules(out, routing)
    if kb.enabled:
        out = out.withColumn("route", F.when((F.col("route") == "llm")
                                             & F.col("kb_answer").isNotNull(), F.lit("kb"))
                             .otherwise(F.col("route")))
    return out.drop("_l1l2")  # a no-op when nothing was computed


def warm_up(spark: "SparkSession", config: PipelineConfig) -> None:
    """Run the fast path once over a tiny batch with one partition per core, so the Python
    workers load the embedding model (and open the knowledge base) before the first
    micro-batch: a cold worker spends tens of seconds on it, which would count against
    the first events' deadlines. It runs in the workers the streaming queries get
    (:func:`spark_ext.worker_pool.warm_up_workers`; on Spark Connect a batch job's are
    others), its rows under ``<checkpoint_dir>/fast-path-warm-up/``."""
    from pyspark.sql import functions as F

    from spark_ext.session import task_slots
    from spark_ext.worker_pool import warm_up_workers

    n = task_slots(spark)
    # the rules may name columns of the events or features that this batch lacks
    config = replace(config, routing=replace(config.routing, rules=[]))
    columns = list(dict.fromkeys([config.routing.text_column,
                                  config.knowledge_base.text_column, "priority"]))
    # One row in each of n partitions (repartition(n) may leave one empty: a task that
    # opens nothing).
    df = spark.range(n, numPartitions=n).select(
        *[F.lit("normal" if c == "priority" else "hello").alias(c) for c in columns])

    def build(rows: "DataFrame") -> "DataFrame":
        out = apply_fast_path(rows, config)
        # Spark pools its Python workers and hands an idle one to any Python operator of
        # any query (the results source, the submission, this UDF), so a worker that
        # never ran the UDF may get it inside a micro-batch and open the model and the
        # knowledge base there (measured: 0.4-0.7 s each, in the first micro-batches).
        # Each chained operator below holds a worker of its own while its task runs,
        # and opens them too.
        for _ in range(WARM_WORKERS_PER_TASK - 1):
            out = out.mapInArrow(functools.partial(_open_then_pass, config), out.schema)
        return out

    tag = hashlib.sha1(f"{n}:{','.join(columns)}".encode()).hexdigest()[:10]
    warm_up_workers(spark, df, build, config.output.checkpoint(f"fast-path-warm-up/{tag}"))


#: Python workers per task slot that :func:`warm_up` opens the fast path in: the fast
#: path's UDF, the submission's ``mapInArrow`` and the results source can each hold one.
WARM_WORKERS_PER_TASK = 3


def _open_then_pass(config: PipelineConfig, batches: Iterator[pa.RecordBatch]
                    ) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` body that opens the fast path in its worker
    (:func:`open_in_worker`) and passes the rows through."""
    open_in_worker(config)
    yield from batches


@dataclass
class FastPathStats:
    """What L1 and L2 decided for the events of the submit micro-batches so far (a
    replayed micro-batch counts again)."""

    events: int = 0
    """Events routed."""

    routes: collections.Counter[str] = field(default_factory=collections.Counter)
    """Events per final route (:data:`FINAL_ROUTES`)."""

    retrieved: int = 0
    """Events that went through retrieval."""

    with_hit: int = 0
    """Events with at least one article at or above ``knowledge_base.min_score``."""

    top_score_sum: float = 0.0
    """Sum of the best similarity per retrieved event (for the mean)."""

    def add(self, table: pa.Table) -> None:
        """Count the rows of ``table`` (columns ``route`` and, with retrieval, ``kb_ids``
        and ``kb_top_score``).

        Example:
            >>> stats = FastPathStats()
            >>> stats.add(pa.table({"route": ["kb", "llm", "rule"],
            ...                     "kb_ids": [["f1"], ["a", "b"], []],
            ...                     "kb_top_score": [0.9, 0.6, 0.3]}))
            >>> stats.summary()
            {'events': 3, 'routes': {'kb': 1, 'llm': 1, 'rule': 1}, 'hit_share': 0.6667, \
'kb_share': 0.3333, 'mean_top_score': 0.6}
        """
        if "route" not in table.column_names or table.num_rows == 0:
            return
        self.events += table.num_rows
        self.routes.update(table.column("route").to_pylist())
        if "kb_ids" in table.column_names:
            ids = table.column("kb_ids").to_pylist()
            self.retrieved += len(ids)
            self.with_hit += sum(1 for i in ids if i)
        if "kb_top_score" in table.column_names:
            self.top_score_sum += sum(x for x in table.column("kb_top_score").to_pylist()
                                      if x is not None)

    def clear(self) -> None:
        """Forget what was counted (a demo's warm-up events, say)."""
        self.events = self.retrieved = self.with_hit = 0
        self.top_score_sum = 0.0
        self.routes.clear()

    def summary(self) -> dict[str, Any]:
        """Counts and shares: ``hit_share`` (events with a hit), ``kb_share`` (answered
        from an FAQ article), ``mean_top_score`` (best similarity); ``None`` without
        retrieval."""
        n = self.retrieved
        return {"events": self.events, "routes": dict(sorted(self.routes.items())),
                "hit_share": round(self.with_hit / n, 4) if n else None,
                "kb_share": round(self.routes["kb"] / n, 4) if n else None,
                "mean_top_score": round(self.top_score_sum / n, 4) if n else None}
