"""Where its users run: the pipeline on Spark Connect (Databricks serverless and shared
clusters run only on it), its tables and checkpoints on an object store (a local
S3-compatible server: moto), and delta-rs on ``s3://`` with ``storage_options``."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pandas as pd
import pytest

from sidecar import write_text_atomically
from sidecar.contract import PRIORITY_NAMES
from spark_ext import PipelineConfig, StsPipeline
from spark_ext.worker_pool import warm_up_workers
from tests.utils import RemoteSidecar, wait_until

pytestmark = pytest.mark.timeout(600)


def _sidecar(tmp: Path, name: str) -> RemoteSidecar:
    return RemoteSidecar(tmp / "results", [
        "--engine", "simulated", "--sidecar-id", name,
        "--set", "engine.simulated.step_base_ms=5", "--set", "results.flush_interval_s=0.05"],
        log_path=tmp / f"{name}.log")


def _events(tmp: Path, prefix: str, n: int) -> set[str]:
    events = [{"event_id": f"{prefix}-{i}", "text": f"Is order {i} shipped?",
               "priority": PRIORITY_NAMES[i % 3], "event_ts": 0} for i in range(n)]
    write_text_atomically(tmp / "events" / f"{prefix}.json",
                          "".join(json.dumps(e) + "\n" for e in events))
    return {e["event_id"] for e in events}


def _answered(pipeline: StsPipeline, events: set[str], timeout_s: float = 300) -> dict:
    def done():
        pipeline.check()
        rows = pipeline.store.read("answers").to_pylist()
        by_event = {r["event_id"]: r for r in rows}
        assert len(by_event) == len(rows), "an event has two answer rows"
        return by_event if events <= set(by_event) else None

    return wait_until(done, timeout_s=timeout_s, interval_s=1.0,
                      what=f"answers for {len(events)} events")


def _config(tmp: Path, endpoint: str, out_dir: str, checkpoint_dir: str, **output) -> PipelineConfig:
    return PipelineConfig.from_dict({
        "source": {"path": str(tmp / "events")},
        "tagging": {"event_time_ms": None, "max_tokens": 8,
                    "sla_ms": {"high": 60_000, "normal": 60_000, "low": 60_000}},
        "sidecar": {"endpoint": endpoint, "results_dir": str(tmp / "results"), "timeout_s": 5.0},
        "answers": {"grace_ms": 1000},
        "output": {"out_dir": out_dir, "checkpoint_dir": checkpoint_dir, **output},
    })


@pytest.mark.slow
def test_the_pipeline_runs_on_spark_connect_with_tables_and_checkpoints_on_s3(
        spark_connect, s3_server, tmp_path: Path) -> None:
    """``StsPipeline`` on a Spark Connect session: its ``foreachBatch`` functions carry
    configuration only (they run in the server's Python process), the safety net runs
    here, Delta on Spark writes the tables on ``s3://`` and the checkpoints go to
    ``s3a://`` (hadoop-aws). Every event gets exactly one answer."""
    run = uuid.uuid4().hex[:8]
    out_dir = s3_server.uri(f"connect-{run}/tables", scheme="s3")
    checkpoints = s3_server.uri(f"connect-{run}/ckpt", scheme="s3a")
    with _sidecar(tmp_path, "connect") as sidecar:
        pipeline = StsPipeline(spark_connect, _config(tmp_path, sidecar.target, out_dir,
                                                      checkpoints, records_interval_s=0))
        assert pipeline.writer == "spark"  # the only writer Connect can run
        pipeline.start()
        try:
            answers = _answered(pipeline, _events(tmp_path, "c", 6))
            # the micro-batch that appended the answers goes on to the record tables:
            # let it (and any after it) finish before stopping
            pipeline.process_all_available()
        finally:
            pipeline.stop()
    assert {a["answer_source"] for a in answers.values()} == {"llm"}
    keys = s3_server.keys(f"connect-{run}/")
    assert any(k.startswith(f"connect-{run}/tables/answers/_delta_log/") for k in keys)
    assert any(k.startswith(f"connect-{run}/ckpt/submit/offsets/") for k in keys)
    assert any(k.startswith(f"connect-{run}/ckpt/submit/sts-run-id") for k in keys)
    # what Spark Connect wrote, delta-rs reads: no collation or other writer feature
    # stands in between (the README says each writer reads the other's tables)
    from deltalake import DeltaTable

    for name in ("answers", "requests", "results"):
        table = DeltaTable(f"{out_dir}/{name}", storage_options=s3_server.storage_options)
        rows = table.to_pyarrow_dataset().to_table().to_pylist()
        assert {r["request_id"] for r in rows} == {a["request_id"] for a in answers.values()}, name


def test_the_deltalake_writer_writes_its_tables_on_s3_with_storage_options(
        spark, s3_server, tmp_path: Path) -> None:
    """delta-rs on ``s3://``: ``output.storage_options`` reach every read and write (the
    endpoint, the keys, plain HTTP), the checkpoints stay local; the tables are whole
    Delta tables on the server, read back by delta-rs with the same options."""
    from deltalake import DeltaTable

    run = uuid.uuid4().hex[:8]
    out_dir = s3_server.uri(f"rs-{run}/tables", scheme="s3")
    with _sidecar(tmp_path, "rs-s3") as sidecar:
        pipeline = StsPipeline(spark, _config(
            tmp_path, sidecar.target, out_dir, str(tmp_path / "ckpt"), writer="deltalake",
            storage_options=s3_server.storage_options))
        pipeline.start()
        try:
            answers = _answered(pipeline, _events(tmp_path, "r", 5))
        finally:
            pipeline.stop()
    assert {a["answer_source"] for a in answers.values()} == {"llm"}
    table = DeltaTable(f"{out_dir}/answers", storage_options=s3_server.storage_options)
    assert table.to_pyarrow_table().num_rows == 5
    assert not (tmp_path / "tables").exists(), "nothing is created as a local folder"


def _note_worker_pool(folders: pd.Series) -> pd.Series:
    """(A pandas UDF's body, run in the server's Python workers.) Mark, in each row's
    folder, the worker pool this worker belongs to: Spark's job artifact UUID of its
    environment (``default`` when it has none) and its process id."""
    pool = os.environ.get("SPARK_JOB_ARTIFACT_UUID", "default")
    for folder in set(folders):
        (Path(folder) / f"{pool}-{os.getpid()}").touch()
    return folders


@pytest.mark.slow
def test_a_warm_up_on_spark_connect_runs_in_the_python_workers_its_streams_get(
        spark_connect, tmp_path: Path) -> None:
    """On Spark Connect a client session's batch jobs get Python workers of their own
    (the session's artifact UUID in their environment) and its streaming queries others:
    the L1/L2 warm-up, run as a batch job, loaded the models where no micro-batch ran
    (each first submit micro-batch then waited 12-14 s on a cold worker).
    ``warm_up_workers`` runs in the streams' pool."""
    from pyspark.sql import functions as F

    note = F.pandas_udf(_note_worker_pool, "string")
    warm, streamed = tmp_path / "warm-up", tmp_path / "stream"
    warm.mkdir()
    streamed.mkdir()
    rows = spark_connect.range(2, numPartitions=2).select(F.lit(str(warm)).alias("folder"))
    warm_up_workers(spark_connect, rows, lambda df: df.select(note("folder").alias("folder")),
                    str(tmp_path / "scratch"))
    query = (spark_connect.readStream.format("rate").option("rowsPerSecond", 2).load()
             .select(note(F.lit(str(streamed))).alias("folder"))
             .writeStream.format("noop").trigger(processingTime="1 second").start())
    try:
        wait_until(lambda: any(streamed.iterdir()), timeout_s=120, interval_s=0.5,
                   what="a micro-batch's Python worker")
    finally:
        query.stop()

    def pools(folder: Path) -> set[str]:
        return {p.name.rsplit("-", 1)[0] for p in folder.iterdir()}

    assert pools(warm) and pools(warm) == pools(streamed), \
        f"warm-up workers {sorted(pools(warm))}, micro-batch workers {sorted(pools(streamed))}"
