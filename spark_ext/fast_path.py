"""L1 + L2 in the pipeline: route events, retrieve context, answer what needs no LLM.

Off unless configured (``routing.enabled``, ``knowledge_base.enabled``). When on, the
submit query's events go through :func:`spark_ext.routing.route_events` and
:func:`spark_ext.retrieval.retrieve` (one embedding per event, shared by both) before
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

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from spark_ext.config import PipelineConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Final routes: the L1 ones plus ``kb`` (answered by L2).
FINAL_ROUTES: tuple[str, ...] = ("llm", "rule", "drop", "kb")
#: ``status`` of the answer row of a dropped event.
DROPPED = "dropped"


def enabled(config: PipelineConfig) -> bool:
    """Whether L1 routing or L2 retrieval runs in the pipeline."""
    return config.routing.enabled or config.knowledge_base.enabled


def apply_fast_path(events: "DataFrame", config: PipelineConfig) -> "DataFrame":
    """``events`` with ``route`` (see the module docstring) and, per section enabled,
    the routing and retrieval columns; the embedding column is dropped at the end."""
    from pyspark.sql import functions as F

    from spark_ext.retrieval import retrieve
    from spark_ext.routing import route_events

    out = events
    if config.routing.enabled:
        out = route_events(out, config.routing, config.embedding,
                           embedding_column="_embedding", priority_column="priority")
    else:
        out = out.withColumn("route", F.lit("llm"))
    if config.knowledge_base.enabled:
        out = retrieve(out, config.knowledge_base, config.embedding,
                       embedding_column="_embedding")
        out = out.withColumn("route", F.when((F.col("route") == "llm")
                                             & F.col("kb_answer").isNotNull(), F.lit("kb"))
                             .otherwise(F.col("route")))
    return out.drop("_embedding")


def warm_up(spark: "SparkSession", config: PipelineConfig) -> None:
    """Run the fast path once over a tiny batch with one partition per core, so the Python
    workers load the embedding model (and open the knowledge base) before the first
    micro-batch: a cold worker spends tens of seconds on it, which would count against
    the first events' deadlines."""
    n = max(1, spark.sparkContext.defaultParallelism)
    columns = list(dict.fromkeys([config.routing.text_column,
                                  config.knowledge_base.text_column, "priority"]))
    rows = [tuple("normal" if c == "priority" else "hello" for c in columns)] * n
    df = spark.createDataFrame(rows, ", ".join(f"`{c}` STRING" for c in columns)).repartition(n)
    apply_fast_path(df, config).write.format("noop").mode("overwrite").save()


def fast_answers(rows: Iterable[Mapping[str, Any]], *, key_columns: list[str], rule_text: str
                 ) -> list[dict]:
    """Answer rows (for :meth:`AnswerStore.record_answers`) for tagged request rows whose
    route is not ``llm``.

    Example:
        >>> rows = [{"request_id": "r1", "trace_id": "r1", "priority": "low", "route": "rule",
        ...          "enqueue_ts": 1, "deadline_ts": 9, "event_id": "e1"},
        ...         {"request_id": "r2", "route": "kb", "kb_answer": "Yes.",
        ...          "kb_answer_id": "faq-1", "event_id": "e2"},
        ...         {"request_id": "r3", "route": "llm", "event_id": "e3"}]
        >>> [(a["answer"], a["answer_source"], a["status"], a["reason"])
        ...  for a in fast_answers(rows, key_columns=["event_id"], rule_text="Hi!")]
        [('Hi!', 'rule', 'ok', 'rule'), ('Yes.', 'kb', 'ok', 'kb:faq-1')]
    """
    out = []
    for r in rows:
        route = r.get("route")
        if route == "llm" or route is None:
            continue
        if route == "kb":
            answer, source, status, reason = (r.get("kb_answer"), "kb", "ok",
                                              f"kb:{r.get('kb_answer_id')}")
        elif route == "rule":
            answer, source, status, reason = rule_text, "rule", "ok", "rule"
        else:
            answer, source, status, reason = "", "rule", DROPPED, "drop"
        row = {"request_id": r["request_id"], "trace_id": r.get("trace_id"),
               "priority": r.get("priority"), "answer": answer, "answer_source": source,
               "status": status, "reason": reason, "fallback_text": None,
               "enqueue_ts": r.get("enqueue_ts"), "submit_ts": None, "received_ts": None,
               "finish_ts": None, "deadline_ts": r.get("deadline_ts")}
        row.update({k: r.get(k) for k in key_columns if k not in row})
        out.append(row)
    return out
