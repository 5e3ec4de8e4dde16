"""A test double of ``pynvml`` (nvidia-ml-py): the few NVML calls the sidecar makes,
answered from a device list, for tests whose purpose is the sidecar's exposition.

The devices come from :func:`configure` or, in a child process that finds this folder
first on ``PYTHONPATH``, from ``$STS_FAKE_NVML`` (JSON: a list of objects with ``uuid``,
``util`` (percent), ``used`` and ``total`` (bytes), optional ``fail: true`` to make
that device's readings raise). ``$STS_FAKE_NVML`` unset: NVML cannot start, as on a
host without a driver.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    """Like pynvml's: every NVML failure."""


_devices: list[dict[str, Any]] | None = None
initialised = 0
"""nvmlInit calls minus nvmlShutdown calls (tests check NVML is released)."""


def configure(devices: list[dict[str, Any]] | None) -> None:
    """Set the fake's GPUs (``None``: no driver)."""
    global _devices, initialised
    _devices, initialised = devices, 0


if os.environ.get("STS_FAKE_NVML"):
    configure(json.loads(os.environ["STS_FAKE_NVML"]))


def nvmlInit() -> None:
    global initialised
    if _devices is None:
        raise NVMLError("Driver Not Loaded")
    initialised += 1


def nvmlShutdown() -> None:
    global initialised
    initialised -= 1


def _check() -> list[dict[str, Any]]:
    if not initialised or _devices is None:
        raise NVMLError("Uninitialized")
    return _devices


def nvmlDeviceGetCount() -> int:
    return len(_check())


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < len(_check()):
        raise NVMLError("Invalid Argument")
    return index


def nvmlDeviceGetHandleByUUID(uuid: str) -> int:
    for i, d in enumerate(_check()):
        if d["uuid"] == uuid:
            return i
    raise NVMLError("Not Found")


def nvmlDeviceGetIndex(handle: int) -> int:
    _check()
    return handle


def nvmlDeviceGetUUID(handle: int) -> bytes:
    return _check()[handle]["uuid"].encode()  # bytes, as older bindings return


def _reading(handle: int) -> dict[str, Any]:
    device = _check()[handle]
    if device.get("fail"):
        raise NVMLError("GPU is lost")
    return device


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    d = _reading(handle)
    return SimpleNamespace(gpu=d["util"], memory=0)


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    d = _reading(handle)
    return SimpleNamespace(total=d["total"], used=d["used"], free=d["total"] - d["used"])
