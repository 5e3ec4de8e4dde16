"""L1 + L2 for the demo: train the router and build the knowledge base into its folder.

:func:`prepare_fast_path` returns the pipeline config sections that switch L1 routing
and L2 retrieval on (merged into the demo's :class:`~spark_ext.config.PipelineConfig`),
with the retrieved context placed after the stable prompt.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

#: The demo's template with retrieved context (stable part as in ``conf/pipeline.yaml``).
DYNAMIC_WITH_CONTEXT = "{kb_context}Ticket: {text}"


def prepare_fast_path(out: Path) -> dict[str, dict[str, Any]]:
    """Train the L1 router on the shipped labelled tickets and build the shipped articles
    into Milvus Lite under ``out/l1l2``; return the config sections that use them."""
    from spark_ext.config import EmbeddingConfig, KnowledgeBaseConfig
    from spark_ext.knowledge_base import build_knowledge_base
    from spark_ext.routing import train_router

    samples = resources.files("sts_harness").joinpath("samples")
    folder = out / "l1l2"
    router = folder / "router.json"
    model = train_router(str(samples.joinpath("l1_labelled.jsonl")), router, EmbeddingConfig())
    print(f"L1 router: held-out priority accuracy {model.metrics['priority_accuracy']:.2f}, "
          f"route accuracy {model.metrics['route_accuracy']:.2f}", flush=True)
    kb = KnowledgeBaseConfig(uri=str(folder / "kb.db"))
    report = build_knowledge_base(str(samples.joinpath("kb_articles.jsonl")), kb,
                                  EmbeddingConfig())
    print(f"L2 knowledge base: {report.articles} articles ({report.faq} FAQ) in {kb.uri}",
          flush=True)
    return {"routing": {"enabled": True, "model_file": str(router)},
            "knowledge_base": {"enabled": True, "uri": kb.uri},
            "template": {"dynamic": DYNAMIC_WITH_CONTEXT}}
