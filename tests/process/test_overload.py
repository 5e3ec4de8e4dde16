"""Sustained overload: a real sidecar process on the ``simulated`` engine, driven over
gRPC at about 10x its capacity with a mixed-priority, long-tailed load, plus the
Prometheus endpoint checked with ``promtool``."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from benchmarks.loadgen import collect, report, send_load
from sts_capacity.profiles import TrafficProfile
from tests.utils import REPO, RemoteSidecar, free_port, read_results, require_tool

pytestmark = pytest.mark.timeout(300)

# Engine: 16 sequences, ~10 ms per step -> ~1,600 output tokens/s. Mean max_tokens ~66
# (log-normal, median 48) -> about 25 requests/s. The load sends 250/s: 10x.
ENGINE = ["--set", "engine.simulated.max_num_seqs=16",
          "--set", "engine.simulated.step_base_ms=8.0",
          "--set", "engine.simulated.step_per_seq_ms=0.1"]
POOL_QUEUE_CAPS = {"high": 200, "normal": 400, "low": 400}
SCHEDULER = ["--max-in-flight", "16",
             "--set", f"scheduler.pools.high.max_queued={POOL_QUEUE_CAPS['high']}",
             "--set", f"scheduler.pools.normal.max_queued={POOL_QUEUE_CAPS['normal']}",
             "--set", f"scheduler.pools.low.max_queued={POOL_QUEUE_CAPS['low']}",
             "--set", "scheduler.pools.high.max_in_flight=16",
             "--set", "scheduler.pools.normal.max_in_flight=10",
             "--set", "scheduler.pools.low.max_in_flight=6",
             "--set", 'scheduler.load_shedding.queue_depth={"low": 150, "normal": 600}']
# Output lengths: long-tailed log-normal fitted to P50 48 / P90 134 / P99 256 (cap 256).
OVERLOAD = TrafficProfile.from_dict({
    "name": "overload-10x", "arrivals": {"kind": "poisson", "rate_per_s": 250.0},
    "input_tokens": {"p50": 30, "p90": 45, "p99": 70, "long_share": 0.0},
    "output_tokens": {"p50": 48, "p90": 134, "p99": 256, "long_share": 0.0, "cap": 256},
    "priority_mix": {"high": 0.05, "normal": 0.25, "low": 0.70},
    "sla_ms": {"high": 5000, "normal": 6000, "low": 10_000}})
DURATION_S = 12.0


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@pytest.fixture(scope="module")
def sim_sidecar(tmp_path_factory: pytest.TempPathFactory):
    results = tmp_path_factory.mktemp("overload") / "results"
    metrics_port = free_port()
    args = ["--config", "conf/sidecar.yaml", "--engine", "simulated",
            "--metrics-port", str(metrics_port), "--sidecar-id", "sim-overload",
            *ENGINE, *SCHEDULER]
    with RemoteSidecar(results, args, start_timeout_s=60) as sidecar:
        sidecar.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        yield sidecar


@pytest.fixture(scope="module")
def overload_outcome(sim_sidecar: RemoteSidecar) -> dict:
    assert sim_sidecar.proc is not None
    rss_before = _rss_mb(sim_sidecar.proc.pid)
    run = send_load(sim_sidecar.client, OVERLOAD, DURATION_S, seed=11, id_prefix="ovl")
    rss_after_load = _rss_mb(sim_sidecar.proc.pid)
    results = collect(run, sim_sidecar.results_dir, timeout_s=60)
    outcome = report(run, results)
    outcome["rss_mb"] = (rss_before, rss_after_load)
    print({k: v for k, v in outcome.items()})
    outcome["run"] = run
    return outcome


def test_high_priority_meets_its_deadline_under_10x_overload(overload_outcome: dict) -> None:
    high = overload_outcome["by_priority"]["high"]
    assert high["sent"] >= 100, high
    assert high["on_time_rate"] >= 0.99, high
    # The engine was saturated and most of the load could not be served at all.
    assert overload_outcome["shed"] > overload_outcome["sent"] * 0.5, overload_outcome


def test_shedding_hits_low_first(overload_outcome: dict) -> None:
    share = overload_outcome["shed_share_by_priority"]
    assert share["low"] > 0.5 and share["low"] > share["normal"] > share["high"], share
    by = overload_outcome["by_priority"]
    assert by["high"]["on_time_rate"] > by["normal"]["on_time_rate"] > by["low"]["on_time_rate"]
    reasons = {r for p in by.values() for r in p["shed_by_reason"]}
    assert reasons & {"overloaded", "deadline_infeasible", "queue_full",
                      "queue_delay_exceeded"}, reasons


def test_every_request_gets_exactly_one_terminal_result(overload_outcome: dict) -> None:
    # collect() already failed on duplicates and on missing results; recheck the totals.
    assert overload_outcome["results"] == overload_outcome["sent"]
    for prio in overload_outcome["by_priority"].values():
        assert sum(prio["by_status"].values()) == prio["sent"]


def test_memory_stays_bounded(overload_outcome: dict) -> None:
    for prio, cap in POOL_QUEUE_CAPS.items():
        assert overload_outcome["max_queued_seen"][prio] <= cap
    before, after = overload_outcome["rss_mb"]
    # ~3,000 requests passed through; queues are capped, so memory must not follow the load.
    assert after - before < 150, (before, after)


def test_refusals_carry_the_pool_fallback_text(sim_sidecar: RemoteSidecar,
                                               overload_outcome: dict) -> None:
    shed = [r for r in read_results(sim_sidecar.results_dir) if r["status"] == "shed"]
    assert shed and all(r["fallback_text"] and r["reason"] for r in shed)
    low = next(r for r in shed if r["priority"] == "low")
    assert low["fallback_text"] == "Thanks for your message. We will reply by email."


def test_metrics_endpoint_passes_promtool(sim_sidecar: RemoteSidecar,
                                          overload_outcome: dict, tmp_path: Path) -> None:
    text = urllib.request.urlopen(sim_sidecar.metrics_url, timeout=10).read().decode()
    for name in ("sts_sidecar_queue_depth", "sts_sidecar_in_flight_requests",
                 "sts_sidecar_time_to_first_token_seconds_bucket",
                 "sts_sidecar_time_per_output_token_seconds_bucket",
                 "sts_sidecar_request_latency_seconds_bucket", "sts_sidecar_results_total",
                 "sts_sidecar_output_tokens_per_second", "sts_sidecar_kv_cache_usage_ratio",
                 "sts_sidecar_prefix_cache_hit_ratio", "sts_sidecar_dedupe_hits_total"):
        assert name in text, name
    assert 'sts_sidecar_results_total{priority="low",reason="' in text
    promtool = require_tool("promtool", "Debian's prometheus package")
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def test_stats_rpc_reports_the_same_pools(sim_sidecar: RemoteSidecar,
                                          overload_outcome: dict) -> None:
    from sidecar.stats_report import format_stats

    stats = sim_sidecar.client.stats()
    pools = {p.priority: p for p in stats.pools}
    assert len(pools) == 3 and all(p.max_queued > 0 for p in pools.values())
    low = [p for p in stats.pools if p.max_queued == POOL_QUEUE_CAPS["low"]]
    assert low and sum(low[0].shed_by_reason.values()) > 0
    assert sum(stats.results_by_status.values()) >= overload_outcome["sent"]
    assert "low" in format_stats(stats)


def test_sidecar_stats_cli_prints_the_pools(sim_sidecar: RemoteSidecar,
                                            overload_outcome: dict) -> None:
    out = subprocess.run([sys.executable, "-m", "sidecar.cli", "sidecar-stats", "--target",
                          sim_sidecar.target], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("sidecar sim-overload") and "engine simulated" in lines[0]
    low = next(line for line in lines if line.startswith("low"))
    assert f"/{POOL_QUEUE_CAPS['low']}" in low and "deadline_infeasible" in low
