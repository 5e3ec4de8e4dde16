"""L2: retrieval from the knowledge base as a pandas UDF, one Milvus search per batch.

:func:`retrieve` adds to each event the ``top_k`` best articles of
:mod:`spark_ext.l2.knowledge_base` that score at least ``min_score`` (``kb_ids``,
``kb_scores``, ``kb_texts``), the best score of all (``kb_top_score``), the
retrieved context for the prompt (``kb_context``) and, when the best hit is an FAQ
article at or above ``faq_min_score``, that article's answer (``kb_answer``: the event
can be answered without the LLM, ``answer_source = kb``).

Each Arrow batch becomes one Milvus search call with all its query vectors (not one
per row). The reader is opened once per Python worker (for Milvus Lite a private copy
of the published database, see :mod:`spark_ext.l2.knowledge_base`) and follows rebuilds.

The context keeps prefix caching intact: the template's stable part comes first and
never changes, the context follows it in a deterministic order (score, then id), then
the event. Use ``{kb_context}`` in ``template.dynamic`` before the event's fields.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from spark_ext.config import RETRIEVAL_COLUMNS, EmbeddingConfig, KnowledgeBaseConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["RETRIEVAL_COLUMNS"]  # the columns :func:`retrieve` adds (spark_ext.config)

#: Spark type of the retrieval UDF's result.
RETRIEVAL_TYPE = ("kb_ids array<string>, kb_scores array<float>, kb_texts array<string>, "
                  "kb_context string, kb_answer string, kb_answer_id string, "
                  "kb_top_score float")


def first_sentences(text: str, n: int) -> str:
    """The first ``n`` sentences of ``text`` (``n`` = 0: all of it).

    Example:
        >>> first_sentences("Orders ship in 2 days. Returns take 30 days. Call us.", 2)
        'Orders ship in 2 days. Returns take 30 days.'
        >>> first_sentences("Pay 3.5 EUR per month", 1)
        'Pay 3.5 EUR per month'
    """
    if n <= 0:
        return text
    parts = _SENTENCE_END.split(text.strip(), maxsplit=n)
    return " ".join(parts[:n]).strip()


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def render_context(hits: Sequence[dict[str, Any]], max_chars: int, *, sentences: int = 0
                   ) -> str:
    """The retrieved articles as prompt context, best first (ties by id), each cut to
    its first ``sentences`` (0: whole), all cut at ``max_chars``; empty when there are
    no hits.

    Example:
        >>> hits = [{"id": "b", "score": 0.5, "title": "Returns", "text": "30 days. Free."},
        ...         {"id": "a", "score": 0.5, "title": "Refunds", "text": "5 days."}]
        >>> print(render_context(hits, 200))
        Context:
        [a] Refunds: 5 days.
        [b] Returns: 30 days. Free.
        <BLANKLINE>
        >>> render_context(hits, 200, sentences=1).splitlines()[2]
        '[b] Returns: 30 days.'
        >>> render_context(hits, 20)
        'Context:\\n[a]\\n'
    """
    if not hits or max_chars <= 0:
        return ""
    ordered = sorted(hits, key=lambda h: (-round(float(h["score"]), 6), str(h["id"])))
    lines = [f"[{h['id']}] {h['title']}: {first_sentences(str(h['text']), sentences)}"
             for h in ordered]
    text = "Context:\n" + "\n".join(lines)
    if len(text) > max_chars:
        text = text[:max_chars].rsplit(" ", 1)[0]
    return text + "\n"


def faq_answer(hits: Sequence[dict[str, Any]], min_score: float) -> tuple[str, str] | None:
    """``(answer, article id)`` when the best hit is an FAQ article scoring at least
    ``min_score``, else ``None``.

    Example:
        >>> faq_answer([{"id": "f1", "score": 0.91, "faq": True, "answer": "Yes."}], 0.8)
        ('Yes.', 'f1')
        >>> faq_answer([{"id": "f1", "score": 0.7, "faq": True, "answer": "Yes."}], 0.8) is None
        True
    """
    if hits and hits[0].get("faq") and float(hits[0]["score"]) >= min_score:
        return str(hits[0].get("answer") or hits[0].get("text") or ""), str(hits[0]["id"])
    return None


def retrieval_rows(hits_per_row: Sequence[Sequence[dict[str, Any]]], kb: KnowledgeBaseConfig
                   ) -> dict[str, list[Any]]:
    """The retrieval columns (:data:`RETRIEVAL_COLUMNS`) for a batch of search results."""
    cols: dict[str, list[Any]] = {c: [] for c in RETRIEVAL_COLUMNS}
    for found in hits_per_row:
        cols["kb_top_score"].append(max((float(h["score"]) for h in found), default=None))
        hits = [h for h in found if float(h["score"]) >= kb.min_score]
        cols["kb_ids"].append([str(h["id"]) for h in hits])
        cols["kb_scores"].append([float(h["score"]) for h in hits])
        cols["kb_texts"].append([str(h["text"]) for h in hits])
        cols["kb_context"].append(render_context(hits, kb.max_context_chars,
                                                 sentences=kb.context_sentences))
        answer = faq_answer(found, kb.faq_min_score)
        cols["kb_answer"].append(answer[0] if answer else None)
        cols["kb_answer_id"].append(answer[1] if answer else None)
    return cols


def retrieval_udf(kb: KnowledgeBaseConfig) -> Any:
    """A pandas UDF ``embedding -> struct`` (:data:`RETRIEVAL_TYPE`): one Milvus search
    per Arrow batch, the reader opened once per Python worker."""
    import numpy as np
    from pyspark.sql import functions as F

    from spark_ext.l2.knowledge_base import KnowledgeBaseReader, shared_reader

    KnowledgeBaseReader(kb).close()  # fail on the driver (no database, no collection)

    @F.pandas_udf(RETRIEVAL_TYPE)  # type: ignore[call-overload]
    def search(batches: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
        for vectors in batches:
            reader = shared_reader(kb)  # refreshed when a rebuild was published
            if len(vectors):
                hits = reader.search(np.stack(vectors.to_numpy()), kb.top_k)
            else:
                hits = []
            yield pd.DataFrame(retrieval_rows(hits, kb))

    return search


def retrieve(df: "DataFrame", kb: KnowledgeBaseConfig, embedding: EmbeddingConfig, *,
             embedding_column: str = "embedding") -> "DataFrame":
    """``df`` with :data:`RETRIEVAL_COLUMNS` added (see the module docstring).

    ``embedding_column`` is computed from ``kb.text_column`` when missing (L1 may
    have added it already; it is reused, not recomputed).

    Raises:
        KnowledgeBaseError: No knowledge base or collection at ``kb.uri``.

    Usage::

        kb = KnowledgeBaseConfig(uri="./sts-kb/kb.db")
        with_context = retrieve(events, kb, EmbeddingConfig())
    """
    from pyspark.sql import functions as F

    from spark_ext.l1.embedding import embed_column

    if kb.text_column not in df.columns:
        raise ValueError(f"knowledge_base.text_column={kb.text_column!r} is not a column of "
                         f"the events ({df.columns})")
    out = df
    if embedding_column not in out.columns:
        out = out.withColumn(embedding_column, embed_column(kb.text_column, embedding))
    out = out.withColumn("_l2", retrieval_udf(kb)(F.col(embedding_column)))
    for c in RETRIEVAL_COLUMNS:
        out = out.withColumn(c, F.col(f"_l2.{c}"))
    return out.drop("_l2")
