"""GPU utilisation and memory on the sidecar's /metrics: the exposition, read from a test
double of NVML (``tests/fake_nvml``), and nothing at all where there is no GPU.
(tests/process/test_monitoring.py checks a real sidecar's endpoint with them by promtool.)"""

from __future__ import annotations

import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.utils import floatToGoString as go

from sidecar.config import SchedulerConfig, ServerConfig
from sidecar.gpu_metrics import GpuCollector
from sidecar.metrics import SidecarMetrics
from sidecar.scheduler import Scheduler
from tests.fake_nvml import pynvml as fake_nvml
from tests.utils import fast_engine

GIB = 1 << 30
DEVICES = [
    {"uuid": "GPU-aaaa", "util": 40, "used": 10 * GIB, "total": 80 * GIB},
    {"uuid": "GPU-bbbb", "util": 0, "used": 1 * GIB, "total": 80 * GIB},
    {"uuid": "GPU-cccc", "util": 97, "used": 79 * GIB, "total": 80 * GIB},
]


@pytest.fixture
def nvml():
    fake_nvml.configure([dict(d) for d in DEVICES])
    yield fake_nvml
    fake_nvml.configure(None)


def _exposition(collector: GpuCollector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def _series(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("sts_sidecar_gpu")]


def test_the_gpus_in_cuda_visible_devices_are_reported(nvml) -> None:
    collector = GpuCollector.open(env={"CUDA_VISIBLE_DEVICES": "0,GPU-cccc"}, nvml=nvml)
    assert collector is not None
    text = _exposition(collector)
    assert sorted(_series(text)) == sorted([
        'sts_sidecar_gpu_utilization_ratio{gpu="0",uuid="GPU-aaaa"} 0.4',
        'sts_sidecar_gpu_utilization_ratio{gpu="2",uuid="GPU-cccc"} 0.97',
        f'sts_sidecar_gpu_memory_used_bytes{{gpu="0",uuid="GPU-aaaa"}} {go(10.0 * GIB)}',
        f'sts_sidecar_gpu_memory_used_bytes{{gpu="2",uuid="GPU-cccc"}} {go(79.0 * GIB)}',
        f'sts_sidecar_gpu_memory_total_bytes{{gpu="0",uuid="GPU-aaaa"}} {go(80.0 * GIB)}',
        f'sts_sidecar_gpu_memory_total_bytes{{gpu="2",uuid="GPU-cccc"}} {go(80.0 * GIB)}',
    ])
    collector.close()
    collector.close()
    assert nvml.initialised == 0, "NVML not released"
    assert _series(_exposition(collector)) == []


def test_the_configured_gpus_win_over_the_environment_and_unknown_ones_are_skipped(nvml
                                                                                   ) -> None:
    collector = GpuCollector.open([1, "GPU-nope", 7], env={"CUDA_VISIBLE_DEVICES": "0"},
                                  nvml=nvml)
    assert collector is not None
    assert {line.split("{")[1].split("}")[0] for line in _series(_exposition(collector))} == {
        'gpu="1",uuid="GPU-bbbb"'}
    assert GpuCollector.open(env={}, nvml=nvml).devices.__len__() == 3  # unset: every GPU


def test_a_gpu_that_stops_answering_is_left_out_of_that_scrape_only(nvml) -> None:
    collector = GpuCollector.open(env={}, nvml=nvml)
    assert collector is not None
    nvml._devices[1]["fail"] = True
    assert {line.split('gpu="')[1][0] for line in _series(_exposition(collector))} == {"0", "2"}
    nvml._devices[1]["fail"] = False
    assert {line.split('gpu="')[1][0] for line in _series(_exposition(collector))} == {
        "0", "1", "2"}


@pytest.mark.parametrize("env", [{"CUDA_VISIBLE_DEVICES": ""}, {"CUDA_VISIBLE_DEVICES": "-1"}])
def test_no_visible_gpu_means_no_collector(nvml, env) -> None:
    assert GpuCollector.open(env=env, nvml=nvml) is None
    assert nvml.initialised == 0


def test_no_driver_or_no_library_means_no_series_and_no_error(monkeypatch) -> None:
    fake_nvml.configure(None)  # the library is there, NVML cannot start (no driver)
    assert GpuCollector.open(env={}, nvml=fake_nvml) is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    assert GpuCollector.open(env={}) is None


def test_on_this_host_the_sidecar_endpoint_has_no_gpu_series_unless_it_has_a_gpu() -> None:
    """What ``sts sidecar --metrics-port`` does here: whatever this host has (no GPU, no
    nvidia-ml-py on the CI machines), asking for GPU metrics never fails."""
    metrics = SidecarMetrics(Scheduler(fast_engine(), lambda r: None, SchedulerConfig(), "t"))
    close = metrics.watch_gpus(ServerConfig().metrics_gpus)
    text = generate_latest(metrics.registry).decode()
    close()
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception:  # no library or no driver: nothing GPU may appear
        assert "sts_sidecar_gpu" not in text
        assert "sts_sidecar_queue_depth" in text


def test_metrics_gpus_is_checked() -> None:
    with pytest.raises(ValueError, match="metrics_gpus"):
        ServerConfig(metrics_gpus="0")  # type: ignore[arg-type]
    assert ServerConfig(metrics_gpus=[0, "GPU-aaaa"]).metrics_gpus == [0, "GPU-aaaa"]
