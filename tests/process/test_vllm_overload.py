"""The overload scenario of test_overload.py on real vLLM (CPU, tiny Llama), scaled down:
the same ordering must hold. The tiny Llama never stops early, so every request
generates exactly ``max_tokens``; ~5 ms per token with 4 sequences gives about
12 requests/s of capacity for the load below, which sends 120/s."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.loadgen import collect, report, send_load
from sts_capacity.profiles import TrafficProfile
from tests.conftest import CONF
from tests.utils import RemoteSidecar

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

# Output lengths: long-tailed log-normal fitted to P50 48 / P90 120 / P99 192 (cap 192).
PROFILE = TrafficProfile.from_dict({
    "name": "vllm-overload", "arrivals": {"kind": "poisson", "rate_per_s": 120.0},
    "input_tokens": {"p50": 30, "p90": 45, "p99": 70, "long_share": 0.0},
    "output_tokens": {"p50": 48, "p90": 120, "p99": 192, "long_share": 0.0, "cap": 192},
    "priority_mix": {"high": 0.1, "normal": 0.3, "low": 0.6},
    "sla_ms": {"high": 2000, "normal": 3000, "low": 5000}})


@pytest.fixture(scope="module")
def vllm_overload(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> dict:
    results_dir = tmp_path_factory.mktemp("vllm-overload") / "results"
    args = ["--config", str(CONF), "--model", str(tiny_llama_dir), "--max-in-flight", "4",
            "--engine-arg", "max_num_seqs=4", "--sidecar-id", "vllm-overload",
            "--set", "scheduler.pools.normal.max_in_flight=3",
            "--set", "scheduler.pools.low.max_in_flight=2"]
    with RemoteSidecar(results_dir, args) as sidecar:
        # Warm-up at a rate the engine sustains, so the estimator has seen real service times.
        warm = send_load(sidecar.client, PROFILE.with_rate(4.0), 2.0, seed=1,
                         id_prefix="warm")
        collect(warm, results_dir, timeout_s=60)
        run = send_load(sidecar.client, PROFILE, 6.0, seed=3, id_prefix="vovl")
        outcome = report(run, collect(run, results_dir, timeout_s=90))
        outcome["stats"] = sidecar.client.stats()
    print({k: v for k, v in outcome.items() if k != "stats"})
    return outcome


def test_same_ordering_as_the_simulated_scenario(vllm_overload: dict) -> None:
    by = vllm_overload["by_priority"]
    assert by["high"]["on_time_rate"] > by["normal"]["on_time_rate"] > by["low"]["on_time_rate"]
    # The ordering is the requirement; the floor only catches a scheduler that starves all.
    # (Measured: high 79-100 % on time, depending on how loaded the 2 cores are.)
    assert by["high"]["on_time_rate"] >= 0.5, by["high"]
    share = vllm_overload["shed_share_by_priority"]
    assert share["low"] > 0.5 and share["low"] > share["normal"] > share["high"], share
    assert vllm_overload["results"] == vllm_overload["sent"]


def test_engine_figures_come_from_vllm(vllm_overload: dict) -> None:
    stats = vllm_overload["stats"]
    assert stats.engine == "vllm"
    assert stats.kv_cache_usage >= 0.0  # -1 would mean vLLM's stat logger never reported
    pools = {p.priority: p for p in stats.pools}
    assert all(p.tpot_ms > 0 for p in pools.values())
