"""The scale signal (issue 32, item 1): demand against the measured capacity and the
GPUs the capacity formula asks for, on ``GetStats`` and ``/metrics``."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import generate_latest

from sidecar.config import SchedulerConfig
from sidecar.contract import Priority
from sidecar.metrics import SidecarMetrics
from sidecar.request_state import ResultRecord
from sidecar.scale_signal import DemandMeter, scale_signal
from sidecar.scheduler import Scheduler
from sidecar.servicer import stats_to_proto
from sidecar.stats_report import format_stats
from sidecar.warmup import SpeedSample
from tests.utils import fast_engine, make_sidecar_request


def test_the_formula_on_a_known_load() -> None:
    """1,200 requests of 100 tokens in 60 s (2,000 tokens/s) and 6,000 tokens queued
    (100 tokens/s over the window) against 500 tokens/s per GPU (batch 8 at 16 ms a
    token) at 70 %: 2,100 / 350 = 6 GPUs; the sidecar's one GPU is at 420 %."""
    now = [0.0]
    meter = DemandMeter(window_s=60.0, clock=lambda: now[0])
    for second in range(60):
        now[0] = float(second)
        meter.arrived(Priority.NORMAL, tokens=2000.0, requests=20, refused=5)
    now[0] = 60.0
    signal = scale_signal(meter, backlog_tokens=6000.0, full_batch=8,
                          tpot_at_full_batch_s=0.016, gpus=1, target_utilisation=0.7,
                          finished=100, timeouts=25)
    assert signal.demand_tokens_per_s == pytest.approx(2100.0)
    assert signal.demand_by_pool == {"high": 0.0, "normal": pytest.approx(2000.0), "low": 0.0}
    assert signal.capacity_tokens_per_s == pytest.approx(500.0)
    assert signal.desired_gpus_exact == pytest.approx(6.0)
    assert signal.desired_gpus == 6
    assert signal.utilisation == pytest.approx(4.2)
    assert signal.refused_share == pytest.approx(0.25)
    assert signal.timeout_share == pytest.approx(0.25)
    # Arrivals older than the window no longer count; an unknown speed asks for the
    # GPUs there are.
    now[0] = 200.0
    idle = scale_signal(meter, backlog_tokens=0.0, full_batch=8, tpot_at_full_batch_s=None,
                        gpus=2, target_utilisation=0.7, finished=100, timeouts=25)
    assert (idle.demand_tokens_per_s, idle.capacity_tokens_per_s, idle.desired_gpus) == \
        (0.0, 0.0, 2)


def test_a_sidecar_reports_the_demand_it_was_given() -> None:
    """Ten requests of 50 tokens queued on a calibrated scheduler (batch 4 at 20 ms a
    token: 200 tokens/s) that dispatches nothing: 500 tokens arrived within a second
    plus 500 queued over 60 s; GetStats, /metrics and ``sts sidecar-stats`` say so."""
    results: list[ResultRecord] = []

    async def body() -> None:
        engine = fast_engine(max_num_seqs=4)
        s = Scheduler(engine, results.append, SchedulerConfig(max_in_flight=4), "t")
        s.estimator.calibrate([SpeedSample(batch=1, ttft_s=0.05, tpot_s=0.01),
                               SpeedSample(batch=4, ttft_s=0.08, tpot_s=0.02)])
        acks = s.submit_batch([make_sidecar_request(f"r{i}", max_tokens=50, priority=Priority.HIGH)
                               for i in range(10)])
        assert all(a.accepted for a in acks)
        stats = s.stats()
        scale = stats.scale
        assert scale is not None
        assert scale.backlog_tokens == pytest.approx(500.0)
        assert scale.demand_tokens_per_s == pytest.approx(500.0 + 500.0 / 60, rel=1e-6)
        assert scale.capacity_tokens_per_s == pytest.approx(200.0)
        assert scale.desired_gpus == 4  # 508 / (200 x 0.7) = 3.6
        msg = stats_to_proto(stats, sidecar_id="t", engine_kind="simulated", model="m",
                             uptime_s=1.0)
        assert (msg.scale.desired_gpus, round(msg.scale.capacity_tokens_per_s)) == (4, 200)
        assert "desired GPUs 4" in format_stats(msg)
        text = generate_latest(SidecarMetrics(s).registry).decode()
        assert "sts_sidecar_desired_gpus 4.0" in text
        assert "sts_sidecar_desired_gpus_exact 3.6" in text
        assert "sts_sidecar_capacity_tokens_per_second 200.0" in text
        await s.abort_all()

    asyncio.run(body())
