"""A real sidecar process whose engine dies (the simulated engine's ``fail_after_s`` drill):
health turns ``NOT_SERVING``, and the process exits non-zero with one line, so a
supervisor restarts it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from sidecar.client import SidecarClient
from tests.utils import REPO, free_port, make_request, wait_for_results

pytestmark = pytest.mark.timeout(90)


def test_engine_death_is_not_serving_then_a_nonzero_exit(tmp_path: Path) -> None:
    target = f"127.0.0.1:{free_port()}"
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "sidecar.cli", "sidecar", "--engine", "simulated",
           "--listen", target, "--results-dir", str(results),
           "--set", "engine.simulated.fail_after_s=5", "--set", "warmup.enabled=false",
           "--set", "server.engine_death_grace_s=3",
           "--set", "scheduler.engine_check_interval_s=0.1"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    statuses: list[int] = []
    try:
        with SidecarClient(target, timeout_s=5) as client:
            client.wait_until_serving(60)
            acks = client.submit([make_request(f"r{i}", max_tokens=2000) for i in range(4)])
            assert all(a.accepted for a in acks.acks)
            deadline = time.monotonic() + 30
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    reply = client._health.Check(health_pb2.HealthCheckRequest(service=""),
                                                 timeout=1)
                    statuses.append(reply.status)
                except Exception:
                    pass
                time.sleep(0.05)
        rc = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read() if proc.stderr else ""
    assert health_pb2.HealthCheckResponse.NOT_SERVING in statuses
    assert rc == 1, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("sts: the engine died: simulated engine failure"), last
    rows = wait_for_results(results, {f"r{i}" for i in range(4)}, timeout_s=5)
    assert {r["status"] for r in rows.values()} == {"error"}
