"""The fleet simulation (issue 64): the oracle's GPU-seconds, sts-spark's controller
replaying a recorded run's decisions, the fleet's billing, priorities and cold starts, the
anchor policies' rules, and the benchmark's command."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from spark_ext.config import ScalingConfig
from sts_harness.autoscalers import (FleetView, KedaHpa, RayServeScaler, StaticScaler,
                                     StsScaler)
from sts_harness.fleet import GpuModel, Traffic, oracle_gpus, simulate

REPO = Path(__file__).resolve().parents[2]
SLA = (3.0, 8.0, 30.0)


def _traffic(arrivals, tokens, priority=0, name="t") -> Traffic:
    n = len(arrivals)
    return Traffic(name, np.asarray(arrivals, dtype=float), np.full(n, priority),
                   np.zeros(n, int), np.asarray(tokens), SLA)


def test_the_oracles_gpu_seconds_on_a_known_load() -> None:
    """A load of 2.5 GPUs (at the target utilisation) for 600 s: the oracle has 3 GPUs
    while the next 60 s hold the whole load, then what the last seconds' arrivals need."""
    gpu = GpuModel()
    per_second = 2.5 * gpu.capacity_tokens_per_s * gpu.target_utilisation
    traffic = _traffic(np.arange(600.0), np.full(600, per_second))
    gpus = oracle_gpus(traffic, gpu)
    # t <= 540: 3; then k = 600 - t seconds of arrivals ahead need ceil(2.5 k / 60):
    # 3 for k 49-59, 2 for 25-48, 1 for 1-24.
    assert int(gpus.sum()) == 541 * 3 + 11 * 3 + 24 * 2 + 24 * 1
    assert int(oracle_gpus(traffic, gpu, max_gpus=2).max()) == 2


def test_the_sims_controller_makes_the_recorded_runs_decisions() -> None:
    """The signal of the real load-step run (benchmarks/results/load-step/elastic.json,
    the pipeline's checks every 30 s) fed to the simulation's sts-spark policy gives the
    scale actions that run logged: the same actions, targets and times."""
    run = json.loads((REPO / "benchmarks/results/load-step/elastic.json").read_text())
    scaler = StsScaler(ScalingConfig(enabled=True, min_gpus=1, max_gpus=4, up_window_s=60,
                                     down_window_s=180, cooldown_s=120))
    previous = None
    for sample in run["samples"]:  # a check is where the signal the run saw changed
        value = sample["desired_gpus_exact"]
        if previous is not None and value != previous[1]:
            scaler.decide(sample["t_s"], value, previous[0])
        previous = (sample["executors"], value)
    recorded = []
    for action in run["scale_actions"]:
        m = re.match(r"Scaling (up|down): \d+ -> (\d+)", action["message"])
        recorded.append((action["t_s"], m.group(1), int(m.group(2))))
    replayed = [(t, action, target) for t, action, target, _ in scaler.decisions]
    assert [r[1:] for r in replayed] == [r[1:] for r in recorded] == [("up", 4), ("down", 1)]
    assert all(abs(a[0] - b[0]) < 2.0 for a, b in zip(replayed, recorded))


class _Script:
    """A policy that asks for the GPUs of a script (time -> GPUs) and keeps what it saw."""

    name = "script"
    interval_s = 1

    def __init__(self, script: dict[int, int]) -> None:
        self.script, self.views = script, []

    def target(self, view: FleetView) -> int:
        self.views.append(view)
        return self.script.get(int(view.now), view.provisioned)


def test_a_new_gpu_is_billed_from_the_ask_and_serves_after_its_cold_start() -> None:
    gpu = GpuModel(cold_start_s=30.0)
    policy = _Script({0: 2})
    run = simulate(_traffic([0.0, 59.0], [1, 1]), gpu, policy, initial_gpus=1, tail_s=0.0)
    by_second = {int(v.now): v for v in policy.views}
    assert (by_second[10].provisioned, by_second[10].serving) == (2, 1)
    assert by_second[30].serving == 2
    assert run.gpu_seconds == 2 * 60 and run.actions == 1


def test_a_released_gpu_is_billed_until_it_has_finished_what_it_holds() -> None:
    """Two GPUs full of long requests; one released at t=1 keeps being billed while the
    requests it holds run (~13 s), then goes."""
    gpu = GpuModel()
    tokens = 900  # ~13 s at the full batch's time per token
    traffic = _traffic(np.zeros(2 * gpu.batch), np.full(2 * gpu.batch, tokens), priority=2)
    run = simulate(traffic, gpu, _Script({1: 1}), initial_gpus=2, tail_s=20.0)
    busy_s = tokens * gpu.tpot_s
    assert run.within_sla["low"] == 1.0
    assert 21 + int(busy_s) <= run.gpu_seconds <= 21 + int(busy_s) + 2


def test_under_overload_high_is_served_first_and_the_unreachable_counted_apart() -> None:
    gpu = GpuModel()
    rng = np.random.default_rng(0)
    n = 6000  # ~3 GPUs of load on one
    arrivals = np.sort(rng.uniform(0, 120, n))
    priority = rng.choice(3, n, p=[0.2, 0.5, 0.3])
    tokens = np.where(np.arange(n) % 100 == 0, 400, 100)  # 400 tokens: ~5.8 s > high's 3 s
    traffic = Traffic("overload", arrivals, priority, np.zeros(n, int), tokens, SLA)
    run = simulate(traffic, gpu, StaticScaler(1), initial_gpus=1)
    sla = run.within_sla
    assert sla["high"] > 0.99 and sla["high"] >= sla["normal"] >= sla["low"]
    assert sla["low"] < 0.5
    assert run.out_of_reach == int(np.sum((tokens == 400) & (priority == 0)))


def test_sts_spark_scales_up_in_the_load_step_and_back_down_after_it() -> None:
    from benchmarks.fleet_sim import LOAD_STEP_SCALING, load_step_traffic

    gpu = GpuModel(cold_start_s=15.0)
    scaler = StsScaler(ScalingConfig(enabled=True, min_gpus=1, max_gpus=4,
                                     **LOAD_STEP_SCALING))
    run = simulate(load_step_traffic(), gpu, scaler, initial_gpus=1)
    actions = [(round(t), action) for t, action, _, _ in scaler.decisions]
    assert [a for _, a in actions] == ["up", "down"]
    assert 600 < actions[0][0] < 780 < actions[1][0]  # in the step, then after it
    assert run.within_sla["high"] == 1.0


def _view(now: float, provisioned: int, waiting: int = 0, running: int = 0) -> FleetView:
    return FleetView(now=now, provisioned=provisioned, serving=provisioned, waiting=waiting,
                     running=running, signal=lambda: 0.0)


def test_the_hpa_scales_up_by_at_most_double_or_four_and_down_to_its_windows_highest() -> None:
    hpa = KedaHpa(max_gpus=64)
    assert hpa.target(_view(0, 2, waiting=500)) == 6  # wants 50: +4 at most from 2
    assert hpa.target(_view(15, 10, waiting=500)) == 20  # wants 50: double at most
    # KEDA polled at 0; at 30 the queue is empty: the recommendation is 1, but the
    # highest of the last 300 s (50, capped at 64) holds the 20 there are.
    assert hpa.target(_view(30, 20, waiting=0)) == 20
    assert hpa.target(_view(400, 20, waiting=0)) == 1
    assert hpa.target(_view(430, 10, waiting=105)) == 10  # within its 10 % tolerance


def test_keda_on_the_exported_signal_asks_for_its_gpus_rounded_up() -> None:
    hpa = KedaHpa(metric="desired_gpus", threshold=1.0)
    view = FleetView(now=0, provisioned=2, serving=2, waiting=0, running=0,
                     signal=lambda: 7.2)
    assert hpa.target(view) == 6  # wants 8: +4 at most from 2
    with pytest.raises(ValueError, match="waiting or desired_gpus"):
        KedaHpa(metric="lag")


def test_ray_serve_waits_its_upscale_and_downscale_delays() -> None:
    ray = RayServeScaler(target_ongoing_requests=10.0, max_gpus=64)
    wants = [ray.target(_view(t, 2, waiting=30, running=20)) for t in range(31)]
    assert wants[:30] == [2] * 30 and wants[30] == 5
    ray = RayServeScaler(target_ongoing_requests=10.0, max_gpus=64)
    wants = [ray.target(_view(t, 5, running=10)) for t in range(601)]
    assert set(wants[:600]) == {5} and wants[600] == 1


def test_the_benchmark_writes_every_policy_on_a_small_trace(tmp_path: Path) -> None:
    from benchmarks.fleet_sim import main

    rng = np.random.default_rng(1)
    arrivals = np.sort(np.concatenate([rng.uniform(0, 600, 3000), rng.uniform(200, 260, 3000)]))
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": float(a), "input_tokens": 100,
                                         "output_tokens": int(rng.integers(5, 200))}) + "\n"
                             for a in arrivals))
    assert main(["--trace", str(trace), "--scales", "8", "--no-load-step",
                 "--out", str(tmp_path / "out")]) == 0
    doc = json.loads((tmp_path / "out" / "fleet_sim.json").read_text())
    (result,) = doc["results"]
    assert result["oracle_peak_gpus"] <= 8 and result["copies"] >= 2
    runs = {r["policy"]: r for r in result["runs"]}
    assert {"oracle", "sts-spark", "keda-hpa (queue)", "keda-hpa (desired_gpus)",
            "ray-serve"} <= set(runs)
    assert runs["oracle"]["x_oracle"] == pytest.approx(1.0, abs=0.05)
    assert all(set(r["within_sla"]) == {"high", "normal", "low"} for r in runs.values())


def test_the_benchmark_refuses_a_scale_that_is_not_a_number(capsys) -> None:
    from benchmarks.fleet_sim import main

    assert main(["--scales", "eight"]) == 2
    assert "--scales 'eight'" in capsys.readouterr().err


def test_traffic_refuses_arrivals_out_of_order() -> None:
    with pytest.raises(ValueError, match="in order"):
        _traffic([2.0, 1.0], [1, 1])
    assert dataclasses.is_dataclass(GpuModel())
