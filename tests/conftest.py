"""Session fixtures: the prepared SmolLM2, a tiny Llama, and one shared real sidecar."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from tests.tiny_llama import build_tiny_llama  # noqa: E402
from tests.utils import RemoteSidecar  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf" / "sidecar.yaml"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The packaged SmolLM2 converted for vLLM (cached across runs)."""
    from sidecar.model_prep import prepare_default_model

    return prepare_default_model()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), smollm2_dir)


@pytest.fixture(scope="session")
def tiny_sidecar(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path
                 ) -> Iterator[RemoteSidecar]:
    """A real sidecar process (real vLLM, tiny Llama) with room for two requests in the
    engine, so queueing and priority are visible. Tests use unique request ids.

    Deadline-aware admission is off and every pool may queue for a minute, so that
    deadlines can be seen to abort work in the engine and in the queue, and tests
    that leave long requests running do not get later tests' requests shed;
    test_vllm_overload.py runs with the shipped settings."""
    results = tmp_path_factory.mktemp("tiny-sidecar") / "results"
    args = ["--config", str(CONF), "--model", str(tiny_llama_dir),
            "--max-in-flight", "2", "--engine-arg", "max_num_seqs=2",
            "--sidecar-id", "tiny-sidecar", "--set", "scheduler.deadline_admission=false",
            *[arg for p in ("high", "normal", "low")
              for arg in ("--set", f"scheduler.pools.{p}.max_queue_delay_ms=60000")]]
    with RemoteSidecar(results, args) as sidecar:
        yield sidecar


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory):
    """One real single-node Kafka broker (KRaft, Apache Kafka's Maven jars) on loopback
    for the whole test session. Topics are created on first use; tests use their own
    topic names. A test that kills the broker must start it again before it returns."""
    from sts_harness.kafka_broker import KafkaBroker

    with KafkaBroker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole test session (its JVM packages resolved and
    recorded first, as ``scripts/install.sh`` does)."""
    from spark_ext import delta_log_store, jvm_packages
    from spark_ext.session import local_session

    if not os.environ.get(jvm_packages.PACKAGES_ENV):
        if not jvm_packages.recorded_jars(jvm_packages.packages()):
            jvm_packages.fetch()
        try:  # built by the fetch (by an older one, not yet)
            jvm_packages.build_log_store()
        except delta_log_store.LogStoreBuildError:  # no javac: Delta's own log store;
            pass  # tests/process/test_delta_log_store.py says so (a failure under CI)
    session = local_session("sts-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_server():
    """One S3-compatible server (moto, in this process) on loopback for the whole test
    session, with the bucket ``sts-test``. Its objects live in memory; tests use their own
    key prefixes. ``s3_server.storage_options`` (delta-rs), ``.spark_conf()`` (S3A),
    ``.environment`` (AWS variables), ``.uri(key, scheme=...)``, ``.keys(prefix)``."""
    from sts_harness.s3_server import S3Server

    with S3Server("sts-test") as server:
        yield server


#: What the test Connect server loads: Spark's Kafka connector, Delta, hadoop-aws and the
#: local file system without shell commands.
CONNECT_FEATURES = ("kafka", "delta", "s3", "localfs")


@pytest.fixture(scope="session")
def spark_connect_server(tmp_path_factory: pytest.TempPathFactory, s3_server):
    """One real Spark Connect server (its own JVM, ``local[2]``) for the whole test
    session, with Kafka, Delta (extension and catalog) and S3A pointed at ``s3_server``,
    the warehouse in a temporary folder. Its Python workers run this interpreter with the
    repository on ``PYTHONPATH`` (functions defined in test modules are pickled by
    reference). ``.remote`` is its ``sc://`` URL, ``.log_path`` its log."""
    from spark_ext import jvm_packages
    from sts_harness.connect_server import SparkConnectServer

    _ensure_jvm_packages(CONNECT_FEATURES)
    work = tmp_path_factory.mktemp("connect-server")
    conf = {**jvm_packages.session_conf(CONNECT_FEATURES), **s3_server.spark_conf(),
            "spark.sql.warehouse.dir": str(work / "warehouse"),
            # Delta's snapshot is rebuilt with 50 tasks by default: seconds per commit on 2 cores
            "spark.databricks.delta.snapshotPartitions": "2"}
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    with SparkConnectServer(work, conf=conf, env={"PYTHONPATH": pythonpath}) as server:
        yield server


@pytest.fixture
def spark_connect(spark_connect_server, monkeypatch: pytest.MonkeyPatch):
    """A fresh Spark Connect client session on ``spark_connect_server`` for one test,
    stopped after it (the server stops the session's streaming queries). While the test
    runs, ``SPARK_CONNECT_MODE_ENABLED`` is set so that ``pyspark.sql.functions`` build
    Connect columns; it is removed afterwards so that the classic ``spark`` fixture keeps
    working in the same process."""
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    session = spark_connect_server.client()
    try:
        yield session
    finally:
        session.stop()


def _ensure_jvm_packages(features) -> None:
    """Resolve ``features``' Maven packages into Spark's Ivy cache unless they are there
    (hadoop-aws brings a ~600 MB AWS SDK bundle, more than a server's start timeout allows
    on a cold cache)."""
    from spark_ext import jvm_packages

    jars = Path.home() / ".ivy2.5.2" / "jars"  # Spark 4's default spark.jars.ivy
    if not all((jars / jvm_packages.ivy_jar_name(c)).exists()
               for c in jvm_packages.packages(features)):
        jvm_packages.fetch(features)
