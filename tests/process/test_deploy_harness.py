"""The deployment test harness works: the S3 server with delta-rs, a classic Spark session
with Delta on s3a (checkpoint on s3a), and a real Spark Connect server running a batch query
and a ``foreachBatch`` streaming query (docs/deploy-notes.md has the facts behind them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from tests.utils import REPO

S3A_JOB_TIMEOUT_S = 540


def _prefix(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_the_s3_server_refuses_a_second_conditional_put(s3_server) -> None:
    """delta-rs commits a version with ``PUT If-None-Match: *``; the server must answer
    412 when the version exists, or two writers could both commit it."""
    from botocore.exceptions import ClientError

    client, key = s3_server.client(), _prefix("cond") + "/00000.json"
    client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"1", IfNoneMatch="*")
    with pytest.raises(ClientError, match="PreconditionFailed"):
        client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"2", IfNoneMatch="*")


def test_the_s3_server_keeps_serving_after_thousands_of_requests(s3_server) -> None:
    """The server logs a line per request; a log nobody reads must not block it (a full
    stderr pipe once hung a Connect pipeline test mid-write). 1,500 requests are ~130 kB of
    log, well past a pipe's 64 kB; each call times out in 10 s rather than hang."""
    from botocore.config import Config

    client = s3_server.client(config=Config(read_timeout=10, retries={"max_attempts": 0}))
    key = _prefix("many") + "/k"
    client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"1")
    for _ in range(1500):
        client.head_object(Bucket=s3_server.bucket, Key=key)


def test_deltalake_round_trip_on_s3_with_app_transactions_and_merge(s3_server) -> None:
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    uri, options = s3_server.uri(_prefix("rs") + "/answers"), s3_server.storage_options
    write_deltalake(uri, pa.table({"id": [1, 2], "v": ["a", "b"]}), storage_options=options,
                    commit_properties=CommitProperties(app_transactions=[Transaction("app", 0)]))
    write_deltalake(uri, pa.table({"id": [3], "v": ["c"]}), mode="append",
                    storage_options=options,
                    commit_properties=CommitProperties(app_transactions=[Transaction("app", 1)]))
    table = DeltaTable(uri, storage_options=options)
    assert (table.version(), table.transaction_version("app")) == (1, 1)
    metrics = (table.merge(pa.table({"id": [3, 4], "v": ["C", "D"]}), "t.id = s.id",
                           source_alias="s", target_alias="t")
               .when_matched_update_all().when_not_matched_insert_all().execute())
    assert (metrics["num_target_rows_updated"], metrics["num_target_rows_inserted"]) == (1, 1)
    rows = DeltaTable(uri, storage_options=options).to_pyarrow_table().sort_by("id").to_pylist()
    assert rows == [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 3, "v": "C"},
                    {"id": 4, "v": "D"}]
    prefix = uri.removeprefix(f"s3://{s3_server.bucket}/")
    assert f"{prefix}/_delta_log/00000000000000000002.json" in s3_server.keys(prefix)


@pytest.mark.slow
def test_classic_spark_writes_delta_on_s3a_with_its_checkpoint_there(s3_server) -> None:
    """A classic local session (``jvm_features=("delta", "s3")``) in a child process:
    idempotent appends, MERGE, a restartable availableNow query checkpointed on s3a, and
    ``s3://`` through S3AFileSystem."""
    prefix = _prefix("spark")
    args = {"hadoop_conf": s3_server.hadoop_conf(), "base": s3_server.uri(prefix, scheme="s3a")}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-m", "tests.process.deploy_s3a_job", json.dumps(args)],
                          cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=S3A_JOB_TIMEOUT_S, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert out["rows_after_txn"] == 3 and out["versions"] == [0, 1]  # the repeat was skipped
    assert out["after_merge"] == [[1, "v1"], [2, "v2"], [3, "V3"], [4, "v4"]]
    assert (out["stream_rows_first"], out["stream_rows_restart"], out["stream_rows_more"]) \
        == (5, 5, 8)
    assert out["s3_scheme_rows"] == 3
    checkpoint = s3_server.keys(f"{prefix}/ckpt/")
    assert f"{prefix}/ckpt/commits/0" in checkpoint and f"{prefix}/ckpt/offsets/1" in checkpoint


def test_a_connect_client_runs_a_query(spark_connect) -> None:
    from pyspark.sql import functions as F

    assert type(spark_connect).__module__ == "pyspark.sql.connect.session"
    assert spark_connect.range(10).where(F.col("id") % 2 == 0).count() == 5
    assert spark_connect.range(3).toArrow().num_rows == 3


def test_connect_has_no_spark_context(spark_connect) -> None:
    from pyspark.errors import PySparkAttributeError

    with pytest.raises(PySparkAttributeError, match="JVM_ATTRIBUTE_NOT_SUPPORTED"):
        spark_connect.sparkContext  # noqa: B018


def test_connect_foreach_batch_runs_server_side_with_available_now(spark_connect,
                                                                   tmp_path: Path) -> None:
    """The function runs in a Python process that the server's JVM starts (not this one),
    and may close over plain data."""
    source, marks = tmp_path / "in", tmp_path / "marks"
    marks.mkdir()
    spark_connect.range(5).write.parquet(str(source))
    settings = {"tag": "x"}  # plain data: pickled with the function

    def handle(batch_df, batch_id: int) -> None:
        import os as _os

        (marks / f"{batch_id}.json").write_text(json.dumps(
            {"pid": _os.getpid(), "rows": batch_df.count(), "tag": settings["tag"]}))

    query = (spark_connect.readStream.schema("id long").parquet(str(source)).writeStream
             .foreachBatch(handle).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    seen = [json.loads(p.read_text()) for p in marks.glob("*.json")]
    assert sum(m["rows"] for m in seen) == 5 and {m["tag"] for m in seen} == {"x"}
    assert os.getpid() not in {m["pid"] for m in seen}
    progress = query.lastProgress
    # progress["numInputRows"] is None on Connect; the property sums the sources
    assert progress is not None and progress.numInputRows == 5
    assert isinstance(progress["sources"][0]["endOffset"], str)


@pytest.mark.slow
def test_connect_foreach_batch_writes_delta_on_s3a_idempotently_and_merges(
        spark_connect, s3_server, tmp_path: Path) -> None:
    """Inside ``foreachBatch`` on Connect: a Delta append tagged with the batch's app
    transaction, then a MERGE through ``batch_df.sparkSession.sql`` over a temp view; the
    same transaction written again from the client is skipped."""
    source, table = tmp_path / "in", s3_server.uri(_prefix("connect") + "/answers", scheme="s3a")
    spark_connect.range(5).write.parquet(str(source))

    def handle(batch_df, batch_id: int) -> None:
        (batch_df.selectExpr("id", "'a' AS answer").write.format("delta")
         .option("txnAppId", "connect-q").option("txnVersion", batch_id)
         .mode("append").save(table))
        batch_df.selectExpr("id", "'B' AS answer").createOrReplaceTempView("batch_src")
        batch_df.sparkSession.sql(
            f"MERGE INTO delta.`{table}` t USING batch_src s ON t.id = s.id "
            "WHEN MATCHED AND s.id < 2 THEN UPDATE SET t.answer = s.answer")

    query = (spark_connect.readStream.schema("id long").parquet(str(source)).writeStream
             .foreachBatch(handle).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    (spark_connect.range(2).selectExpr("id", "'z' AS answer").write.format("delta")
     .option("txnAppId", "connect-q").option("txnVersion", 0).mode("append").save(table))
    answers = {r.id: r.answer for r in spark_connect.read.format("delta").load(table).collect()}
    assert answers == {0: "B", 1: "B", 2: "a", 3: "a", 4: "a"}
    history = spark_connect.sql(f"DESCRIBE HISTORY delta.`{table}`").select("operation")
    assert sorted(r.operation for r in history.collect()) == ["MERGE", "WRITE"]


def test_connect_foreach_batch_cannot_capture_a_lock(spark_connect) -> None:
    from pyspark.errors import PySparkPicklingError

    guard = threading.Lock()

    def handle(batch_df, batch_id: int) -> None:
        with guard:
            batch_df.count()

    writer = spark_connect.readStream.format("rate").load().writeStream
    with pytest.raises(PySparkPicklingError, match="STREAMING_CONNECT_SERIALIZATION_ERROR"):
        writer.foreachBatch(handle)


def test_a_connect_server_that_exits_says_why_in_one_line(tmp_path: Path) -> None:
    from sts_harness.connect_server import ConnectServerError, SparkConnectServer

    server = SparkConnectServer(tmp_path / "bad", master="no-such-master://x",
                                start_timeout_s=120)
    with pytest.raises(ConnectServerError) as caught:
        server.start()
    message = str(caught.value)
    assert "\n" not in message and "exited" in message and str(server.log_path) in message
    assert server.proc is not None and server.proc.poll() is not None


def test_a_connect_server_on_a_taken_port_is_refused_before_it_starts(tmp_path: Path) -> None:
    """Something already listens on the port (an earlier server left running): the start
    is refused in one line instead of the client talking to that other server."""
    import socket

    from sts_harness.connect_server import ConnectServerError, SparkConnectServer

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        server = SparkConnectServer(tmp_path / "taken", port=port)
        with pytest.raises(ConnectServerError) as caught:
            server.start()
    message = str(caught.value)
    assert "\n" not in message and f"port {port}" in message and "in use" in message
    assert server.proc is None, "no JVM was started"


def test_sts_s3_server_prints_settings_that_delta_rs_writes_with(tmp_path: Path) -> None:
    """``sts s3-server`` as a user runs it: it serves, prints the deltalake writer's
    ``storage_options`` and both writers' locations; a Delta table written with what it
    printed reads back; SIGTERM stops it with exit 0."""
    import json
    import signal
    import subprocess
    import sys

    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from sts_harness.process import free_port

    port = free_port()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "sts"), "s3-server", "--port",
                             str(port), "--bucket", "recipe"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops it." in line:
                break
        text = "".join(lines)
        assert f"http://127.0.0.1:{port}" in text, text
        assert "checkpoint_dir: s3a://recipe/sts/checkpoints" in text, text
        options = json.loads(text.split("storage_options: ", 1)[1].splitlines()[0])
        out_dir = text.split("out_dir: ", 1)[1].splitlines()[0]
        write_deltalake(f"{out_dir}/answers", pa.table({"request_id": ["r1"]}),
                        storage_options=options)
        rows = DeltaTable(f"{out_dir}/answers", storage_options=options).to_pyarrow_table()
        assert rows.column("request_id").to_pylist() == ["r1"]
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "S3 test server stopped." in rest
