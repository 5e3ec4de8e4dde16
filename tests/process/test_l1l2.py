"""L1 routing and L2 retrieval with the real MiniLM model, real Milvus Lite databases
and real local Spark (no mocks). Milvus Lite runs a server inside each process that
opens a database, so these tests live with the process tests."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from sidecar.cli import main as sts
from spark_ext.config import EmbeddingConfig, KnowledgeBaseConfig, PipelineConfig, RoutingConfig
from spark_ext.l1.embedding import embed_column, embed_texts, resolve_device
from spark_ext.exceptions import (
    EmbeddingModelError,
    InputFileError,
    KnowledgeBaseError,
    RoutingModelError,
)
from spark_ext.l2.knowledge_base import KnowledgeBaseReader, build_knowledge_base, search_text
from spark_ext.l2.retrieval import retrieve
from spark_ext.l1.routing import RouterModel, route_events, train_router
from tests.utils import REPO

pytestmark = pytest.mark.timeout(300)

SAMPLES = REPO / "sts_harness" / "samples"
ARTICLES = SAMPLES / "kb_articles.jsonl"
LABELLED = SAMPLES / "l1_labelled.jsonl"
EMB = EmbeddingConfig()

TEXTS = ["Hi there!", "WIN a FREE iPhone now!!! Click http://bit.ly/x3",
         "Do you ship to Japan?", "Someone changed the email on my account without my permission.",
         "The kettle I bought stopped working after 4 days.", "Thanks a lot, that solved it."]


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory) -> KnowledgeBaseConfig:
    """The shipped sample knowledge base in a fresh Milvus Lite database."""
    config = KnowledgeBaseConfig(uri=str(tmp_path_factory.mktemp("kb") / "kb.db"))
    build_knowledge_base(ARTICLES, config, EMB)
    return config


@pytest.fixture(scope="module")
def router_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The L1 classifier trained by `sts l1 train` on the shipped labelled tickets."""
    out = tmp_path_factory.mktemp("l1") / "router.json"
    assert sts(["l1", "train", "--input", str(LABELLED), "--out", str(out)]) == 0
    return out


def _count(kb: KnowledgeBaseConfig) -> int:
    reader = KnowledgeBaseReader(kb)
    try:
        return reader.count()
    finally:
        reader.close()


# ------------------------------------------------------------------ embedding


def test_embedding_udf_in_spark_matches_the_model(spark) -> None:
    texts = [*TEXTS, None, "x" * 3000] * 2
    df = spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "i INT, text STRING")
    rows = (df.repartition(2).withColumn("embedding", embed_column("text", EMB))
              .orderBy("i").collect())
    got = np.array([r.embedding for r in rows], dtype=np.float32)
    want = embed_texts(texts, EMB, device="cpu")
    assert got.shape == (len(texts), 384)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_model_that_is_not_a_local_folder_is_refused_not_downloaded() -> None:
    with pytest.raises(EmbeddingModelError, match="not a local folder"):
        embed_texts(["x"], EmbeddingConfig(model="sentence-transformers/all-MiniLM-L6-v2"))
    with pytest.raises(EmbeddingModelError, match="no CUDA device"):
        resolve_device("cuda", task_gpus=[], visible=None, cuda_count=0)


# ------------------------------------------------------------------ knowledge base


def test_kb_search_finds_the_faq_article_and_answers_from_it(kb: KnowledgeBaseConfig) -> None:
    hits = search_text("Do you ship to Japan?", kb, EMB)
    assert [h["id"] for h in hits][0] == "faq-shipping-countries"
    assert len(hits) == kb.top_k and hits[0]["faq"] and hits[0]["score"] >= kb.faq_min_score
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    hits = search_text("My card was charged 3 times for order #12345", kb, EMB)
    assert hits[0]["id"] == "kb-double-charge" and not hits[0]["faq"]


def test_kb_build_is_idempotent_and_a_rebuild_replaces_the_articles(
        tmp_path: Path, kb: KnowledgeBaseConfig) -> None:
    config = KnowledgeBaseConfig(uri=str(tmp_path / "kb.db"))
    build_knowledge_base(ARTICLES, config, EMB)
    reader = KnowledgeBaseReader(config)  # open while the next builds publish
    try:
        build_knowledge_base(ARTICLES, config, EMB)
        assert _count(config) == 36
        three = tmp_path / "three.jsonl"
        three.write_text("".join(line + "\n" for line in
                                 ARTICLES.read_text().splitlines()[:3]), encoding="utf-8")
        build_knowledge_base(three, config, EMB)
        assert _count(config) == 3
        assert reader.count() == 36  # its private copy is untouched until it refreshes
        assert reader.refresh_if_rebuilt() and reader.count() == 3
    finally:
        reader.close()
    assert not list(tmp_path.glob(".kb.*")), "staging folders are cleaned up"


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("", r"no articles \(the file is empty\)"),
    ("\n  \n", r"no articles \(the file is empty\)"),
    ('{"id": "a", "title": "T", "text": "x"}\n{"id": "b", "title": "T"}\n[1]\nnot json\n',
     r"3 bad lines: line 2: missing 'text'; line 3: not a JSON object; line 4: not a JSON"),
    ('{"id": "a", "title": "T", "text": "x"}\n{"id": "a", "title": "U", "text": "y"}\n',
     r"line 2: id 'a' repeats line 1"),
    ('{"id": "a", "title": "T", "text": "x", "faq": "yes"}\n', r"line 1: faq must be true"),
], ids=["missing", "empty", "blank", "malformed", "duplicate-id", "bad-faq"])
def test_kb_build_bad_input_names_the_lines_and_writes_nothing(
        tmp_path: Path, content: str | None, message: str) -> None:
    config = KnowledgeBaseConfig(uri=str(tmp_path / "db" / "kb.db"))
    build_knowledge_base(ARTICLES, config, EMB)
    before = sorted(p.name for p in (tmp_path / "db").iterdir())
    path = tmp_path / "articles.jsonl"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(InputFileError, match=message):
        build_knowledge_base(path, config, EMB)
    assert _count(config) == 36
    assert sorted(p.name for p in (tmp_path / "db").iterdir()) == before


def test_kb_commands_build_search_and_report_bad_input(tmp_path: Path, capsys) -> None:
    uri = str(tmp_path / "cli.db")
    assert sts(["kb", "build", "--input", str(ARTICLES), "--uri", uri]) == 0
    assert "36 articles (14 FAQ), 384-d vectors" in capsys.readouterr().out
    assert sts(["kb", "search", "Can I pay in 3 instalments?",
                "--uri", uri]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[2] == "faq-instalments:"
    assert "answered from the knowledge base (faq-instalments)" in out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "title": "T", "text": "x"}\n{"id": 3}\n', encoding="utf-8")
    assert sts(["kb", "build", "--input", str(bad), "--uri", uri]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sts kb build: ") and "line 2:" in err and len(err.splitlines()) == 1
    assert sts(["kb", "search", "hello", "--uri", str(tmp_path / "none.db")]) == 2
    assert "run `sts kb build`" in capsys.readouterr().err
    assert sts(["kb", "search", "hello", "--uri", uri, "--collection", "other"]) == 2
    assert "no collection 'other'" in capsys.readouterr().err
    # A folder or file of the user's that merely ends in .db is never replaced.
    mine = tmp_path / "thesis.db"
    mine.mkdir()
    (mine / "chapter1.txt").write_text("keep me", encoding="utf-8")
    sqlite = tmp_path / "app.db"
    sqlite.write_bytes(b"SQLite format 3\x00")
    for target in (mine, sqlite):
        assert sts(["kb", "build", "--input", str(ARTICLES), "--uri", str(target)]) == 2
        assert "is not a Milvus Lite database" in capsys.readouterr().err
    assert (mine / "chapter1.txt").read_text(encoding="utf-8") == "keep me"
    assert sqlite.read_bytes() == b"SQLite format 3\x00"


# ------------------------------------------------------------------ L1 classifier


def test_l1_train_prints_held_out_accuracy_and_writes_a_model(router_file: Path,
                                                              capsys) -> None:
    model = RouterModel.load(router_file)
    # held out: texts unlike any training text except in their numbers
    assert model.metrics["held_out"] > 100 and model.metrics["route_accuracy"] >= 0.95
    assert model.metrics["priority_accuracy"] >= 0.7
    assert router_file.stat().st_size < 200_000
    routes, _ = model.predict(embed_texts(TEXTS, EMB))["route"]
    assert routes == ["rule", "drop", "llm", "llm", "llm", "rule"]
    priorities, _ = model.predict(embed_texts(TEXTS[3:4], EMB))["priority"]
    assert priorities == ["high"]


def test_l1_train_bad_input(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "labelled.jsonl"
    bad.write_text('{"text": "hi", "priority": "low", "route": "rule"}\n'
                   '{"text": "x", "priority": "urgent", "route": "llm"}\n', encoding="utf-8")
    out = tmp_path / "router.json"
    assert sts(["l1", "train", "--input", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "line 2: priority must be one of ['high', 'normal', 'low'], got 'urgent'" in err
    assert not out.exists()
    with pytest.raises(InputFileError, match="needs at least two labels"):
        good = tmp_path / "one-label.jsonl"
        good.write_text('{"text": "hi", "priority": "low", "route": "rule"}\n' * 4)
        train_router(good, out, EMB)
    with pytest.raises(RoutingModelError, match="not an L1 model file"):
        (tmp_path / "other.json").write_text('{"format": "x"}')
        RouterModel.load(tmp_path / "other.json")


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("\n\n", r"no labelled examples \(the file is empty\)"),
    ('{"text": "hi", "priority": "low", "route": "rule"}\nnot json\n[2]\n'
     '{"text": "", "priority": "low", "route": "rule"}\n{"text": "x", "priority": "low"}\n',
     r"4 bad lines: line 2: not a JSON object .*; line 3: not a JSON object; line 4: text .*; "
     r"line 5: missing 'route'"),
], ids=["missing", "empty", "malformed"])
def test_l1_train_bad_file_one_line_with_line_numbers_nothing_written(
        tmp_path: Path, capsys, content: str | None, message: str) -> None:
    path = tmp_path / "labelled.jsonl"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    out = tmp_path / "model" / "router.json"
    assert sts(["l1", "train", "--input", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sts l1 train: ") and len(err.splitlines()) == 1, err
    assert re.search(message, err), err
    assert not out.exists() and not list(tmp_path.glob("model/*"))


# ------------------------------------------------------------------ in Spark


def test_routing_and_retrieval_in_spark(spark, kb: KnowledgeBaseConfig,
                                        router_file: Path) -> None:
    df = spark.createDataFrame([(f"e{i}", t, "normal") for i, t in enumerate(TEXTS)],
                               "event_id STRING, text STRING, priority STRING").repartition(2)
    routing = RoutingConfig(model_file=str(router_file), rules=[
        {"when": "text like '%kettle%'", "priority": "low"},
        {"when": "text like '%kettle%'", "priority": "high", "route": "drop"},  # not reached
        {"when": "text like 'Thanks%'", "route": "drop"}])
    out = retrieve(route_events(df, routing, EMB), kb, EMB).orderBy("event_id").toPandas()
    # the kettle matches two rules: the first decides, and it keeps the model's route
    assert list(out["route"]) == ["rule", "drop", "llm", "llm", "llm", "drop"]
    assert list(out["priority"])[3:5] == ["high", "low"]
    assert all(len(ids) == kb.top_k for ids in out["kb_ids"])
    japan = out.iloc[2]
    assert japan["kb_ids"][0] == "faq-shipping-countries"
    assert japan["kb_answer_id"] == "faq-shipping-countries" and japan["kb_answer"].startswith("Yes")
    takeover = out.iloc[3]
    assert takeover["kb_answer"] is None and takeover["kb_ids"][0] == "kb-account-takeover"
    assert takeover["kb_context"].startswith("Context:\n[kb-account-takeover] ")
    assert len(takeover["kb_context"]) <= kb.max_context_chars + 1
    # the same batch again gives the same context (prefix-cache friendly, deterministic)
    again = retrieve(df, kb, EMB).orderBy("event_id").toPandas()
    assert list(again["kb_context"]) == list(out["kb_context"])


def test_routing_rules_alone_and_config_errors(spark) -> None:
    df = spark.createDataFrame([("a", "hello", "low"), ("b", "refund now", "normal")],
                               "event_id STRING, text STRING, priority STRING")
    out = route_events(df, RoutingConfig(rules=[{"when": "text like '%refund%'",
                                                 "priority": "high"}]), EMB).orderBy("event_id")
    assert [(r.priority, r.route) for r in out.collect()] == [("low", "llm"), ("high", "llm")]
    with pytest.raises(ValueError, match="needs a SQL 'when'"):
        PipelineConfig.from_dict({"routing": {"rules": [{"route": "drop"}]}})
    with pytest.raises(ValueError, match="must be one of"):
        RoutingConfig(rules=[{"when": "true", "route": "later"}])
    with pytest.raises(KnowledgeBaseError, match="run `sts kb build`"):
        retrieve(df, KnowledgeBaseConfig(uri=str(Path("/nonexistent/kb.db"))), EMB)
    with pytest.raises(RoutingModelError, match="no L1 model"):
        route_events(df, RoutingConfig(model_file="/nonexistent/router.json"), EMB)


# ------------------------------------------------------------------ in the pipeline


@pytest.mark.slow
def test_pipeline_answers_rule_drop_and_kb_at_once_and_submits_only_llm(
        spark, tmp_path: Path, kb: KnowledgeBaseConfig, router_file: Path) -> None:
    from sidecar import write_text_atomically
    from spark_ext.pipeline.sts_pipeline import StsPipeline
    from tests.utils import RemoteSidecar

    events = [{"event_id": f"e{i}", "text": t, "priority": "normal", "event_ts": None}
              for i, t in enumerate(TEXTS)]
    write_text_atomically(tmp_path / "events" / "b1.json",
                          "".join(json.dumps(e) + "\n" for e in events))
    results = tmp_path / "results"
    with RemoteSidecar(results, ["--engine", "simulated", "--sidecar-id", "l1l2",
                                 "--set", "scheduler.deadline_admission=false",
                                 "--set", "results.flush_interval_s=0.05"],
                       log_path=tmp_path / "sidecar.log") as sidecar:
        cfg = PipelineConfig.from_dict({
            "source": {"path": str(tmp_path / "events")},
            "tagging": {"event_time_ms": None, "max_tokens": 8,
                        "sla_ms": {"high": 60_000, "normal": 60_000, "low": 60_000}},
            "template": {"dynamic": "{kb_context}Ticket: {text}"},
            "sidecar": {"endpoint": sidecar.target, "results_dir": str(results)},
            "output": {"out_dir": str(tmp_path / "out"), "checkpoint_dir": str(tmp_path / "ck"),
                       "writer": "deltalake"},
            "routing": {"enabled": True, "model_file": str(router_file)},
            "knowledge_base": {"enabled": True, "uri": kb.uri},
        })
        pipeline = StsPipeline(spark, cfg)
        pipeline.start()
        try:
            deadline = time.monotonic() + 120
            while True:
                pipeline.process_all_available()
                answers = pipeline.store.read("answers").to_pylist() \
                    if (tmp_path / "out" / "answers").exists() else []
                if len(answers) >= len(TEXTS) or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
        finally:
            pipeline.stop()
    by_event = {a["event_id"]: a for a in answers}
    assert len(answers) == len(by_event) == len(TEXTS), "exactly one answer row per event"
    got = {e: (a["answer_source"], a["status"]) for e, a in by_event.items()}
    assert got == {"e0": ("rule", "ok"), "e1": ("rule", "dropped"), "e2": ("kb", "ok"),
                   "e3": ("llm", "ok"), "e4": ("llm", "ok"), "e5": ("rule", "ok")}
    assert by_event["e2"]["reason"] == "kb:faq-shipping-countries"
    assert by_event["e0"]["answer"] == cfg.routing.rule_text
    assert by_event["e3"]["priority"] == "high"
    submitted = pipeline.store.read("requests").to_pylist()
    assert sorted(r["event_id"] for r in submitted) == ["e3", "e4"]
    assert all(len(r["kb_ids"]) == kb.top_k and r["route"] == "llm" for r in submitted)
    # Every answer row says which articles it used: the FAQ it answered from, or the
    # articles retrieved into the model's prompt (carried to the result as an attribute).
    assert by_event["e2"]["kb_ids"] == "faq-shipping-countries"
    for r in submitted:
        assert by_event[r["event_id"]]["kb_ids"] == ",".join(r["kb_ids"])


def test_fast_path_with_rules_only_needs_no_model(spark) -> None:
    from spark_ext.exceptions import PipelineConfigError
    from spark_ext.l2.fast_path import apply_fast_path

    df = spark.createDataFrame([("a", "hello", "low"), ("b", "buy pills", "normal")],
                               "event_id STRING, text STRING, priority STRING")
    cfg = PipelineConfig.from_dict({"routing": {"enabled": True, "rules": [
        {"when": "text like '%pills%'", "route": "drop"}]}})
    out = apply_fast_path(df, cfg).orderBy("event_id").collect()
    assert [(r.route, r.priority) for r in out] == [("llm", "low"), ("drop", "normal")]
    both = PipelineConfig.from_dict({"routing": {"enabled": True, "model_file": "x.json"},
                                     "knowledge_base": {"enabled": True,
                                                        "text_column": "subject"}})
    with pytest.raises(PipelineConfigError, match="share one embedding"):
        apply_fast_path(df, both)


# ------------------------------------------------------------------ feature lookup


def test_feature_lookup_joins_a_delta_table_that_rules_use(spark, tmp_path: Path) -> None:
    from deltalake import write_deltalake
    from pyspark.sql import functions as F

    from spark_ext.config import FeaturesConfig
    from spark_ext.exceptions import PipelineConfigError
    from spark_ext.l2.features import join_features
    from spark_ext.l1.routing import apply_rules

    table = tmp_path / "customers"
    write_deltalake(str(table), pa.table({"customer_id": ["c1", "c2"],
                                          "tier": ["enterprise", "free"],
                                          "open_tickets": pa.array([0, 4], pa.int32())}))
    events = spark.createDataFrame(
        [("e1", "c1", "low"), ("e2", "c2", "low"), ("e3", "c9", "low"), ("e4", None, "normal")],
        "event_id STRING, customer_id STRING, priority STRING")
    features = FeaturesConfig(enabled=True, table=str(table))
    joined = join_features(events, features, spark).withColumn("route", F.lit("llm"))
    rules = RoutingConfig(rules=[{"when": "tier = 'enterprise'", "priority": "high"},
                                 {"when": "open_tickets >= 3", "priority": "normal"}])
    # a small table is inlined as a map, a big one broadcast-joined: the same rows
    joined_big = join_features(events, FeaturesConfig(enabled=True, table=str(table),
                                                      max_inline_rows=1), spark)
    for df in (joined, joined_big.withColumn("route", F.lit("llm"))):
        out = {r.event_id: (r.tier, r.open_tickets, r.priority)
               for r in apply_rules(df, rules).collect()}
        # one row per event: unknown and missing customers keep null features and priority
        assert out == {"e1": ("enterprise", 0, "high"), "e2": ("free", 4, "normal"),
                       "e3": (None, None, "low"), "e4": (None, None, "normal")}
    for config, message in [
            (FeaturesConfig(enabled=True, table=str(tmp_path / "none")), "no readable Delta"),
            (FeaturesConfig(enabled=True, table=str(table), key="account"), "not a column of"),
            (FeaturesConfig(enabled=True, table=str(table), columns=["segment"]), "not in the")]:
        with pytest.raises(PipelineConfigError, match=message):
            join_features(events, config, spark)
    write_deltalake(str(table), pa.table({"customer_id": ["c1", "c1"], "tier": ["a", "b"],
                                          "open_tickets": pa.array([0, 1], pa.int32())}),
                    mode="overwrite")
    with pytest.raises(PipelineConfigError, match="repeats"):
        join_features(events, features, spark)
    with pytest.raises(PipelineConfigError, match="features.table must name"):
        PipelineConfig.from_dict({"features": {"enabled": True}})



def test_warm_up_opens_the_fast_path_in_every_worker_a_task_slot_holds(
        spark, tmp_path: Path) -> None:
    """Spark hands any idle Python worker to any Python operator, so the warm-up opens
    the model and the knowledge base in as many workers as a task slot can hold at once
    (the UDF, the submission, the results source), one task per core: each opening
    shows as a reader snapshot named after its process."""
    import hashlib

    from spark_ext.l2 import fast_path
    from spark_ext.l2.knowledge_base import _SNAPSHOT_ROOT

    kb = KnowledgeBaseConfig(enabled=True, uri=str(tmp_path / "kb.db"))  # opened nowhere yet
    build_knowledge_base(ARTICLES, kb, EMB)
    tag = hashlib.sha1(str(Path(kb.uri)).encode()).hexdigest()[:10]
    fast_path.warm_up(spark, PipelineConfig(knowledge_base=kb, embedding=EMB))
    pids = {d.name.split("-")[0] for d in _SNAPSHOT_ROOT.glob(f"*-{tag}-*")}
    slots = spark.sparkContext.defaultParallelism
    assert len(pids) >= 3 * slots, pids  # the UDF, the submission, the results source

    # PySpark collects garbage after every task of a reused worker: what the fast path
    # loaded is frozen out of it in each worker that opened it, never in the driver.
    import gc

    from spark_ext.worker_gc import freeze_loaded

    def report(batches):
        import os

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"pid": [str(os.getpid())],
                                          "frozen": [gc.get_freeze_count()]})

    frozen_before = gc.get_freeze_count()
    assert freeze_loaded("test") is False and gc.get_freeze_count() == frozen_before
    seen = (spark.range(4 * slots, numPartitions=4 * slots)
            .mapInArrow(report, "pid string, frozen long").toArrow().to_pylist())
    warm = [r for r in seen if r["pid"] in pids]
    assert warm, (seen, pids)
    assert all(r["frozen"] > 100_000 for r in warm), warm  # torch, the model, the reader
