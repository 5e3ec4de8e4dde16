"""Shared test helpers: real sidecar processes, result readers, request builders, and
in-process scheduler helpers. Test modules import helpers from here only."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sidecar.config import SchedulerConfig
from sidecar.contract import Priority, now_ms
from sidecar.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from sidecar.request_state import ResultRecord, SidecarRequest
from sidecar.scheduler import Scheduler
from sts_harness.process import SidecarProcess, free_port
from sts_harness.result_check import read_results, wait_for_results

REPO = Path(__file__).resolve().parents[1]

__all__ = ["REPO", "RemoteSidecar", "fast_engine", "free_port", "library_modules", "make_request",
           "make_sidecar_request", "read_results", "require_tool", "until", "wait_for_results",
           "wait_until", "with_scheduler"]


class RemoteSidecar(SidecarProcess):
    """A sidecar child process for tests (see :class:`sts_harness.process.SidecarProcess`)."""


def make_request(request_id: str, *, priority: str = "normal", prompt: str = "Say hello.",
                 max_tokens: int = 16, deadline_in_ms: int = 60_000, **extra: object) -> dict:
    """A valid request mapping with the seed's field names."""
    now = now_ms()
    row = dict(request_id=request_id, trace_id=f"trace-{request_id}", priority=priority,
               enqueue_ts=now, deadline_ts=now + deadline_in_ms, prompt=prompt,
               max_tokens=max_tokens, temperature=0.0, cache_key="", callback_topic="")
    row.update(extra)
    return row


def library_modules(packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted name -> file of every module of ``packages`` (generated ``sidecar.pb`` aside)."""
    out = {}
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO)
            if rel.parts[:2] == ("sidecar", "pb"):
                continue
            out[".".join(rel.with_suffix("").parts).removesuffix(".__init__")] = path
    return out


def require_tool(name: str, how: str) -> str:
    """The path of command ``name``. Missing, the test is skipped on a developer's machine
    and **fails** under CI (``$CI`` set: ``.ci/run`` installs every tool the tests use,
    so a missing one is a broken install, not a reason to pass).

    Args:
        name: The command, e.g. ``promtool``.
        how: Where it comes from, for the message (e.g. "Debian's prometheus package").
    """
    import os
    import shutil

    import pytest

    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed ({how}; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"under CI: {message}")
        pytest.skip(message)
    return path


def wait_until(predicate, timeout_s: float = 30.0, interval_s: float = 0.1, what: str = ""):
    """Poll ``predicate()`` until it returns a truthy value (returned); fail after
    ``timeout_s``. Use it instead of sleeping for a state to appear."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in {timeout_s}s: {what or predicate}")
        time.sleep(interval_s)


def make_sidecar_request(rid: str, *, priority: Priority = Priority.NORMAL,
                         max_tokens: int = 10, deadline_in_ms: int = 30_000,
                         prompt: str = "hello there", delivery_ms: int = 0) -> SidecarRequest:
    """A valid in-process request for the scheduler."""
    now = now_ms()
    return SidecarRequest(request_id=rid, trace_id="t", priority=priority, enqueue_ts=now,
                          deadline_ts=now + deadline_in_ms, model="", prompt=prompt,
                          max_tokens=max_tokens, temperature=0.0, delivery_ms=delivery_ms)


async def with_scheduler(engine, config: SchedulerConfig, body):
    """Run ``body(scheduler, results)`` against a started scheduler on ``engine``; return
    every terminal result."""
    results: list[ResultRecord] = []
    await engine.start()
    scheduler = Scheduler(engine, results.append, config, "test")
    scheduler.start()
    try:
        await body(scheduler, results)
    finally:
        await scheduler.abort_all()
        await engine.shutdown()
    return results


async def until(predicate, timeout_s: float = 20.0) -> None:
    """Poll ``predicate`` on the event loop until it holds (fails after ``timeout_s``)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def fast_engine(**kw) -> SimulatedEngine:
    """A simulated engine with 1 ms decode steps."""
    return SimulatedEngine(SimulatedEngineConfig(step_base_ms=1.0, step_per_seq_ms=0.0, **kw))


