"""Spark's JVM starts every time, whatever gRPC threads the process runs (``sts demo``
starts Spark with its sidecar client already streaming)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sidecar.client import request_to_proto
from tests.utils import RemoteSidecar, make_request

#: Launches per test; PySpark's own launcher failed about 1 in 7 of them this way.
STARTS = 20


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_jvm_starts_every_time_next_to_a_streaming_grpc_client(tmp_path: Path) -> None:
    """20 launches of the driver's JVM while two threads stream SubmitBatch calls to a
    real sidecar: all start (PySpark's fork-and-preexec launcher lost 2 of 15 here,
    ``JAVA_GATEWAY_EXITED`` after gRPC's fork handlers ran in the child)."""
    from pyspark import SparkConf

    from spark_ext.session import launch_jvm

    with RemoteSidecar(tmp_path / "results", ["--engine", "simulated"]) as sidecar:
        stop, sent, errors = threading.Event(), [0], []

        def stream(worker: int) -> None:
            i = 0
            while not stop.is_set():
                try:
                    sidecar.client.submit([request_to_proto(make_request(f"w{worker}-{i}-{j}"))
                                           for j in range(8)])
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(e)
                    return
                sent[0] += 8
                i += 1

        threads = [threading.Thread(target=stream, args=(w,), daemon=True) for w in range(2)]
        for t in threads:
            t.start()
        started, failed = 0, []
        try:
            for k in range(STARTS):
                try:
                    gateway = launch_jvm(SparkConf())
                    assert gateway.jvm.java.lang.System.currentTimeMillis() > 0
                    gateway.shutdown()
                    gateway.proc.stdin.close()
                    gateway.proc.wait(30)
                    started += 1
                except Exception as e:  # noqa: BLE001 - counted
                    failed.append(f"start {k}: {type(e).__name__}: {e}")
        finally:
            stop.set()
            for t in threads:
                t.join(30)
    assert not errors, errors
    assert sent[0] > STARTS * 8, "the client did not stream during the starts"
    assert started == STARTS, failed
