"""L1 + L2 for the demo: the router, the knowledge base and the feature table in its folder.

:func:`prepare_fast_path` returns the pipeline config sections that switch L1 routing,
L2 retrieval and the feature lookup on (merged into the demo's
:class:`~spark_ext.config.PipelineConfig`). Training the router and embedding the
articles take ~15 s on two busy cores, so both are built once per input (the shipped
samples, the embedding model) into ``$STS_CACHE_DIR/demo-l1l2/<hash>`` (default
``~/.cache/sts-spark``) and copied into ``out/l1l2`` on later runs.

The prompt stays short for CPU prefill: at most two articles scoring at least 0.5,
each cut to its first sentence, 300 characters in all, placed after the stable
prompt (best first, ties by id), so prefix caching still finds the stable part.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

from sidecar import write_folder_atomically

#: The demo's template with retrieved context (stable part as in ``conf/pipeline.yaml``).
DYNAMIC_WITH_CONTEXT = "{kb_context}Ticket: {text}"
#: Retrieval settings of the demo: short prompts (see the module docstring).
DEMO_RETRIEVAL: dict[str, Any] = {"top_k": 2, "min_score": 0.5, "context_sentences": 1,
                                  "max_context_chars": 300}
#: The demo's L1 rule on the looked-up features: enterprise customers are never ``low``.
DEMO_RULES: list[dict[str, str]] = [{"when": "tier = 'enterprise' AND priority = 'low'",
                                     "priority": "normal"}]
#: The events' schema with the customer id the feature lookup joins on.
DEMO_SCHEMA = "event_id STRING, text STRING, priority STRING, event_ts LONG, customer_id STRING"
#: Bump when what is cached changes shape.
_CACHE_FORMAT = "1"


def _cache_root() -> Path:
    return Path(os.environ.get("STS_CACHE_DIR") or Path.home() / ".cache" / "sts-spark")


def cache_key(*inputs: bytes) -> str:
    """A short hash of everything the cached artefacts depend on.

    Example:
        >>> cache_key(b"a", b"b") == cache_key(b"a", b"b") != cache_key(b"ab")
        True
    """
    h = hashlib.sha256(_CACHE_FORMAT.encode())
    for part in inputs:
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()[:16]


def _build(folder: Path, labelled: Path, articles: Path) -> None:
    from spark_ext.config import EmbeddingConfig, KnowledgeBaseConfig
    from spark_ext.l2.knowledge_base import build_knowledge_base
    from spark_ext.l1.routing import train_router

    model = train_router(labelled, folder / "router.json", EmbeddingConfig())
    print(f"L1 router: held-out priority accuracy {model.metrics['priority_accuracy']:.2f}, "
          f"route accuracy {model.metrics['route_accuracy']:.2f}", flush=True)
    report = build_knowledge_base(articles, KnowledgeBaseConfig(uri=str(folder / "kb.db")),
                                  EmbeddingConfig())
    print(f"L2 knowledge base: {report.articles} articles ({report.faq} FAQ)", flush=True)


def build_cached(folder: Path, labelled: Path, articles: Path) -> bool:
    """Put ``router.json`` and ``kb.db`` into ``folder``: copied from the cache when it
    holds them for these inputs, else built (and cached). Returns whether it was cached."""
    from spark_ext.config import EmbeddingConfig
    from spark_ext.l1.embedding import model_path

    key = cache_key(labelled.read_bytes(), articles.read_bytes(),
                    str(model_path(EmbeddingConfig())).encode())
    cached = _cache_root() / "demo-l1l2" / key
    hit = (cached / "router.json").is_file() and (cached / "kb.db").is_dir()
    if not hit:  # another run may win the race: its folder is kept
        write_folder_atomically(cached, lambda staging: _build(staging, labelled, articles))
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(cached / "router.json", folder / "router.json")
    shutil.rmtree(folder / "kb.db", ignore_errors=True)  # the demo's own earlier copy
    shutil.copytree(cached / "kb.db", folder / "kb.db", ignore=shutil.ignore_patterns("LOCK"))
    return hit


def write_feature_table(path: Path, customers: Path) -> int:
    """The shipped customers (JSON lines) as a Delta table at ``path``; returns the rows."""
    import pyarrow as pa
    from deltalake import write_deltalake

    rows = [json.loads(line) for line in customers.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    table = pa.Table.from_pylist(rows, schema=pa.schema([
        ("customer_id", pa.string()), ("tier", pa.string()), ("open_tickets", pa.int32())]))
    write_deltalake(str(path), table, mode="overwrite")
    return table.num_rows


def prepare_fast_path(out: Path) -> dict[str, dict[str, Any]]:
    """Router, knowledge base (cached, see the module docstring) and the customers'
    feature table under ``out/l1l2``; return the config sections that use them."""
    samples = resources.files("sts_harness").joinpath("samples")
    folder = out / "l1l2"
    with resources.as_file(samples) as root:
        cached = build_cached(folder, root / "l1_labelled.jsonl", root / "kb_articles.jsonl")
        customers = write_feature_table(folder / "customers", root / "customers.jsonl")
    print(f"L1 router and L2 knowledge base in {folder}"
          f"{' (from the cache)' if cached else ''}; features of {customers} customers",
          flush=True)
    return {"routing": {"enabled": True, "model_file": str(folder / "router.json"),
                        "rules": DEMO_RULES},
            "knowledge_base": {"enabled": True, "uri": str(folder / "kb.db"),
                               **DEMO_RETRIEVAL},
            "features": {"enabled": True, "table": str(folder / "customers"),
                         "key": "customer_id"},
            "template": {"dynamic": DYNAMIC_WITH_CONTEXT}}
