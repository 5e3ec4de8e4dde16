"""CPU pinning and CPU-time accounting for benchmarks (Linux ``/proc``), the machine
description that goes into their JSON results, and a reference workload that tells how
fast this machine runs Python right now.

Example:
    >>> pid_cpu = process_cpu_s(os.getpid())
    >>> pid_cpu is None or pid_cpu >= 0
    True
    >>> sorted(machine_info())[:3]
    ['cpu_count', 'cpu_model', 'grpc']
    >>> reference_cpu_ms(rounds=1) > 0
    True
"""

from __future__ import annotations

import math
import os
import platform
import time
from pathlib import Path
from typing import Any

import grpc


def pin_threads(cores: set[int]) -> None:
    """Set the CPU affinity of every thread of this process (Linux: per thread)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:  # the thread ended meanwhile
            pass


def process_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of process ``pid`` (all threads), from /proc;
    ``None`` when it cannot be read (no such process, no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_info() -> dict[str, Any]:
    """CPU count, usable cores, platform and versions (goes into the JSON result)."""
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "usable_cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else None,
        "cpu_model": model,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "grpc": grpc.__version__,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _reference_work() -> int:
    """A fixed pure-Python workload shaped like the gateway's per-request work: small
    objects, string keys, dict inserts and lookups, function calls."""
    table: dict[str, tuple[int, str, float]] = {}
    for i in range(100_000):
        key = f"req-{i}"
        table[key] = (i, key, i * 0.5)
    total = 0
    for key, value in table.items():
        if key in table:
            total += value[0]
    return total


def reference_cpu_ms(rounds: int = 5) -> float:
    """CPU milliseconds of :func:`_reference_work`, best of ``rounds``, on the cores this
    thread may use. On a shared virtual machine the same code runs 20-40 % slower or
    faster from one hour to the next; a benchmark records this next to its figures so
    that runs can be compared (a higher value: a slower machine at the time)."""
    best = math.inf
    for _ in range(rounds):
        t0 = time.process_time()
        _reference_work()
        best = min(best, time.process_time() - t0)
    return round(best * 1000.0, 2)
