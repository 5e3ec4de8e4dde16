"""GPU utilisation and memory per device on the sidecar's ``/metrics`` (NVML).

Read through NVML (``nvidia-ml-py``, module ``pynvml``) when Prometheus scrapes, for
the GPUs the sidecar uses only: ``server.metrics_gpus`` when set, else the devices in
``CUDA_VISIBLE_DEVICES``, else every GPU of the host. Without the library, without a
driver or without a GPU there is no collector at all: no series, no error (one log
line says why). Series, labelled ``gpu`` (the NVML index, as ``nvidia-smi`` shows it)
and ``uuid``:

* ``sts_sidecar_gpu_utilization_ratio``: share of the last sample period in which a
  kernel ran (NVML's utilisation rate, 0..1);
* ``sts_sidecar_gpu_memory_used_bytes`` and ``sts_sidecar_gpu_memory_total_bytes``.

A device that fails to answer one scrape is left out of that scrape (logged once).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

_PREFIX = "sts_sidecar_gpu"


def gpu_selectors(selection: Sequence[int | str] | None,
                  env: Mapping[str, str] | None = None) -> list[str] | None:
    """Which GPUs to report: NVML indices (``"0"``) or UUIDs (``"GPU-..."``).

    ``selection`` (``server.metrics_gpus``) wins; else ``CUDA_VISIBLE_DEVICES`` as CUDA
    reads it (comma-separated indices or UUIDs, up to the first invalid entry; MIG
    instances are not reported); ``None`` means every GPU of the host.

    Example:
        >>> gpu_selectors(None, {"CUDA_VISIBLE_DEVICES": "2, 3"})
        ['2', '3']
        >>> gpu_selectors(None, {"CUDA_VISIBLE_DEVICES": "GPU-8a1b,-1,4"})
        ['GPU-8a1b']
        >>> gpu_selectors([1], {"CUDA_VISIBLE_DEVICES": "0"})
        ['1']
        >>> gpu_selectors(None, {}) is None
        True
    """
    if selection is not None:
        return [str(s).strip() for s in selection]
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    out: list[str] = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isdigit() or entry.startswith("GPU-"):
            out.append(entry)
        elif not entry.startswith("MIG-"):
            break  # CUDA ignores the first invalid entry and everything after it
    return out


@dataclass(frozen=True)
class _Device:
    handle: Any
    index: str
    uuid: str


def _text(value: Any) -> str:
    """NVML strings are ``bytes`` in older bindings."""
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuCollector(Collector):
    """Utilisation and memory of some GPUs, read from NVML at scrape time.

    Build it with :meth:`open`, which returns ``None`` where there is nothing to report.

    Args:
        nvml: The ``pynvml`` module, initialised.
        devices: The devices to report.
    """

    def __init__(self, nvml: ModuleType, devices: list[_Device]) -> None:
        self.nvml = nvml
        self.devices = devices
        self._failing: set[str] = set()
        self._closed = False

    @classmethod
    def open(cls, selection: Sequence[int | str] | None = None, *,
             env: Mapping[str, str] | None = None,
             nvml: ModuleType | None = None) -> GpuCollector | None:
        """Initialise NVML and find the selected GPUs (:func:`gpu_selectors`).

        Returns ``None`` (after one log line) when ``nvidia-ml-py`` is missing, NVML
        cannot start (no driver, no GPU) or no selected GPU is found.

        Example:
            >>> GpuCollector.open([]) is None     # an empty selection reports nothing
            True
        """
        selectors = gpu_selectors(selection, env)
        if selectors == []:
            return None
        if nvml is None:
            try:
                import pynvml as nvml  # nvidia-ml-py: optional, GPU nodes only
            except ImportError:
                logger.info("No GPU metrics: nvidia-ml-py (pynvml) is not installed.")
                return None
        try:
            nvml.nvmlInit()
        except Exception as e:  # NVMLError and its per-cause subclasses; OSError
            logger.info("No GPU metrics: NVML is not available (%s).", e)
            return None
        try:
            devices = cls._find(nvml, selectors)
        except Exception as e:
            logger.warning("No GPU metrics: cannot list the GPUs through NVML (%s).", e)
            devices = []
        if not devices:
            nvml.nvmlShutdown()
            return None
        logger.info("GPU metrics for %s.", ", ".join(f"gpu {d.index} ({d.uuid})"
                                                      for d in devices))
        return cls(nvml, devices)

    @staticmethod
    def _find(nvml: ModuleType, selectors: list[str] | None) -> list[_Device]:
        if selectors is None:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i)
                       for i in range(nvml.nvmlDeviceGetCount())]
        else:
            handles = []
            for selector in selectors:
                try:
                    handles.append(nvml.nvmlDeviceGetHandleByIndex(int(selector))
                                   if selector.isdigit()
                                   else nvml.nvmlDeviceGetHandleByUUID(selector))
                except Exception as e:
                    logger.warning("No GPU metrics for GPU %s: %s", selector, e)
        devices: dict[str, _Device] = {}
        for handle in handles:
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            devices.setdefault(uuid, _Device(handle, str(nvml.nvmlDeviceGetIndex(handle)),
                                             uuid))
        return list(devices.values())

    def collect(self) -> Iterator[Metric]:
        if self._closed:
            return
        labels = ["gpu", "uuid"]
        util = GaugeMetricFamily(f"{_PREFIX}_utilization_ratio",
                                 "Share of the last sample period a kernel ran on the GPU "
                                 "(NVML).", labels=labels)
        used = GaugeMetricFamily(f"{_PREFIX}_memory_used_bytes",
                                 "GPU memory in use (NVML).", labels=labels)
        total = GaugeMetricFamily(f"{_PREFIX}_memory_total_bytes",
                                  "GPU memory installed (NVML).", labels=labels)
        for d in self.devices:
            try:
                rates = self.nvml.nvmlDeviceGetUtilizationRates(d.handle)
                memory = self.nvml.nvmlDeviceGetMemoryInfo(d.handle)
            except Exception as e:
                if d.uuid not in self._failing:
                    self._failing.add(d.uuid)
                    logger.warning("GPU %s left out of /metrics: NVML: %s", d.index, e)
                continue
            self._failing.discard(d.uuid)
            key = [d.index, d.uuid]
            util.add_metric(key, float(rates.gpu) / 100.0)
            used.add_metric(key, float(memory.used))
            total.add_metric(key, float(memory.total))
        yield util
        yield used
        yield total

    def close(self) -> None:
        """Shut NVML down (idempotent); later scrapes report nothing."""
        if not self._closed:
            self._closed = True
            try:
                self.nvml.nvmlShutdown()
            except Exception as e:
                logger.debug("nvmlShutdown: %s", e)
