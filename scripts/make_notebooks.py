"""Write the notebooks under ``notebooks/`` from the cell sources below.

    python scripts/make_notebooks.py

The notebooks are generated (and committed) so that their code is reviewed as code;
``tests/process/test_notebooks.py`` checks they are up to date and runs each one
headless. Each has a cell tagged ``parameters`` (papermill's convention) that a
runner may override; on Databricks the ``spark`` session of the cluster is used.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"

_SPARK = '''\
import os
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
from pyspark.sql import SparkSession
from spark_ext import local_session

# On Databricks (or any notebook with a session) the existing `spark` is used; with
# SPARK_REMOTE set (sc://host:port) a Spark Connect session, as on serverless.
spark = SparkSession.getActiveSession() or local_session("sts-notebook")
print("Spark", spark.version)'''

OWN_STREAM = [
    new_markdown_cell("""\
# Add LLM inference to a stream you already have

Your streaming job keeps its source, its joins, its sink and its checkpoints. Three cells
add non-blocking LLM inference to it: requests from your rows, both queries started with
the answers written to a Delta table, and the answers read back. Nothing waits for the
model: every event gets exactly one answer row, the model's or your fallback at its
deadline.

It needs a running sidecar (`sts sidecar`; on a cluster, one per GPU started by the
init script) whose `results.results_dir` is `RESULTS_DIR`."""),
    new_code_cell('''\
# Parameters
SIDECAR = "127.0.0.1:50051"     # the sidecar's address
RESULTS_DIR = "./sts-results"   # where that sidecar writes its results (results.results_dir)
OUT = "./sts-my-stream"         # the answers table and the checkpoints go here
SECONDS = 30                    # how long this notebook lets the stream run'''),
    new_code_cell(_SPARK),
    new_code_cell('''\
# Your stream, as it is (here: Spark's rate source shaped into support tickets)
from pyspark.sql import functions as F

events = (spark.readStream.format("rate").option("rowsPerSecond", 2).load()
          .select(F.concat(F.lit("T-"), F.col("value").cast("string")).alias("ticket_id"),
                  F.concat(F.lit("Where is my order "), F.col("value").cast("string"),
                           F.lit("?")).alias("text"),
                  F.when(F.col("value") % 3 == 0, "high").otherwise("normal").alias("priority")))'''),
    new_markdown_cell("## 1. Requests from your rows"),
    new_code_cell('''\
from spark_ext import LlmInference

llm = LlmInference(spark, key="ticket_id", sidecar=SIDECAR, results_dir=RESULTS_DIR,
                   checkpoint_location=f"{OUT}/checkpoints",
                   fallback_text="Thanks for writing; an agent will answer shortly.")
requests = llm.requests(events, priority="priority", sla_ms={"high": 5000, "normal": 20000},
                        template="Answer the customer in one sentence.\\nTicket: {text}")'''),
    new_markdown_cell("## 2. Both queries, the answers into Delta"),
    new_code_cell('''\
queries = llm.start(requests, answers_table=f"{OUT}/answers")   # or a catalog name
queries.answers.awaitTermination(SECONDS)
queries.stop()'''),
    new_markdown_cell("## 3. The answers"),
    new_code_cell('''\
answers = spark.read.format("delta").load(f"{OUT}/answers")
answers.groupBy("priority", "answer_source").count().orderBy("priority", "answer_source").show()
print("answers:", answers.count(), "events answered:", answers.select("ticket_id").distinct().count())'''),
]

QUICKSTART = [
    new_markdown_cell("""\
# sts-spark quickstart

Streams support tickets through the whole STS path and shows the answers:

1. a **sidecar** (vLLM behind the gRPC gateway) is started, or an existing one is used
   (on a cluster whose init script started one per GPU, set `SIDECAR_ENDPOINT`);
2. Spark's two queries run: `sts-submit` (tag, build the prompt, fire-and-forget
   `SubmitBatch`) and `sts-answers` (result rows -> Delta `answers`);
3. the sample tickets are replayed into a landing folder as a stream;
4. every ticket gets exactly one answer row: `llm`, or the rule `fallback` when the
   model cannot answer in time (and `backfill` when a late model answer replaces it).

Run it top to bottom. With `ENGINE = "vllm"` the first run prepares the packaged SmolLM2
model (about a minute on a CPU); `ENGINE = "simulated"` is a timing model for a dry run."""),
    new_code_cell('''\
# Parameters
ENGINE = "vllm"            # "vllm" (the packaged SmolLM2) or "simulated" (no model, fake text)
OUT = "./sts-quickstart"   # events, results, checkpoints and Delta tables go here
RATE = 2.0                 # tickets per second
DURATION = 20.0            # seconds of replay
SIDECAR_ENDPOINT = None    # e.g. "unix:///run/sts/sts-gpu0.sock": use a running sidecar
WRITER = "auto"            # output.writer: "spark" (Delta on Spark; Databricks, Connect),
                           # "deltalake" (delta-rs on the driver), "auto": spark if it loads'''),
    new_code_cell(_SPARK),
    new_markdown_cell("## 1. The sidecar"),
    new_code_cell('''\
import contextlib
from pathlib import Path

from sts_harness.demo import prepare_out
from sts_harness.process import SidecarProcess

out = Path(OUT).expanduser().resolve()
prepare_out(out, overwrite=True)   # refuses a folder that it did not write
stack = contextlib.ExitStack()     # everything started below is stopped at the end
if SIDECAR_ENDPOINT is None:
    if ENGINE == "vllm":
        from sidecar import prepare_default_model
        print("model:", prepare_default_model())
    sidecar = stack.enter_context(SidecarProcess(
        out / "results", ["--engine", ENGINE, "--sidecar-id", "notebook-sidecar"],
        log_path=out / "sidecar.log", start_timeout_s=300, stop_timeout_s=60))
    endpoint = sidecar.target
else:
    endpoint = SIDECAR_ENDPOINT
print("sidecar:", endpoint)'''),
    new_markdown_cell("## 2. The pipeline"),
    new_code_cell('''\
from spark_ext import PipelineConfig, StsPipeline
from sts_harness.support_app import support_sections   # the tickets' prompt and fallback

config = PipelineConfig.from_dict(support_sections({
    "source": {"path": str(out / "events")},
    "tagging": {"sla_ms": {"high": 8000, "normal": 15000, "low": 30000}, "max_tokens": 48},
    "sidecar": {"endpoint": endpoint, "results_dir": str(out / "results")},
    "output": {"out_dir": str(out / "tables"), "checkpoint_dir": str(out / "checkpoints"),
               "writer": WRITER},
}))
pipeline = StsPipeline(spark, config)
stack.callback(pipeline.stop)
queries = pipeline.start()
print([q.name for q in queries], "writer:", pipeline.writer)'''),
    new_markdown_cell("## 3. Stream the sample tickets"),
    new_code_cell('''\
import time

from sts_harness.demo import load_samples, sample_replayer

replayer = sample_replayer(out / "events", RATE, DURATION, load_samples())
replayer.start()
started = time.monotonic()
# Every ticket is answered by its deadline + grace (30 s SLA of `low` + 2 s at most).
while time.monotonic() - started < DURATION + 90:
    pipeline.check()  # raises at once if a query died
    answered = pipeline.store.read("answers", ["answer_source"]).to_pandas()
    print(f"[{time.monotonic() - started:5.1f}s] events {replayer.offered}, answers "
          f"{len(answered)} {answered.answer_source.value_counts().to_dict()}", flush=True)
    if not replayer.is_alive() and len(answered) >= replayer.offered:
        break
    time.sleep(3)'''),
    new_markdown_cell("## 4. The answers (a Delta table)"),
    new_code_cell('''\
answers = pipeline.store.read("answers").to_pandas()
spark.createDataFrame(answers).createOrReplaceTempView("answers")
spark.sql("""
    SELECT priority, answer_source, count(*) AS answers,
           percentile(latency_ms, 0.5) AS p50_ms, avg(CAST(deadline_met AS INT)) AS on_time
    FROM answers GROUP BY priority, answer_source ORDER BY priority, answer_source
""").show()
answers[["priority", "answer_source", "latency_ms", "answer"]].head(10)'''),
    new_code_cell('''\
assert len(answers) == replayer.offered == answers.request_id.nunique(), "one answer per event"
stack.close()  # stops the queries and the sidecar (Spark is left running)
print("tables:", out / "tables")'''),
]

ANALYST = [
    new_markdown_cell("""\
# Answers, as an analyst sees them

Reads the Delta tables an sts-spark pipeline writes (`answers`, `results`, `requests`)
and answers the questions people ask first: who got a model answer, how fast against
the SLA, how many fallbacks were later replaced by a model answer (backfill). With Delta
on Spark (Databricks, or a session with delta-spark) the tables are read by Spark itself:
by catalog name (`CATALOG = "main.support"` reads `main.support.answers`, the names of
the pipeline's `output.tables`) or by path; without it with `deltalake`. Either way they
become Spark SQL views, so every query below is plain SQL."""),
    new_code_cell('''\
# Parameters
TABLES = "./sts-quickstart/tables"   # the pipeline's output.out_dir
CATALOG = None                       # e.g. "main.support": read <CATALOG>.answers by name
SLA_MS = {"high": 8000, "normal": 15000, "low": 30000}'''),
    new_code_cell(_SPARK),
    new_code_cell('''\
from pathlib import Path

from deltalake import DeltaTable

from spark_ext.l4.writers.spark import delta_on_spark

tables = Path(TABLES).expanduser().resolve()
counts = {}
for name in ("answers", "results", "requests"):
    if CATALOG:                       # a catalog table (Unity Catalog, Hive metastore)
        df = spark.table(f"{CATALOG}.{name}")
    elif not (tables / name / "_delta_log").is_dir():
        continue
    elif delta_on_spark(spark):       # Spark's own Delta reader
        df = spark.read.format("delta").load(str(tables / name))
    else:                             # no Delta jars: delta-rs reads it
        df = spark.createDataFrame(DeltaTable(str(tables / name)).to_pandas())
    df.createOrReplaceTempView(name)
    counts[name] = df.count()
answers = spark.table("answers").toPandas()
print(counts)'''),
    new_markdown_cell("## Answers by source and priority"),
    new_code_cell('''\
spark.sql("""
    SELECT priority, answer_source, count(*) AS answers
    FROM answers GROUP BY priority, answer_source ORDER BY priority, answer_source
""").show()
by = answers.pivot_table(index="priority", columns="answer_source", values="request_id",
                         aggfunc="count", fill_value=0)
ax = by.reindex([p for p in ("high", "normal", "low") if p in by.index]).plot.bar(
    stacked=True, figsize=(6, 3.5), title="answers by source")
ax.set_ylabel("answers");'''),
    new_markdown_cell("## Latency against the SLA"),
    new_code_cell('''\
import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 3, figsize=(12, 3.2), sharey=True)
for ax, priority in zip(axes, ("high", "normal", "low")):
    mine = answers[answers.priority == priority]
    for source, group in mine.groupby("answer_source"):
        ax.hist(group.latency_ms / 1000, bins=20, alpha=0.6, label=source)
    ax.axvline(SLA_MS[priority] / 1000, color="k", ls="--", label="SLA")
    ax.set_title(f"{priority} ({len(mine)})")
    ax.set_xlabel("event -> answer, s")
axes[0].set_ylabel("answers")
axes[0].legend()
plt.tight_layout()
spark.sql("""
    SELECT priority, count(*) AS answers,
           sum(CASE WHEN answer_source IN ('llm', 'backfill') AND deadline_met THEN 1 ELSE 0 END)
             AS llm_within_sla,
           percentile(latency_ms, 0.5) AS p50_ms, percentile(latency_ms, 0.99) AS p99_ms
    FROM answers GROUP BY priority ORDER BY priority
""").show()'''),
    new_markdown_cell("## Fallbacks: why, and how many a late model answer replaced"),
    new_code_cell('''\
spark.sql("""
    SELECT coalesce(reason, status) AS cause, count(*) AS fallbacks
    FROM answers WHERE answer_source = 'fallback' GROUP BY 1 ORDER BY 2 DESC
""").show()
backfilled = int(answers.backfilled_at.notna().sum())
print(f"backfilled: {backfilled} of {len(answers)} answers "
      f"({backfilled / max(len(answers), 1):.1%})")'''),
]

CAPACITY = [
    new_markdown_cell("""\
# Capacity: from a traffic profile to a GPU count and a safe water level

1. a traffic profile (arrival rate, prompt and output length distributions) gives the
   planner's figure: `GPUs ~ peak QPS x mean output tokens / (tokens/s per GPU x utilisation)`;
2. a short load test at several rates finds the knee: the highest rate before P99 turns
   upward or the engine stops keeping up. Here the load test runs the simulated engine
   (a timing model of one GPU) so it finishes in a minute; set `ENGINE = "vllm"` to
   measure the real engine on this machine instead."""),
    new_code_cell('''\
# Parameters
PROFILE = "seed-200qps"        # conf/profiles/<name>.yaml or a path
TOKENS_PER_S_PER_GPU = 3400.0  # measured output tokens/s of one GPU (replace with yours)
ENGINE = "simulated"
KNEE_PROFILE = "cpu-small"
RATES = [2.0, 4.0, 8.0, 16.0]
DURATION = 10.0
OUT = "./sts-capacity"'''),
    new_code_cell('''\
from sts_capacity.plan import format_plan, plan
from sts_capacity.profiles import load_profile

profile = load_profile(PROFILE)
print(format_plan(plan(profile, TOKENS_PER_S_PER_GPU, 0.7)))'''),
    new_markdown_cell("## The knee, measured"),
    new_code_cell('''\
from benchmarks.bench import BenchOptions, run_bench

doc = run_bench(BenchOptions(profile=KNEE_PROFILE, engine=ENGINE, rates=RATES,
                             duration_s=DURATION, schemes=["engine"], knee=True, out=OUT))
print("knee:", doc["knee"])'''),
    new_code_cell('''\
import matplotlib.pyplot as plt

runs = [r for r in doc["runs"] if r["scheme"] == "engine"]
rates = [r["offered_rate"] for r in runs]
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(rates, [r["latency_ms"]["p99"] for r in runs], "o-", label="P99 latency")
ax.plot(rates, [r["latency_ms"]["p50"] for r in runs], "o-", label="P50 latency")
if doc["knee"].get("knee_rate") is not None:
    ax.axvline(doc["knee"]["knee_rate"], color="k", ls="--", label="knee")
ax.set_xlabel("offered requests/s")
ax.set_ylabel("ms")
ax.set_yscale("log")
ax.legend();'''),
]


def _notebook(cells: list) -> nbformat.NotebookNode:
    for cell in cells:
        if cell.cell_type == "code" and cell.source.startswith("# Parameters"):
            cell.metadata["tags"] = ["parameters"]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


#: File name -> cells.
NOTEBOOK_CELLS = {"00_own_stream.ipynb": OWN_STREAM, "01_quickstart.ipynb": QUICKSTART, "02_analyst.ipynb": ANALYST,
                  "03_capacity.ipynb": CAPACITY}


def render() -> dict[str, str]:
    """Each notebook's file content."""
    out = {}
    for name, cells in NOTEBOOK_CELLS.items():
        nb = _notebook(cells)
        for i, cell in enumerate(nb.cells):  # stable ids: the files change only with code
            cell["id"] = f"{Path(name).stem}-{i:02d}"
        out[name] = nbformat.writes(nb) + "\n"
    return out


def main() -> int:
    NOTEBOOKS.mkdir(exist_ok=True)
    for name, text in render().items():
        (NOTEBOOKS / name).write_text(text, encoding="utf-8")
        print("wrote", NOTEBOOKS / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
