"""Warm-up before SERVING: short generations through the engine (chat template, stable
prefixes) before the port opens; its time is logged and exported; it writes no rows;
a failed warm-up fails the start and undoes it."""

from __future__ import annotations

import asyncio
import logging
import urllib.request
from pathlib import Path

import pytest

from sidecar.client import SidecarClient
from sidecar.config import SidecarConfig, WarmupConfig
from sidecar.engines import EngineRequest
from sidecar.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from sidecar.exceptions import EngineStartError
from sidecar.server import serve
from sidecar.estimator import ServiceRateEstimator
from sidecar.warmup import calibrate, warm_up
from tests.utils import free_port, read_results

pytestmark = pytest.mark.timeout(60)


class RecordingEngine(SimulatedEngine):
    """A simulated engine that remembers what it was asked to generate."""

    def __init__(self) -> None:
        super().__init__(SimulatedEngineConfig(step_base_ms=1.0, chars_per_token=1.0))
        self.seen: list[EngineRequest] = []

    def generate(self, request: EngineRequest):  # type: ignore[no-untyped-def]
        self.seen.append(request)
        return super().generate(request)


def test_warm_up_sends_every_prompt_and_prefix_each_round() -> None:
    engine = RecordingEngine()
    config = WarmupConfig(prompts=["Hi", "Where is my order?"],
                          stable_prefixes=["You are a support assistant."], rounds=2,
                          max_tokens=3)

    async def main() -> float:
        await engine.start()
        try:
            return await warm_up(engine, config)
        finally:
            await engine.shutdown()

    elapsed = asyncio.run(main())
    assert elapsed > 0
    assert len(engine.seen) == 2 * 4  # (2 prompts + 1 prefix x 2 prompts) x 2 rounds
    lengths = sorted(len(r.prompt_token_ids) for r in engine.seen[:4])
    assert lengths == sorted(len(t) for t in config.texts())
    assert {r.max_tokens for r in engine.seen} == {3}
    assert asyncio.run(warm_up(engine, WarmupConfig(enabled=False))) == 0.0


def test_calibration_measures_a_lone_and_a_full_batch_and_seeds_the_estimator() -> None:
    """The simulated step costs 10 ms + 5 ms per sequence: alone ~15 ms per token, eight
    together ~50 ms; the service model knows both before any real request."""
    engine = SimulatedEngine(SimulatedEngineConfig(step_base_ms=10.0, step_per_seq_ms=5.0))

    async def main():  # type: ignore[no-untyped-def]
        await engine.start()
        try:
            return await calibrate(engine, WarmupConfig(calibration_tokens=6), 8)
        finally:
            await engine.shutdown()

    samples = asyncio.run(main())
    assert sorted({s.batch for s in samples}) == [1, 8] and len(samples) == 9
    est = ServiceRateEstimator()
    assert not est.warm
    est.calibrate(samples)
    assert est.warm
    assert est.speed.tpot(1) == pytest.approx(0.015, rel=0.5)
    assert est.speed.tpot(8) == pytest.approx(0.050, rel=0.5)
    assert est.speed.tpot(1) < est.speed.tpot(8)
    assert asyncio.run(calibrate(engine, WarmupConfig(calibrate=False), 8)) == []


def test_the_slow_cpu_engine_calibrates_as_the_slow_machine_measured() -> None:
    """``SLOW_CPU`` (issue 31's AVX2-only machine): 99 ms per output token alone and 154
    ms in a batch of 8, as that machine's own calibration read them."""
    from sidecar.engines.simulated import SLOW_CPU

    engine = SimulatedEngine(SimulatedEngineConfig(**SLOW_CPU))

    async def main():  # type: ignore[no-untyped-def]
        await engine.start()
        try:
            return await calibrate(engine, WarmupConfig(calibration_tokens=6), 8)
        finally:
            await engine.shutdown()

    est = ServiceRateEstimator()
    est.calibrate(asyncio.run(main()))
    assert est.speed.tpot(1) == pytest.approx(0.099, rel=0.15)
    assert est.speed.tpot(8) == pytest.approx(0.154, rel=0.15)


def test_the_sidecar_warms_up_before_serving_and_reports_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    port, metrics_port = free_port(), free_port()
    config = SidecarConfig.from_dict({
        "server": {"listen": f"127.0.0.1:{port}", "metrics_port": metrics_port},
        "engine": {"kind": "simulated"},
        "warmup": {"stable_prefixes": ["You are a support assistant."]},
        "results": {"results_dir": str(tmp_path / "results")},
    })
    seen: dict[str, object] = {}

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(serve(config, stop=stop))

        def probe() -> None:
            with SidecarClient(f"127.0.0.1:{port}") as client:
                client.wait_until_serving(20)
                stats = client.stats()
                seen["submitted"] = stats.submitted
                seen["calibration"] = [(c.batch, c.ttft_ms > 0, c.tpot_ms > 0)
                                       for c in stats.calibration]
            body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                          timeout=10).read().decode()
            seen["metric"] = next(line for line in body.splitlines()
                                  if line.startswith("sts_sidecar_warmup_seconds "))
            seen["engine_up"] = "sts_sidecar_engine_up 1.0" in body

        try:
            await asyncio.to_thread(probe)
        finally:
            stop.set()
            await task

    with caplog.at_level(logging.INFO, logger="sidecar.warmup"):
        asyncio.run(main())
    assert seen["submitted"] == 0, "warm-up requests do not count"
    full = config.scheduler.max_in_flight
    assert seen["calibration"] == [(1, True, True)] + [(full, True, True)] * full, \
        "GetStats carries the calibration: one generation alone, then the full batch"
    assert float(str(seen["metric"]).split()[1]) > 0
    assert seen["engine_up"] is True
    assert any("Warm-up: 8 generations (4 prompts x 2 rounds)" in r.getMessage()
               for r in caplog.records)
    assert read_results(tmp_path / "results") == [], "warm-up writes no result rows"


def test_a_failed_warm_up_fails_the_start_and_undoes_it(tmp_path: Path) -> None:
    config = SidecarConfig.from_dict({
        "server": {"listen": f"127.0.0.1:{free_port()}"},
        "engine": {"kind": "simulated", "simulated": {"fail_after_s": 0.0}},
        "results": {"results_dir": str(tmp_path / "results")},
    })

    async def main() -> list[asyncio.Task]:
        with pytest.raises(EngineStartError, match="warm-up generation failed"):
            await serve(config)
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert asyncio.run(main()) == []
