"""``sts demo`` sizes itself by the engine's calibration: a stated overload of what the
engine measured, on a fast machine and on a slow one alike (issue 31, item 3)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from sidecar.warmup import SpeedSample
from sts_harness.demo import DemoOptions, sized
from sts_harness.demo_sizing import (DEFAULT_FACTOR, HIGH_SERVICE_SHARE, LLM_SHARE_WITH_L1L2,
                                     MIN_PACE, LivePace, size_demo)
from sts_harness.replay import EventReplayer, FolderSink, PacedClock

#: The AVX2-only machine of issue 31: TTFT 187 / 602 ms, TPOT 99 / 154 ms (batch 1 / 8).
SLOW = [SpeedSample(1, 0.187, 0.099)] + [SpeedSample(8, 0.602, 0.154)] * 8
#: This machine's vLLM CPU engine, roughly: 3x as fast.
FAST = [SpeedSample(1, 0.060, 0.030)] + [SpeedSample(8, 0.200, 0.050)] * 8


def test_a_slow_engine_gets_shorter_answers_that_fit_its_part_of_the_high_sla() -> None:
    slow = size_demo(SLOW, max_tokens=48, high_sla_ms=8000)
    fast = size_demo(FAST, max_tokens=48, high_sla_ms=8000)
    assert slow is not None and fast is not None
    assert fast.max_tokens == 48, "a fast engine answers in full"
    assert slow.max_tokens < 48
    # a high answer at the full batch takes at most its part of the SLA, one more token not
    service_s = slow.ttft_s + (slow.max_tokens - 1) * slow.tpot_s
    budget_s = HIGH_SERVICE_SHARE * 8.0
    assert service_s <= budget_s < service_s + slow.tpot_s


def test_the_rate_is_the_factor_times_the_measured_capacity() -> None:
    for calibration in (SLOW, FAST):
        two = size_demo(calibration, max_tokens=48, high_sla_ms=8000, factor=2.0)
        four = size_demo(calibration, max_tokens=48, high_sla_ms=8000, factor=4.0)
        alone = size_demo(calibration, max_tokens=48, high_sla_ms=8000, factor=2.0,
                          l1l2=False)
        assert two is not None and four is not None and alone is not None
        per_request_s = two.ttft_s + (two.max_tokens - 1) * two.tpot_s
        assert two.capacity_rps == pytest.approx(8 / per_request_s)
        assert four.rate == pytest.approx(2 * two.rate)
        # with L1/L2 about half the events reach the model: twice the events for the same load
        assert two.rate == pytest.approx(alone.rate / LLM_SHARE_WITH_L1L2)
        assert alone.rate == pytest.approx(2.0 * two.capacity_rps)
        default = size_demo(calibration, max_tokens=48, high_sla_ms=8000)
        assert default is not None and default.factor == DEFAULT_FACTOR
    slow = size_demo(SLOW, max_tokens=48, high_sla_ms=8000)
    fast = size_demo(FAST, max_tokens=48, high_sla_ms=8000)
    assert slow is not None and fast is not None and slow.rate < fast.rate


def test_no_calibration_sizes_nothing() -> None:
    assert size_demo([], max_tokens=48, high_sla_ms=8000) is None
    assert size_demo([SpeedSample(1, 0.1, None)], max_tokens=48, high_sla_ms=8000) is None
    with pytest.raises(ValueError, match="factor"):
        size_demo(SLOW, max_tokens=48, high_sla_ms=8000, factor=0)


class _StatsOnly:
    """The demo's caller-side view of a sidecar: ``stats()`` with a calibration."""

    def __init__(self, calibration: list[SpeedSample]) -> None:
        self._calibration = [SimpleNamespace(batch=c.batch, ttft_ms=c.ttft_s * 1000,
                                             tpot_ms=(c.tpot_s or 0) * 1000)
                             for c in calibration]

    def stats(self) -> SimpleNamespace:
        return SimpleNamespace(calibration=self._calibration)


def test_the_demo_takes_its_rate_from_the_sidecar_and_says_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    opts, sizing = sized(DemoOptions(), _StatsOnly(SLOW))
    assert sizing is not None and opts.rate == pytest.approx(sizing.rate)
    assert opts.max_tokens == sizing.max_tokens < 48
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"Engine capacity: {sizing.capacity_rps:.2f} model requests/s")
    assert lines[1].startswith(f"Overload {DEFAULT_FACTOR:g}x:")
    given, none = sized(DemoOptions(rate=5.0), _StatsOnly(SLOW))
    assert (given.rate, given.max_tokens, none) == (5.0, 48, None), "--rate overrides"
    fallback, none = sized(DemoOptions(), _StatsOnly([]))
    assert (fallback.rate, none) == (3.0, None)
    assert "no calibration" in capsys.readouterr().out
    simulated, none = sized(DemoOptions(engine="simulated"), _StatsOnly(SLOW))
    assert (simulated.rate, simulated.max_tokens, none) == (3.0, 48, None)
    assert "simulated engine" in capsys.readouterr().out
    with pytest.raises(ValueError, match="overload"):
        DemoOptions(overload=0)


class _Speeds:
    """A sidecar's ``stats()`` whose measured capacity the test sets (tokens/s at the
    full batch; ``None``: the call fails)."""

    def __init__(self) -> None:
        self.capacity: float | None = 0.0
        self.calls = 0

    def __call__(self) -> SimpleNamespace:
        self.calls += 1
        if self.capacity is None:
            raise ConnectionError("the sidecar stopped answering")
        return SimpleNamespace(scale=SimpleNamespace(capacity_tokens_per_s=self.capacity))


def test_the_replay_follows_the_speed_the_engine_delivers_beside_spark() -> None:
    """Calibrated alone at 8 / 0.154 s = 52 tokens/s; beside Spark the scheduler
    measures less, and the replay runs at that share (never faster than sized, never
    below MIN_PACE); a failed read keeps the pace; reads at most every refresh_s."""
    sizing = size_demo(SLOW, max_tokens=48, high_sla_ms=8000)
    assert sizing is not None
    calibrated = sizing.batch / sizing.tpot_s
    speeds, now = _Speeds(), [0.0]
    pace = LivePace(sizing, speeds, refresh_s=2.0, clock=lambda: now[0])
    assert pace() == 1.0, "nothing measured yet"
    speeds.capacity = calibrated / 2
    assert pace() == 1.0 and speeds.calls == 1, "read again only after refresh_s"
    now[0] = 2.0
    assert pace() == pytest.approx(0.5)
    now[0], speeds.capacity = 4.0, calibrated * 3
    assert pace() == 1.0, "never faster than the calibration sized it"
    now[0], speeds.capacity = 6.0, calibrated / 100
    assert pace() == MIN_PACE
    now[0], speeds.capacity = 8.0, None
    assert pace() == MIN_PACE, "a failed read keeps the last pace"
    mean = round((1 + 0.5 + 1 + MIN_PACE) / 4, 3)
    assert pace.summary() == {"pace_min": MIN_PACE, "pace_mean": mean, "pace_last": MIN_PACE}


def test_a_paced_replay_stamps_events_when_offered_and_ends_on_time(tmp_path: Path) -> None:
    """At the slowest pace the event scheduled 10 s in is not due within the replay's
    0.3 s, however slow the machine: one event offered, stamped from the start, and the
    replay ends by itself."""
    def make(start_ms: int) -> list[dict]:
        return [{"event_id": str(i), "event_ts": -1} for i in range(2)]

    replayer = EventReplayer(FolderSink(tmp_path), [0.0, 10.0], make,
                             pace=lambda: MIN_PACE, until_s=0.3)
    replayer.start()
    replayer.join(timeout=30)
    assert not replayer.is_alive()
    offered = [json.loads(line) for f in sorted(tmp_path.glob("*.json"))
               for line in f.read_text().splitlines()]
    assert [e["event_id"] for e in offered] == ["0"] and replayer.offered == 1
    assert offered[0]["event_ts"] >= replayer.start_ms


def test_a_paced_clock_maps_the_schedule_to_real_time() -> None:
    clock = PacedClock()
    clock.advance(1.0, 1.0)
    assert clock.virtual_s == 1.0 and clock.real_s(0.5) == 0.5
    clock.advance(3.0, 0.25)
    assert clock.virtual_s == 1.5 and clock.real_s(1.25) == 2.0
    with pytest.raises(ValueError, match="pace"):
        clock.advance(4.0, 0.0)
