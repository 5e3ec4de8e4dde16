"""A lazily started sidecar goes away with its executor once that is gone for good
(issue 32, item 4): the owner file, the watch's decision, the launcher's claim."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys

import pytest

from sidecar import owner_watch
from sidecar.config import OwnerConfig, SidecarConfig, SidecarConfigError
from sidecar.owner_watch import claim_owner, owner_pid, pid_running, watch_owner
from spark_ext.config import (ORPHAN_EXIT_WITH_SCALING_S, PipelineConfig, ScalingConfig,
                              SidecarEndpointConfig)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_dead_owner_is_replaced_a_running_one_is_kept(tmp_path) -> None:
    path = tmp_path / "sts-gpu0.owner"
    assert owner_pid(path) is None
    dead = _dead_pid()
    assert not pid_running(dead)
    path.write_text(f"{dead}\n")
    assert claim_owner(path, os.getpid()) and owner_pid(path) == os.getpid()
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        path.write_text(f"{other.pid}\n")
        assert not claim_owner(path, os.getpid())  # a running executor keeps it
        assert owner_pid(path) == other.pid
    finally:
        other.communicate(b"")
    assert claim_owner(path, os.getpid()) and owner_pid(path) == os.getpid()


def test_the_watch_stops_the_sidecar_once_the_owner_is_gone_long_enough(monkeypatch,
                                                                        tmp_path) -> None:
    """Gone, back (a replacement took the sidecar over: the count starts again), gone
    for good: the stop comes ``exit_after_s`` after the last time it went."""
    path = tmp_path / "sts-gpu0.owner"
    path.write_text("12345\n")
    answers = iter([False, True, False, False, False, False])
    calls = []

    def running(pid: int) -> bool:
        calls.append(pid)
        return next(answers)

    monkeypatch.setattr(owner_watch, "pid_running", running)
    ticks = itertools.count(4, 4)  # each look at the clock: 4 s later
    stop = asyncio.Event()
    asyncio.run(watch_owner(path, 10.0, stop, interval_s=0, clock=lambda: next(ticks)))
    assert stop.is_set()
    # Without the reset at the second look it would have stopped at the fifth.
    assert len(calls) == 6


def test_the_watch_returns_when_the_sidecar_stops_for_another_reason(tmp_path) -> None:
    path = tmp_path / "sts-gpu0.owner"
    path.write_text(f"{os.getpid()}\n")
    stop = asyncio.Event()
    stop.set()
    asyncio.run(watch_owner(path, 0.0, stop, interval_s=60))  # returns at once


def test_owner_settings_are_checked_and_set_by_scaling() -> None:
    config = SidecarConfig.from_dict({"server": {"owner": {"file": "/run/sts/x.owner",
                                                           "exit_after_s": 5}}})
    assert config.server.owner == OwnerConfig(file="/run/sts/x.owner", exit_after_s=5)
    with pytest.raises(SidecarConfigError, match="exit_after_s"):
        OwnerConfig(exit_after_s=-1)
    lazy = {"sidecar": {"launch": "lazy", "gpu_endpoint": "unix:///tmp/sts/g{gpu}.sock"}}
    assert PipelineConfig.from_dict(lazy).sidecar.orphan_exit_s is None
    scaled = PipelineConfig.from_dict({**lazy, "scaling": {"enabled": True}})
    assert scaled.sidecar.orphan_exit_s == ORPHAN_EXIT_WITH_SCALING_S
    # Checking never changes the config checked; the derived default comes as a copy.
    built = PipelineConfig(sidecar=SidecarEndpointConfig(**lazy["sidecar"]),
                           scaling=ScalingConfig(enabled=True))
    built.check()
    assert built.sidecar.orphan_exit_s is None
    assert built.with_derived_defaults().sidecar.orphan_exit_s == ORPHAN_EXIT_WITH_SCALING_S
    assert built.sidecar.orphan_exit_s is None
    own = PipelineConfig.from_dict({"sidecar": {**lazy["sidecar"], "orphan_exit_s": 5},
                                    "scaling": {"enabled": True}})
    assert own.sidecar.orphan_exit_s == 5
