"""Intake windows (``preemption.hold_lower``): fewer lower starts while ``high`` is slowed
by their prefills, in process on a simulated two-GPU engine, in virtual time."""

from __future__ import annotations

import asyncio
import collections

import pytest

from sidecar.config import SchedulerConfig
from sidecar.contract import Priority
from sidecar.engines.simulated import SimulatedCluster, SimulatedEngineConfig
from sidecar.intake_window import DECREASE_EVERY_S, IntakeWindows
from sidecar.request_state import ResultRecord
from sidecar.scheduler import Scheduler
from sidecar.warmup import SpeedSample
from tests.unit.virtual_time import run_in_virtual_time
from tests.utils import make_sidecar_request, until, with_scheduler

pytestmark = pytest.mark.timeout(120)

HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW
SLOTS = 32  # two GPUs of 16 sequences
SECONDS = 20


def _prefill_heavy_run(*, hold_lower: bool) -> tuple[dict[Priority, tuple[int, int]], int]:
    """A coding assistant's traffic on two simulated GPUs (10 ms decode steps, prompts
    prefilled at 20,000 tokens/s between them): 30 ``low`` requests/s with 2,000-token
    prompts and 20-token answers (1.5x what the two GPUs prefill), 2 ``high``/s with short
    prompts and 20-token answers due in 1.5 s (0.2 s on an unloaded engine). Per priority,
    (answered ``ok`` by the deadline, sent), and the windows' decreases."""
    sent: dict[Priority, int] = collections.Counter()
    seen: dict[str, int] = {}

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.estimator.calibrate([SpeedSample(1, 0.010, 0.010),
                               SpeedSample(SLOTS, 0.0103, 0.0103)])
        for tick in range(SECONDS * 10):  # every 0.1 s (virtual)
            batch = [make_sidecar_request(f"low{tick}-{i}", priority=LOW, max_tokens=20,
                                          deadline_in_ms=30_000, prompt="x" * 8000)
                     for i in range(3)]
            if tick % 5 == 0:
                batch.append(make_sidecar_request(f"high{tick}", priority=HIGH, max_tokens=20,
                                                  deadline_in_ms=1500, prompt="y" * 200))
            for req in batch:
                sent[req.priority] += 1  # type: ignore[index]
            s.submit_batch(batch)
            await asyncio.sleep(0.1)
        await until(lambda: len(results) == sum(sent.values()), 120)
        seen["decreases"] = s.load.windows.decreases

    pools = {p: {"max_in_flight": SLOTS} for p in ("high", "normal", "low")}
    config = SchedulerConfig(max_in_flight=SLOTS, pools=pools,
                             preemption={"hold_lower": hold_lower})
    engine = SimulatedCluster(SimulatedEngineConfig(
        replicas=2, max_num_seqs=SLOTS // 2, step_base_ms=10.0, step_per_seq_ms=0.0,
        prefill_tokens_per_s=20_000.0, prefix_cache_blocks=0))
    results = run_in_virtual_time(with_scheduler(engine, config, body))
    assert collections.Counter(r.request_id for r in results).most_common(1)[0][1] == 1
    on_time = collections.Counter(Priority.parse(r.priority) for r in results
                                  if r.status == "ok" and r.finish_ts <= r.deadline_ts)
    return {p: (on_time[p], sent[p]) for p in (HIGH, LOW)}, seen["decreases"]


def test_high_keeps_its_deadlines_beside_a_flood_of_long_low_prompts() -> None:
    """With the windows, ``high`` is answered in time nearly always and ``low`` still gets
    the engine's remaining time; without them (the lever off) the ``low`` prompts that
    keep starting beside ``high`` make it miss most of its deadlines, although the
    dispatcher starts ``high`` first and the engine has two batches (no batch lever)."""
    served, decreases = _prefill_heavy_run(hold_lower=True)
    high_ok, high_sent = served[HIGH]
    assert high_ok >= 0.85 * high_sent, served
    assert decreases >= 1
    assert served[LOW][0] >= 0.3 * served[LOW][1], served  # the engine is not starved
    without, decreases = _prefill_heavy_run(hold_lower=False)
    assert decreases == 0
    assert without[HIGH][0] <= 0.6 * high_sent, without
    assert high_ok > without[HIGH][0], (served, without)


def test_a_window_halves_at_most_once_a_second_and_widens_with_each_on_time_finish() -> None:
    now = [0.0]
    windows = IntakeWindows(64, clock=lambda: now[0])
    windows.slowed(NORMAL)  # normal slowed: only low narrows
    assert (windows.limit(HIGH), windows.limit(NORMAL), windows.limit(LOW)) == (64, 64, 32)
    windows.slowed(HIGH)  # low narrowed within the second: it waits; normal halves
    assert (windows.limit(NORMAL), windows.limit(LOW)) == (32, 32)
    now[0] += DECREASE_EVERY_S
    for _ in range(10):
        windows.slowed(HIGH)
    assert (windows.limit(NORMAL), windows.limit(LOW)) == (16, 16)
    for _ in range(100):
        windows.on_time(HIGH)
    assert not windows.narrowed() and windows.limit(LOW) == 64
