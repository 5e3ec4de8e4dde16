"""Capacity planner: hand-computed GPU counts, headroom and API break-even."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from sts_capacity.plan import add_plan_arguments, format_plan, plan, run_plan
from sts_capacity.profiles import TrafficProfile, load_profile
from tests.utils import REPO


def test_seed_example_gpu_counts() -> None:
    # Seed 6.1: peak 100 QPS x 200 output tokens = 20,000 tokens/s; "about 20-40 cards"
    # at 1,000 tokens/s per card.
    half = plan(None, 1000, 0.5, peak_qps=100, mean_output_tokens=200)
    assert half.required_tokens_per_s == 20_000
    assert half.gpus_exact == 40 and half.gpus == 40
    assert half.utilisation_at_peak == pytest.approx(0.5)
    assert half.headroom == pytest.approx(0.5)
    full = plan(None, 1000, 1.0, peak_qps=100, mean_output_tokens=200)
    assert full.gpus == 20 and full.headroom == pytest.approx(0.0)


def test_rounding_up_and_headroom() -> None:
    p = plan(None, 1000, 0.7, peak_qps=100, mean_output_tokens=200)
    assert p.gpus_exact == pytest.approx(20_000 / 700)      # 28.57
    assert p.gpus == 29
    assert p.utilisation_at_peak == pytest.approx(20_000 / 29_000)
    assert p.headroom == pytest.approx(1 - 20_000 / 29_000)  # 0.3103
    assert p.max_qps_per_gpu == pytest.approx(3.5)          # 1000 x 0.7 / 200
    # Float error must not add a GPU: 0.6 x 1000 = 600 exactly 20 GPUs for 12,000 tok/s.
    assert plan(None, 1000, 0.6, peak_qps=60, mean_output_tokens=200).gpus == 20
    # Tiny demand still needs one GPU.
    tiny = plan(None, 1000, 0.7, peak_qps=0.1, mean_output_tokens=10)
    assert tiny.gpus == 1 and tiny.headroom == pytest.approx(0.999)


def test_break_even_by_hand() -> None:
    p = plan(None, 3400, 0.7, peak_qps=30, mean_output_tokens=200, mean_input_tokens=500,
             api_price_per_mtok_out=0.60, api_price_per_mtok_in=0.15, gpu_hour_price=2.50)
    per_request = 200 * 0.60 / 1e6 + 500 * 0.15 / 1e6           # $0.000195
    assert p.api_cost_per_request == pytest.approx(per_request)
    assert p.break_even_qps == pytest.approx(2.50 / 3600 / 0.000195)   # 3.5613 QPS
    assert p.break_even_qps == pytest.approx(3.5612535, rel=1e-6)
    # At the break-even rate one GPU-hour costs what the API charges for that hour.
    assert p.break_even_qps * 3600 * p.api_cost_per_request == pytest.approx(2.50)
    assert p.max_qps_per_gpu == pytest.approx(3400 * 0.7 / 200)    # 11.9
    assert p.break_even_fits_one_gpu is True
    assert p.gpus == math.ceil(30 * 200 / (3400 * 0.7))            # 6000 / 2380 -> 3
    assert p.gpu_cost_per_hour == pytest.approx(3 * 2.50)
    assert p.api_cost_per_hour_at_peak == pytest.approx(30 * 3600 * 0.000195)


def test_break_even_beyond_one_gpu_means_api_always_cheaper() -> None:
    p = plan(None, 3400, 0.7, peak_qps=30, mean_output_tokens=200,
             api_price_per_mtok_out=0.06, gpu_hour_price=2.50)
    assert p.api_price_per_mtok_in == 0.0
    assert p.api_cost_per_request == pytest.approx(200 * 0.06 / 1e6)
    assert p.break_even_qps == pytest.approx(2.50 / 3600 / 1.2e-5)  # 57.9 QPS > 11.9
    assert p.break_even_fits_one_gpu is False
    assert "cheaper at any rate" in format_plan(p)


def test_no_prices_no_costs() -> None:
    p = plan(None, 1000, 0.7, peak_qps=10, mean_output_tokens=100)
    assert p.break_even_qps is None and p.api_cost_per_request is None
    assert p.gpu_cost_per_hour is None and p.break_even_fits_one_gpu is None
    only_gpu = plan(None, 1000, 0.7, peak_qps=10, mean_output_tokens=100, gpu_hour_price=2.0)
    assert only_gpu.gpus == 2  # 1,000 tok/s / 700
    assert only_gpu.gpu_cost_per_hour == 4.0 and only_gpu.break_even_qps is None


def test_profile_supplies_peak_and_means() -> None:
    profile = load_profile("seed-200qps")
    p = plan(profile, 3400, 0.7)
    mean_out = profile.output_tokens.mean()
    assert p.profile == "seed-200qps" and p.peak_qps == 200
    assert p.mean_output_tokens == pytest.approx(mean_out)
    assert p.mean_input_tokens == pytest.approx(profile.input_tokens.mean())
    assert p.required_tokens_per_s == pytest.approx(200 * mean_out)
    assert p.gpus == math.ceil(200 * mean_out / (3400 * 0.7))
    # The ~1 % very long outputs raise the mean above the body's alone.
    assert mean_out > TrafficProfile(output_tokens={
        "p50": 80, "p90": 200, "p99": 450, "long_share": 0.0, "cap": 2048}).output_tokens.mean()
    # Overrides win over the profile.
    q = plan(profile, 1000, 0.5, peak_qps=100, mean_output_tokens=200)
    assert q.gpus == 40
    # A bursty profile is planned at its burst rate.
    assert plan(load_profile("bursty"), 3400).peak_qps == 400
    assert plan(profile.with_rate(50), 3400).peak_qps == 50


@pytest.mark.parametrize("utilisation", [0, -0.1, 1.01, 2, True])
def test_invalid_utilisation(utilisation: float) -> None:
    with pytest.raises(ValueError, match="target_utilisation"):
        plan(None, 1000, utilisation, peak_qps=100, mean_output_tokens=200)


@pytest.mark.parametrize("kwargs,match", [
    (dict(tokens_per_s_per_gpu=0), "tokens_per_s_per_gpu"),
    (dict(peak_qps=0), "peak_qps"),
    (dict(mean_output_tokens=-1), "mean_output_tokens"),
    (dict(gpu_hour_price=0), "gpu_hour_price"),
    (dict(api_price_per_mtok_out=-1), "api_price_per_mtok_out"),
    (dict(api_price_per_mtok_in=0.1), "needs api_price_per_mtok_out"),
    (dict(api_price_per_mtok_in=0.1, api_price_per_mtok_out=1.0), "mean_input_tokens"),
])
def test_invalid_inputs(kwargs: dict, match: str) -> None:
    args = dict(tokens_per_s_per_gpu=1000, peak_qps=10, mean_output_tokens=100) | kwargs
    with pytest.raises(ValueError, match=match):
        plan(None, **args)


def test_profile_or_both_overrides_required() -> None:
    with pytest.raises(ValueError, match="without a profile"):
        plan(None, 1000, peak_qps=10)


def _parse(*argv: str) -> argparse.Namespace:
    return add_plan_arguments(argparse.ArgumentParser()).parse_args(list(argv))


def test_cli_defaults_and_help() -> None:
    args = _parse("--profile", "seed-200qps")
    assert args.tokens_per_s == 3400 and args.utilisation == 0.7
    assert args.peak_qps is None and args.api_price_out is None and not args.json
    help_text = add_plan_arguments(argparse.ArgumentParser()).format_help()
    assert "3,400" in help_text and "measured" in help_text
    with pytest.raises(SystemExit):
        _parse()  # --profile is required


def test_cli_json_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    rc = run_plan(_parse("--profile", "cpu-small", "--tokens-per-s", "75", "--peak-qps", "3",
                         "--api-price-out", "0.6", "--gpu-hour-price", "2.5", "--json"))
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["profile"] == "cpu-small" and out["peak_qps"] == 3
    assert out["gpus"] == math.ceil(3 * out["mean_output_tokens"] / (75 * 0.7))
    assert out["break_even_qps"] == pytest.approx(2.5 / 3600 / out["api_cost_per_request"])
    assert run_plan(_parse("--profile", "seed-200qps")) == 0
    text = capsys.readouterr().out
    assert "seed-200qps" in text and "GPUs" in text


def test_cli_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_plan(_parse("--profile", "no-such-profile")) == 2
    assert run_plan(_parse("--profile", "seed-200qps", "--utilisation", "1.5")) == 2
    assert "target_utilisation" in capsys.readouterr().err


def test_prompts_counted_when_their_prefill_rate_is_given() -> None:
    """The seed's formula counts output tokens only; with a prefill rate, each GPU's
    second is shared between decoding and prefilling, and long prompts dominate."""
    p = plan(None, 3400, 0.7, peak_qps=200, mean_output_tokens=28, mean_input_tokens=2048,
             prefill_tokens_per_s=20_000)
    assert p.gpus == 3  # the seed's formula, unchanged
    assert p.prompts is not None and p.prompts.required_prompt_tokens_per_s == 409_600
    assert p.prompts.gpus == math.ceil((200 * 28 / 3400 + 409_600 / 20_000) / 0.7) == 32
    assert "With prompts: 409,600 prompt tokens/s" in format_plan(p)
    assert plan(None, 3400, peak_qps=200, mean_output_tokens=28).prompts is None
    with pytest.raises(ValueError, match="needs mean_input_tokens"):
        plan(None, 3400, peak_qps=200, mean_output_tokens=28, prefill_tokens_per_s=20_000)
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        plan(None, 3400, peak_qps=1, mean_output_tokens=1, mean_input_tokens=1,
             prefill_tokens_per_s=0)


def test_long_prompts_are_pointed_out_when_not_counted() -> None:
    long_prompts = plan(None, 3400, peak_qps=200, mean_output_tokens=28, mean_input_tokens=2048)
    assert "73x the output" in format_plan(long_prompts)
    short = plan(None, 3400, peak_qps=200, mean_output_tokens=115, mean_input_tokens=380)
    assert "--prefill-tokens-per-s" not in format_plan(short)


def test_cli_trace_with_prefill(capsys: pytest.CaptureFixture[str]) -> None:
    trace = REPO / "benchmarks" / "traces" / "azure-llm-inference-2023-code.csv"
    rc = run_plan(_parse("--trace", str(trace),
                         "--trace-rate", "200", "--prefill-tokens-per-s", "20000", "--json"))
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["gpus"] == 3 and out["plan"]["prompts"]["gpus"] == 31
