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
    """One local SparkSession for the whole test session."""
    from spark_ext.session import local_session

    session = local_session("sts-tests")
    yield session
    session.stop()
