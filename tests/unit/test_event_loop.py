"""The sidecar's event loop: uvloop where installed (``server.event_loop: auto``), the
standard loop on request, a clear error for a loop that cannot be had; and the scheduler
serving, draining and reporting idle on uvloop as on asyncio."""

from __future__ import annotations

import asyncio
import builtins

import pytest

from sidecar.config import SchedulerConfig, ServerConfig
from sidecar.event_loop import loop_factory, run, running_loop_name
from sidecar.request_state import ResultRecord
from sidecar.scheduler import Scheduler
from tests.utils import fast_engine, make_sidecar_request, with_scheduler

pytestmark = pytest.mark.timeout(60)


async def _name() -> str:
    return running_loop_name()


@pytest.mark.parametrize("kind, expected", [("auto", "uvloop"), ("uvloop", "uvloop"),
                                            ("asyncio", "asyncio")])
def test_each_kind_runs_on_its_loop(kind: str, expected: str) -> None:
    # uvloop is a dependency of the package (not on Windows), so auto finds it here.
    assert run(_name(), kind) == expected


def test_an_unknown_loop_is_refused_in_the_config() -> None:
    with pytest.raises(ValueError, match=r"server.event_loop='trio' must be one of"):
        ServerConfig(event_loop="trio")
    with pytest.raises(ValueError, match=r"server.event_loop='trio' must be one of"):
        loop_factory("trio")


def test_without_uvloop_auto_falls_back_and_uvloop_is_a_clear_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_uvloop(name: str, *args: object, **kwargs: object) -> object:
        if name == "uvloop":
            raise ImportError("No module named 'uvloop'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr("sidecar.event_loop.uvloop_available", lambda: False)
    monkeypatch.setattr(builtins, "__import__", no_uvloop)
    assert loop_factory("auto") is None
    assert run(_name(), "auto") == "asyncio"
    with pytest.raises(ValueError, match="uvloop is not installed"):
        loop_factory("uvloop")


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_scheduler_serves_waits_idle_and_drains_on(kind: str) -> None:
    """Every request gets one ``ok`` row; :meth:`Scheduler.wait_idle` returns at once
    when idle and when the last request ends otherwise; a drain returns at once after."""

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        await asyncio.wait_for(s.wait_idle(), 1.0)  # nothing submitted: idle now
        acks = s.submit_batch([make_sidecar_request(f"r{i}", max_tokens=20)
                               for i in range(40)])
        assert all(a.accepted for a in acks)
        assert not s.idle()
        waiters = [asyncio.ensure_future(s.wait_idle()) for _ in range(2)]
        await asyncio.wait_for(asyncio.gather(*waiters), 20.0)
        assert s.idle()
        assert sorted(r.request_id for r in results) == sorted(f"r{i}" for i in range(40))
        assert {r.status for r in results} == {"ok"}
        await asyncio.wait_for(s.drain(5.0), 1.0)

    async def main() -> list[ResultRecord]:
        assert running_loop_name() == kind
        return await with_scheduler(fast_engine(max_num_seqs=8),
                                    SchedulerConfig(max_in_flight=8), body)

    results = run(main(), kind)
    assert len(results) == 40
