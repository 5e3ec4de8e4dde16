"""Traffic profiles: length and arrival sampling (``sts_capacity.distributions``), request
generation (``benchmarks.generate``), YAML loading (``sts_capacity.profiles``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sts_capacity.distributions import ArrivalProcess, LengthDistribution
from benchmarks.generate import events_for_spark, generate
from sts_capacity.profiles import TrafficProfile, available_profiles, load_profile
from sidecar.contract import PRIORITY_NAMES

N = 200_000


def _rng(seed: int = 1234) -> np.random.Generator:
    return np.random.default_rng(seed)


# -- LengthDistribution ------------------------------------------------------------------

@pytest.mark.parametrize("p50,p90,p99", [(80, 200, 450), (24, 48, 96), (300, 700, 1500)])
def test_sampled_percentiles_match_configured(p50: int, p90: int, p99: int) -> None:
    d = LengthDistribution(p50=p50, p90=p90, p99=p99, long_share=0.0, cap=100 * p99)
    s = d.sample(_rng(), N)
    got50, got90, got99 = np.percentile(s, [50, 90, 99])
    assert got50 == pytest.approx(p50, rel=0.05)
    assert got90 == pytest.approx(p90, rel=0.08)
    assert got99 == pytest.approx(p99, rel=0.08)


def test_lognormal_fit_is_least_squares_over_p90_p99() -> None:
    d = LengthDistribution(p50=100, p90=200, p99=400)
    mu, sigma = d.lognormal_params()
    z90, z99 = 1.2816, 2.3263
    assert mu == pytest.approx(np.log(100))
    # d/dsigma of (sigma*z90 - ln2)^2 + (sigma*z99 - ln4)^2 is zero at the fitted sigma.
    grad = z90 * (sigma * z90 - np.log(2)) + z99 * (sigma * z99 - np.log(4))
    assert grad == pytest.approx(0.0, abs=1e-12)


def test_long_share_adds_one_percent_of_very_long_samples() -> None:
    kw = dict(p50=80, p90=200, p99=450, long_tokens=1800, cap=2048)
    body = LengthDistribution(long_share=0.0, **kw).sample(_rng(1), N)
    mixed = LengthDistribution(long_share=0.01, **kw).sample(_rng(1), N)
    above_body = np.mean(body >= 450)
    above_mixed = np.mean(mixed >= 450)
    # 1 % replaced by values in [p99, long_tokens]; the rest keeps the body's tail share.
    assert above_mixed - 0.99 * above_body == pytest.approx(0.01, abs=0.001)
    # Far above the body's tail, (almost) only the deliberate long outputs remain:
    # uniform on [450, 1800] puts 1 % x (1800 - 1200) / 1350 above 1200.
    assert np.mean(mixed > 1200) == pytest.approx(0.01 * 600 / 1350, abs=0.0008)
    assert np.mean(body > 1200) < 0.0005
    assert mixed.max() > 1500


def test_long_count_is_exact() -> None:
    kw = dict(p50=10, p90=20, p99=40, long_tokens=10_000, cap=10_000)
    body = LengthDistribution(long_share=0.0, **kw).sample(_rng(5), 10_000)
    mixed = LengthDistribution(long_share=0.01, **kw).sample(_rng(5), 10_000)
    # Same seed, same body draws: exactly round(1 % x n) positions are replaced, each by a
    # value in [p99, long_tokens] (which may rarely equal the body value it replaces).
    changed = mixed != body
    assert 97 <= int(changed.sum()) <= 100
    assert np.all((mixed[changed] >= 40) & (mixed[changed] <= 10_000))
    assert LengthDistribution(long_share=0.01, **kw).long_count(10_000) == 100
    d = LengthDistribution(long_share=0.01, **kw)
    assert d.long_count(49) == 0 and d.long_count(50) == 1


def test_samples_are_a_distribution_not_a_fixed_value() -> None:
    s = LengthDistribution(p50=24, p90=48, p99=96, cap=128).sample(_rng(), 10_000)
    assert len(np.unique(s)) > 50
    assert s.dtype.kind == "i"
    assert s.min() >= 1 and s.max() <= 128


def test_cap_is_respected() -> None:
    d = LengthDistribution(p50=100, p90=400, p99=900, long_share=0.05, long_tokens=950, cap=950)
    s = d.sample(_rng(), N)
    assert s.max() == 950 and s.min() >= 1
    assert d.long_tokens == 950
    small = LengthDistribution(p50=24, p90=48, p99=96, cap=128)
    assert small.long_tokens == 128  # min(4 x p99, cap)
    assert LengthDistribution(p50=24, p90=48, p99=96).cap == 384  # 4 x p99


def test_mean_matches_sampled_mean() -> None:
    for d in (LengthDistribution(p50=80, p90=200, p99=450, long_tokens=1800, cap=2048),
              LengthDistribution(p50=24, p90=48, p99=96, cap=128),
              LengthDistribution(p50=300, p90=700, p99=1500, long_share=0.0, cap=3000)):
        assert d.mean() == pytest.approx(d.sample(_rng(), N).mean(), rel=0.01)


def test_mean_counts_the_long_share() -> None:
    base = dict(p50=80, p90=200, p99=450, long_tokens=1800, cap=2048)
    without = LengthDistribution(long_share=0.0, **base).mean()
    with_long = LengthDistribution(long_share=0.01, **base).mean()
    assert with_long == pytest.approx(0.99 * without + 0.01 * (450 + 1800) / 2)


@pytest.mark.parametrize("kwargs", [
    dict(p50=100, p90=100, p99=200),          # not increasing
    dict(p50=100, p90=300, p99=200),
    dict(p50=0, p90=10, p99=20),              # < 1
    dict(p50=1.5, p90=10, p99=20),            # not an int
    dict(long_share=1.0),
    dict(long_share=-0.1),
    dict(p99=450, cap=400),                   # cap below p99
    dict(p99=450, long_tokens=400),           # long below p99
    dict(p99=450, long_tokens=3000, cap=2048),
])
def test_invalid_length_distribution(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        LengthDistribution(**kwargs)


# -- ArrivalProcess ----------------------------------------------------------------------

def test_poisson_count_and_order() -> None:
    rate, duration = 200.0, 500.0
    t = ArrivalProcess("poisson", rate_per_s=rate).arrival_times(_rng(), duration)
    expected = rate * duration
    assert abs(len(t) - expected) < 4 * np.sqrt(expected)
    assert np.all(np.diff(t) >= 0) and t.min() >= 0 and t.max() < duration
    # Poisson: inter-arrival times are exponential, so their CV is ~1.
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)


def test_bursty_keeps_the_mean_and_bursts() -> None:
    a = ArrivalProcess("bursty", rate_per_s=100, burst_factor=4, burst_duty=0.1,
                       burst_period_s=10)
    assert a.peak_rate_per_s == 400
    assert a.off_rate_per_s == pytest.approx(100 * 0.6 / 0.9)
    duration = 2000.0
    t = a.arrival_times(_rng(), duration)
    assert len(t) / duration == pytest.approx(100, rel=0.02)
    burst = a.in_burst(t)
    burst_rate = burst.sum() / (duration * 0.1)
    off_rate = (~burst).sum() / (duration * 0.9)
    assert burst_rate == pytest.approx(400, rel=0.03)
    assert off_rate == pytest.approx(66.67, rel=0.03)
    assert burst_rate / off_rate == pytest.approx(6.0, rel=0.05)
    # Bursts sit at the start of every period.
    assert a.in_burst(np.array([0.0, 0.99, 1.01, 10.5, 15.0])).tolist() == \
        [True, True, False, True, False]


def test_bursty_partial_period() -> None:
    a = ArrivalProcess("bursty", rate_per_s=100, burst_factor=5, burst_duty=0.2,
                       burst_period_s=10)
    assert a.off_rate_per_s == 0.0
    t = a.arrival_times(_rng(), 15.0)  # bursts [0, 2) and [10, 12) only
    assert np.all(a.in_burst(t)) and t.max() < 12


@pytest.mark.parametrize("kwargs", [
    dict(kind="uniform"),
    dict(rate_per_s=0),
    dict(kind="bursty", burst_factor=4, burst_duty=0.3),    # off-burst rate < 0
    dict(kind="bursty", burst_factor=0.5),
    dict(kind="bursty", burst_duty=0.0),
    dict(kind="bursty", burst_period_s=0),
])
def test_invalid_arrivals(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ArrivalProcess(**kwargs)


# -- TrafficProfile, generate, events ----------------------------------------------------

def test_all_shipped_profiles_load() -> None:
    names = available_profiles()
    assert {"seed-200qps", "cpu-small", "bursty"} <= set(names)
    for name in names:
        p = load_profile(name)
        assert p.name == name and p.description
        assert p.output_tokens.long_share == pytest.approx(0.01)
        assert sum(p.priority_mix.values()) == pytest.approx(1.0)
    seed = load_profile("seed-200qps")
    assert seed.arrivals.kind == "poisson" and seed.effective_peak_qps == 200
    assert seed.sla_ms["high"] == 3000
    assert (seed.output_tokens.p50, seed.output_tokens.p90, seed.output_tokens.p99) == \
        (80, 200, 450)
    assert load_profile("bursty").effective_peak_qps == 400
    assert load_profile("cpu-small").output_tokens.cap == 128


def test_load_profile_by_path_and_missing(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("arrivals: {rate_per_s: 3}\n", encoding="utf-8")
    p = load_profile(path)
    assert p.name == "mine" and p.arrivals.rate_per_s == 3
    with pytest.raises(FileNotFoundError, match="known profiles"):
        load_profile("no-such-profile")


@pytest.mark.parametrize("data,match", [
    ({"rate": 5}, "unknown keys"),
    ({"arrivals": {"rate_per_s": 5, "burst": 2}}, "unknown keys"),
    ({"output_tokens": {"p50": 10, "p95": 20}}, "unknown keys"),
    ({"priority_mix": {"urgent": 1.0}}, "unknown priorities"),
    ({"priority_mix": {"high": 0, "low": 0}}, "positive sum"),
    ({"priority_mix": {"high": -1, "low": 2}}, "priority_mix"),
    ({"sla_ms": {"high": 3000}}, "no deadline"),
    ({"sla_ms": {"high": 0, "normal": 1, "low": 1}}, "sla_ms.high"),
    ({"peak_qps": 0}, "peak_qps"),
    ({"chars_per_token": 0}, "chars_per_token"),
    ({"stable_prefix": ""}, "stable_prefix"),
    ({"arrivals": 5}, "must be a mapping"),
])
def test_invalid_profiles(data: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TrafficProfile.from_dict(data)


def test_unknown_key_in_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("arrivals: {rate_per_s: 3}\nmax_tokens: 64\n", encoding="utf-8")
    with pytest.raises(ValueError, match="max_tokens"):
        load_profile(path)


def test_priority_mix_is_normalised_and_with_rate_copies() -> None:
    p = TrafficProfile.from_dict({"priority_mix": {"high": 2, "normal": 6, "low": 0},
                                  "sla_ms": {"high": 1000, "normal": 2000},
                                  "arrivals": {"rate_per_s": 10}, "peak_qps": 30})
    assert p.priority_mix == {"high": 0.25, "normal": 0.75}
    q = p.with_rate(20)
    assert q.arrivals.rate_per_s == 20 and q.peak_qps == 60
    assert p.arrivals.rate_per_s == 10 and p.peak_qps == 30  # original untouched
    assert TrafficProfile().with_rate(7).effective_peak_qps == 7


def test_generate_is_deterministic_per_seed() -> None:
    profile = load_profile("seed-200qps")
    a = generate(profile, duration_s=2, seed=7)
    b = generate(profile, duration_s=2, seed=7)
    c = generate(profile, duration_s=2, seed=8)
    assert a == b
    assert a != c
    assert [r.index for r in a] == list(range(len(a)))
    assert all(x.arrival_s <= y.arrival_s for x, y in zip(a, a[1:]))


def test_generated_requests_follow_the_profile() -> None:
    profile = load_profile("seed-200qps")
    reqs = generate(profile, duration_s=20, seed=3)
    assert len(reqs) == pytest.approx(4000, rel=0.06)
    # Stable prefix first, the same for everyone; dynamic content after it.
    prefix = profile.stable_prefix
    assert all(r.prompt.startswith(prefix) and r.prompt == prefix + r.content for r in reqs)
    assert len({r.content for r in reqs}) == len(reqs)
    # Prompt length tracks input_tokens x chars_per_token.
    target = np.array([r.input_tokens * profile.chars_per_token for r in reqs])
    got = np.array([len(r.prompt) for r in reqs])
    long_enough = target > len(prefix) + 20
    assert np.all(np.abs(got - target)[long_enough] <= 1)
    assert np.corrcoef(target, got)[0, 1] > 0.99
    # max_tokens is the sampled output length, never one fixed value.
    max_tokens = np.array([r.max_tokens for r in reqs])
    assert len(np.unique(max_tokens)) > 100
    assert max_tokens.max() <= profile.output_tokens.cap
    assert np.mean(max_tokens >= 450) > 0.01
    # Priorities and SLAs.
    share = {p: sum(r.priority == p for r in reqs) / len(reqs) for p in PRIORITY_NAMES}
    assert share["high"] == pytest.approx(0.2, abs=0.03)
    assert share["normal"] == pytest.approx(0.5, abs=0.03)
    assert all(r.sla_ms == profile.sla_ms[r.priority] for r in reqs)


def test_short_input_target_keeps_the_prefix() -> None:
    profile = TrafficProfile.from_dict({
        "arrivals": {"rate_per_s": 50},
        "input_tokens": {"p50": 2, "p90": 3, "p99": 4, "long_share": 0.0}})
    reqs = generate(profile, duration_s=1, seed=0)
    assert reqs and all(r.prompt.startswith(profile.stable_prefix) for r in reqs)
    assert all(r.content.startswith("(ref ") for r in reqs)


def test_events_for_spark_shape() -> None:
    reqs = generate(load_profile("cpu-small"), duration_s=30, seed=0)
    events = events_for_spark(reqs, start_epoch_ms=1_700_000_000_000)
    assert len(events) == len(reqs)
    for e, r in zip(events, reqs):
        assert set(e) == {"event_id", "text", "priority", "event_ts", "max_tokens"}
        assert e["event_ts"] == 1_700_000_000_000 + round(r.arrival_s * 1000)
        assert isinstance(e["event_ts"], int) and isinstance(e["max_tokens"], int)
        assert e["text"] == r.content and e["max_tokens"] == r.max_tokens
        assert e["priority"] == r.priority
    assert len({e["event_id"] for e in events}) == len(events)
    assert events[0]["event_id"] == "gen1700000000000-0000000"
    with_prefix = events_for_spark(reqs[:3], 0, id_prefix="run1", include_prefix=True)
    assert with_prefix[0]["event_id"] == "run1-0000000"
    assert with_prefix[0]["text"] == reqs[0].prompt
