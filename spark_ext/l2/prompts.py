"""L2: the request rows: L1's tags, then the prompt, stable part first."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_ext.config import TaggingConfig
from spark_ext.l1.tagging import tag_requests
from spark_ext.l2.template import PromptTemplate

#: Columns every request row carries after :func:`build_requests` (the seed's schema).
REQUEST_COLUMNS: tuple[str, ...] = (
    "request_id", "trace_id", "priority", "enqueue_ts", "deadline_ts", "model", "prompt",
    "max_tokens", "temperature", "cache_key", "callback_topic",
)


def build_requests(df: DataFrame, config: TaggingConfig, template: PromptTemplate, *,
                   namespace: str = "") -> DataFrame:
    """Return ``df`` with the request columns added (existing columns are kept): L1's
    tags (:func:`~spark_ext.l1.tagging.tag_requests`), then ``prompt`` (``template``'s
    stable part first) and ``cache_key`` (the hash of the stable part).

    ``request_id`` is a SHA-256 of ``namespace`` and the key columns, so a replayed
    event maps to the same id and the sidecar and the answer writer drop the replay
    (:func:`~spark_ext.l1.tagging.tag_requests`).

    Usage::

        reqs = build_requests(events, TaggingConfig(), PromptTemplate(
            stable="You triage tickets.\\n", dynamic="Ticket: {text}"))
    """
    tagged = tag_requests(df, config, needs=template.fields, namespace=namespace)
    return (tagged.withColumn("prompt", template.column())
                  .withColumn("cache_key", F.lit(template.cache_key)))
