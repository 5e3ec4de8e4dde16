"""A 100,000-request ``SubmitBatch`` does not stall the sidecar: it is admitted in steps
that yield the event loop, so health answers within 100 ms meanwhile (a real sidecar
process, simulated engine; the batch is sent from a third process so that the prober's
own interpreter is not busy serialising it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from tests.utils import REPO, RemoteSidecar

pytestmark = pytest.mark.timeout(240)

N = 100_000

SENDER = textwrap.dedent("""
    import sys, time
    from sidecar.client import SidecarClient, request_to_proto
    from tests.utils import make_request
    target, n = sys.argv[1], int(sys.argv[2])
    reqs = [request_to_proto(make_request(f"big-{i}", priority="low")) for i in range(n)]
    print("built", flush=True)
    with SidecarClient(target, timeout_s=180) as client:
        started = time.perf_counter()
        reply = client.submit(reqs)
        ids = [a.request_id for a in reply.acks]
        assert ids == [f"big-{i}" for i in range(n)], "one ack per request, in order"
        print(f"acks {len(ids)} in {time.perf_counter() - started:.2f} s", flush=True)
""")


def test_health_answers_within_100_ms_during_a_100k_request_batch(tmp_path: Path) -> None:
    with RemoteSidecar(tmp_path / "results", ["--engine", "simulated",
                                              "--set", "scheduler.dedupe_window=200000"]) as sc:
        assert sc.client is not None
        sender = subprocess.Popen([sys.executable, "-c", SENDER, sc.target, str(N)], cwd=REPO,
                                  stdout=subprocess.PIPE, text=True)
        assert sender.stdout is not None and sender.stdout.readline().strip() == "built"
        latencies: list[float] = []
        while sender.poll() is None:
            started = time.perf_counter()
            reply = sc.client._health.Check(health_pb2.HealthCheckRequest(service=""),
                                            timeout=10)
            latencies.append(time.perf_counter() - started)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            time.sleep(0.01)
        out = sender.stdout.read()
        assert sender.returncode == 0 and f"acks {N}" in out, out
        assert sc.proc is not None and sc.proc.poll() is None, "the sidecar is alive"
    ordered = sorted(latencies)
    p95 = ordered[int(0.95 * (len(ordered) - 1))]
    print(f"{out.strip()}; {len(latencies)} health checks meanwhile, p95 {p95 * 1000:.1f} ms, "
          f"slowest {[round(x * 1000, 1) for x in ordered[-3:]]} ms")
    assert len(latencies) >= 10, "the batch took long enough to probe health during it"
    # The sidecar yields every submit_yield_ms (5 ms); what is left is the OS scheduler of a
    # shared 2-core CI machine (three busy processes here), hence p95 for the 100 ms bound
    # and a looser bound on the single slowest answer (before the fix: 2.9 s).
    assert p95 < 0.1, ordered[-10:]
    assert ordered[-1] < 0.5, ordered[-10:]
