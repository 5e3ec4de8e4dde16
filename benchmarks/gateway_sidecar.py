"""The sidecar under test in the gateway overhead benchmark.

A ``simulated`` engine that absorbs work at once (a 0.01 ms step, no
per-sequence cost, effectively unlimited sequences and KV cache), with every
admission limit, watermark and deadline check out of the way, in a child
process pinned to one CPU core. What is left is the gateway's own work.

Example:
    >>> SIDECAR_SETTINGS["scheduler.pools.low.max_queue_delay_ms"] == DEADLINE_MS
    True
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sidecar.contract import PRIORITY_NAMES
from sts_harness.process import SidecarProcess

DEADLINE_MS = 3_600_000
"""Deadline of every benchmark request after its enqueue time, and the pools' queue-delay
limit: an hour, never reached."""

MAX_IN_FLIGHT = 1_000_000
"""``--max-in-flight`` of the sidecar."""

_BIG = 1 << 40

#: ``--set`` overrides that make the engine absorb work at once and take every
#: admission limit out of the way (recorded in the JSON result).
SIDECAR_SETTINGS: dict[str, Any] = {
    "engine.simulated.max_num_seqs": 1_000_000,
    "engine.simulated.step_base_ms": 0.01,
    "engine.simulated.step_per_seq_ms": 0.0,
    "engine.simulated.prefill_tokens_per_s": 1e12,
    "engine.simulated.kv_capacity_tokens": _BIG,
    "scheduler.deadline_admission": False,
    "scheduler.load_shedding.queue_depth": {"low": 1_000_000_000, "normal": 1_000_000_000},
    "scheduler.load_shedding.tokens_in_flight": {"low": _BIG, "normal": _BIG},
    **{f"scheduler.pools.{p}.{k}": v for p in PRIORITY_NAMES for k, v in (
        ("max_queued", 100_000_000), ("max_in_flight", 1_000_000),
        ("max_queue_delay_ms", DEADLINE_MS), ("max_tokens_in_flight", _BIG))},
}


class BenchmarkError(RuntimeError):
    """The benchmark could not run (sidecar failed to start, died or refused work)."""


def sidecar_args(workdir: Path, event_loop: str = "auto") -> list[str]:
    """Flags of the child ``sts sidecar`` (``--listen`` and ``--results-dir`` come from
    :class:`~sts_harness.process.SidecarProcess`). An empty config file keeps the
    benchmark independent of ``conf/sidecar.yaml``; ``event_loop`` is its
    ``server.event_loop``."""
    config = workdir / "sidecar.yaml"
    config.write_text("# gateway_overhead: built-in defaults plus --set overrides\n")
    args = ["--config", str(config), "--engine", "simulated",
            "--max-in-flight", str(MAX_IN_FLIGHT), "--sidecar-id", "gateway-bench",
            "--drain-timeout", "5"]
    for key, value in SIDECAR_SETTINGS.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    return args + ["--set", f"server.event_loop={event_loop}"]


@contextlib.contextmanager
def pinned_sidecar(workdir: Path, core: int | None,
                   event_loop: str = "auto") -> Iterator[SidecarProcess]:
    """The benchmark's sidecar, pinned to ``core``, on the ``event_loop`` kind, stopped
    (SIGTERM, then kill) on exit.

    Raises:
        BenchmarkError: It exited before serving or did not serve within 120 s.
    """
    sidecar = SidecarProcess(workdir / "results", sidecar_args(workdir, event_loop),
                             start_timeout_s=120.0, stop_timeout_s=15.0,
                             log_path=workdir / "sidecar.log",
                             cpus={core} if core is not None else None)
    try:
        sidecar.__enter__()
    except BaseException as e:
        sidecar.__exit__(None, None, None)
        if isinstance(e, (RuntimeError, TimeoutError)):
            raise BenchmarkError(f"the sidecar did not start: {e}") from e
        raise
    try:
        yield sidecar
    finally:
        sidecar.__exit__(None, None, None)
