"""``sts l1 train``, ``sts kb build`` and ``sts kb search``: thin shells around
:mod:`spark_ext.l1.routing` and :mod:`spark_ext.l2.knowledge_base`.

Registered by :func:`sts_harness.commands.register`. Settings come from the
``embedding``, ``routing`` and ``knowledge_base`` sections of a pipeline config
(``--config``), flags override them. Bad input ends with one line on stderr and exit
code 2, nothing written.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

#: What the commands print when the ``l1l2`` extra (model, Milvus) is not installed.
EXTRA_HINT = "install L1/L2 with: pip install 'sts-spark[spark,l1l2]'"


def _sample(name: str) -> str:
    return str(resources.files("sts_harness").joinpath(f"samples/{name}"))


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``sts l1`` and ``sts kb`` to the ``sts`` parser."""
    l1 = sub.add_parser("l1", help="L1 routing: train the classifier")
    l1_sub = l1.add_subparsers(dest="l1_command", required=True)
    train = l1_sub.add_parser("train", help="train priority/route on labelled tickets")
    train.add_argument("--input", default=_sample("l1_labelled.jsonl"),
                       help="JSON lines: text, priority, route (default: the shipped samples)")
    train.add_argument("--out", default="./sts-l1/router.json", help="model file to write")
    train.add_argument("--holdout", type=float, default=0.25, help="held-out share")
    _common(train)
    train.set_defaults(func=_run_train)

    kb = sub.add_parser("kb", help="L2 knowledge base in Milvus (Milvus Lite by default)")
    kb_sub = kb.add_subparsers(dest="kb_command", required=True)
    build = kb_sub.add_parser("build", help="create or replace the collection from a file")
    build.add_argument("--input", default=_sample("kb_articles.jsonl"),
                       help="JSON lines: id, title, text[, faq, answer] (default: the samples)")
    _common(build, kb=True)
    build.set_defaults(func=_run_build)
    search = kb_sub.add_parser("search", help="the best articles for a question")
    search.add_argument("question", help="the question, in quotes")
    search.add_argument("--top-k", type=int, default=None, help="articles to show")
    search.add_argument("--json", action="store_true", help="print the hits as JSON")
    _common(search, kb=True)
    search.set_defaults(func=_run_search)


def _common(p: argparse.ArgumentParser, *, kb: bool = False) -> None:
    p.add_argument("--config", type=Path, default=None,
                   help="pipeline YAML whose embedding/knowledge_base sections to use")
    p.add_argument("--model", default=None, help="local sentence-transformers folder "
                   "(default: the packaged MiniLM-L6-v2)")
    if kb:
        p.add_argument("--uri", default=None,
                       help="Milvus Lite path (*.db) or server address (default ./sts-kb/kb.db)")
        p.add_argument("--collection", default=None, help="collection name")


def _configs(args: argparse.Namespace):  # -> (EmbeddingConfig, KnowledgeBaseConfig)
    import dataclasses

    from spark_ext.config import PipelineConfig

    config = PipelineConfig.from_yaml(args.config) if args.config else PipelineConfig()
    embedding, kb = config.embedding, config.knowledge_base
    if args.model:
        embedding = dataclasses.replace(embedding, model=args.model)
    overrides = {k: v for k, v in (("uri", getattr(args, "uri", None)),
                                   ("collection", getattr(args, "collection", None))) if v}
    return embedding, dataclasses.replace(kb, **overrides)


def _fail(command: str, e: Exception) -> int:
    print(f"sts {command}: {e}", file=sys.stderr)
    return 2


def _quiet() -> None:
    """Keep the libraries' start-up chatter (faiss CPU probing, Milvus Lite's in-process
    server, its unimplemented-RPC log line) off the command's output."""
    from spark_ext.l2.knowledge_base import quiet_library_noise

    quiet_library_noise()


def _guarded(command: str, run) -> int:
    _quiet()
    try:
        from spark_ext.exceptions import StsSparkError
    except ImportError as e:
        return _fail(command, ImportError(f"needs module {e.name!r}; {EXTRA_HINT}"))
    try:
        return run()
    except ImportError as e:
        return _fail(command, ImportError(f"needs module {e.name!r}; {EXTRA_HINT}"))
    except (StsSparkError, ValueError, OSError) as e:
        return _fail(command, e)


def _run_train(args: argparse.Namespace) -> int:
    def run() -> int:
        from spark_ext.l1.routing import train_router

        embedding, _ = _configs(args)
        model = train_router(args.input, args.out, embedding, holdout=args.holdout)
        m = model.metrics
        print(f"trained on {m['train']} of {m['examples']} examples, held out {m['held_out']}: "
              f"priority accuracy {m['priority_accuracy']:.3f}, "
              f"route accuracy {m['route_accuracy']:.3f} ({m['seconds']:.1f} s)")
        print(f"wrote {args.out}")
        return 0
    return _guarded("l1 train", run)


def _run_build(args: argparse.Namespace) -> int:
    def run() -> int:
        from spark_ext.l2.knowledge_base import build_knowledge_base

        embedding, kb = _configs(args)
        r = build_knowledge_base(args.input, kb, embedding)
        print(f"built {r.uri} collection {r.collection}: {r.articles} articles ({r.faq} FAQ), "
              f"{r.dim}-d vectors, {r.seconds:.1f} s")
        return 0
    return _guarded("kb build", run)


def _run_search(args: argparse.Namespace) -> int:
    def run() -> int:
        from spark_ext.l2.knowledge_base import search_text
        from spark_ext.l2.retrieval import faq_answer

        embedding, kb = _configs(args)
        if args.top_k is not None and args.top_k < 1:
            raise ValueError(f"--top-k {args.top_k} must be >= 1")
        hits = search_text(args.question, kb, embedding, top_k=args.top_k)
        if args.json:
            print(json.dumps(hits, indent=1))
            return 0
        for h in hits:
            kind = "FAQ" if h["faq"] else "   "
            print(f"{h['score']:.3f} {kind} {h['id']}: {h['title']}")
        answer = faq_answer(hits, kb.faq_min_score)
        print(f"answered from the knowledge base ({answer[1]}): {answer[0]}" if answer else
              f"no FAQ answer at or above {kb.faq_min_score}: goes to the LLM with this context")
        return 0
    return _guarded("kb search", run)
