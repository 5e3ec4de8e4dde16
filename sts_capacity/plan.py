"""Capacity planning from a traffic profile: how many GPUs, and when self-hosting pays off.

The seed's formula (section 6.1; DESIGN.md "Capacity formula")::

    GPUs ~= (peak QPS x mean output tokens) / (per-GPU output tokens/s x target utilisation)

with a target utilisation of 0.6-0.75 to leave room for bursts. The mean output
length comes from the profile's distribution, the ~1 % very long outputs
included, because "this number swings with the output-length distribution".
Section 8.1 adds the cost question: below some request rate a per-token API is
cheaper than a GPU; :func:`plan` reports that break-even rate.

The planner is wired into the CLI as ``sts plan`` through :func:`add_plan_arguments`
and :func:`run_plan`; ``python -m sts_capacity.plan`` runs it directly. It is installed
with the sidecar (no Spark, no benchmark code): sizing a deployment needs neither.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
from dataclasses import dataclass

from sts_capacity.profiles import TrafficProfile, load_profile
from sidecar import one_line

logger = logging.getLogger(__name__)


@dataclass
class PromptPlan:
    """The fleet when prompts are counted too (:func:`plan` with ``prefill_tokens_per_s``):
    each GPU's second goes to decoding output tokens and to prefilling prompt tokens."""

    prefill_tokens_per_s: float
    """Prompt tokens/s one GPU prefills."""

    required_prompt_tokens_per_s: float
    """``peak_qps * mean_input_tokens``."""

    gpus_exact: float
    """``(required_tokens_per_s / tokens_per_s_per_gpu + required_prompt_tokens_per_s /
    prefill_tokens_per_s) / target_utilisation``."""

    gpus: int
    """``ceil(gpus_exact)`` (at least 1)."""


@dataclass
class CapacityPlan:
    """The result of :func:`plan`. Cost fields are ``None`` when prices were not given."""

    profile: str
    """Name of the traffic profile (``"-"`` when none was used)."""

    peak_qps: float
    """Peak requests per second planned for."""

    mean_output_tokens: float
    """Mean output tokens per request (long share included)."""

    mean_input_tokens: float | None
    """Mean prompt tokens per request (``None`` without a profile or override)."""

    tokens_per_s_per_gpu: float
    """Output tokens/s one GPU sustains."""

    target_utilisation: float
    """Share of that throughput planned to be used at peak."""

    required_tokens_per_s: float
    """``peak_qps * mean_output_tokens``."""

    gpus_exact: float
    """``required_tokens_per_s / (tokens_per_s_per_gpu * target_utilisation)``."""

    gpus: int
    """``ceil(gpus_exact)`` (at least 1)."""

    utilisation_at_peak: float
    """``required_tokens_per_s / (gpus * tokens_per_s_per_gpu)``."""

    headroom: float
    """``1 - utilisation_at_peak``: spare share of the fleet's throughput at peak."""

    max_qps_per_gpu: float
    """Requests/s one GPU serves at the target utilisation:
    ``tokens_per_s_per_gpu * target_utilisation / mean_output_tokens``."""

    gpu_hour_price: float | None = None
    """$ per GPU-hour."""

    api_price_per_mtok_out: float | None = None
    """$ per million output tokens of the API."""

    api_price_per_mtok_in: float | None = None
    """$ per million input tokens of the API (0 if only the output price was given)."""

    gpu_cost_per_hour: float | None = None
    """``gpus * gpu_hour_price``."""

    api_cost_per_request: float | None = None
    """``(mean_output_tokens * price_out + mean_input_tokens * price_in) / 1e6``."""

    api_cost_per_hour_at_peak: float | None = None
    """``peak_qps * 3600 * api_cost_per_request``."""

    break_even_qps: float | None = None
    """Sustained requests/s at which one GPU-hour costs what the API charges for the
    requests served in that hour: ``gpu_hour_price / 3600 / api_cost_per_request``."""

    break_even_fits_one_gpu: bool | None = None
    """``break_even_qps <= max_qps_per_gpu``. When false, one GPU at the target
    utilisation cannot carry enough traffic to pay for itself, and neither can
    more GPUs: the API is cheaper at any rate."""

    prompts: PromptPlan | None = None
    """The fleet with the prompts' prefill counted too (``None`` unless asked for)."""


def _positive(name: str, value: float | None) -> None:
    if value is not None and not (isinstance(value, (int, float)) and value > 0):
        raise ValueError(f"{name}={value!r} must be positive")


def plan(profile: TrafficProfile | None, tokens_per_s_per_gpu: float,
         target_utilisation: float = 0.7, *,
         api_price_per_mtok_out: float | None = None,
         gpu_hour_price: float | None = None,
         api_price_per_mtok_in: float | None = None,
         peak_qps: float | None = None,
         mean_output_tokens: float | None = None,
         mean_input_tokens: float | None = None,
         prefill_tokens_per_s: float | None = None) -> CapacityPlan:
    """Size a GPU fleet for ``profile`` and, given prices, find the self-host/API break-even.

    Formulas (seed 6.1 and 8.1):

    - ``required_tokens_per_s = peak_qps * mean_output_tokens``
    - ``gpus_exact = required_tokens_per_s / (tokens_per_s_per_gpu * target_utilisation)``,
      ``gpus = ceil(gpus_exact)``; the seed suggests a utilisation of 0.6-0.75.
    - ``utilisation_at_peak = required_tokens_per_s / (gpus * tokens_per_s_per_gpu)``,
      ``headroom = 1 - utilisation_at_peak``.
    - API cost per request ``c = (mean_out * price_out + mean_in * price_in) / 1e6``.
      Self-hosting ``qps`` costs ``n * gpu_hour_price`` per hour with
      ``n = ceil(qps * mean_out / (tokens_per_s_per_gpu * target_utilisation))``;
      the API costs ``qps * 3600 * c``. For one GPU they are equal at
      ``break_even_qps = gpu_hour_price / 3600 / c``, which one GPU can serve only if
      ``break_even_qps <= tokens_per_s_per_gpu * target_utilisation / mean_out``.
      Below the break-even the API is cheaper; above it (while it fits) self-hosting is.

    Args:
        profile: The traffic profile; ``None`` if ``peak_qps`` and ``mean_output_tokens``
            are both given.
        tokens_per_s_per_gpu: Output tokens/s one GPU sustains (measure it).
        target_utilisation: Planned share of that throughput used at peak, in ``(0, 1]``.
        api_price_per_mtok_out: $ per million output tokens of the API.
        gpu_hour_price: $ per GPU-hour.
        api_price_per_mtok_in: $ per million input tokens (needs ``api_price_per_mtok_out``).
        peak_qps: Overrides the profile's peak rate.
        mean_output_tokens: Overrides the profile's mean output length.
        mean_input_tokens: Overrides the profile's mean input length.
        prefill_tokens_per_s: Prompt tokens/s one GPU prefills: when given, the plan
            also counts the prompts (:attr:`CapacityPlan.prompts`), which the seed's
            formula leaves out; on long prompts they can cost more GPU time than the
            output.

    Returns:
        A :class:`CapacityPlan`.

    Raises:
        ValueError: A non-positive rate, length, throughput or price, or a utilisation
            outside ``(0, 1]``.

    Example:
        >>> p = plan(None, 1000, 0.5, peak_qps=100, mean_output_tokens=200)
        >>> p.required_tokens_per_s, p.gpus
        (20000.0, 40)
    """
    if isinstance(target_utilisation, bool) or not (
            isinstance(target_utilisation, (int, float)) and 0 < target_utilisation <= 1):
        raise ValueError(f"{target_utilisation=} must be in (0, 1]")
    _positive("tokens_per_s_per_gpu", tokens_per_s_per_gpu)
    if profile is None and (peak_qps is None or mean_output_tokens is None):
        raise ValueError("without a profile, give both peak_qps and mean_output_tokens")
    peak = float(peak_qps if peak_qps is not None else profile.effective_peak_qps)
    mean_out = float(mean_output_tokens if mean_output_tokens is not None
                     else profile.output_tokens.mean())
    mean_in = (float(mean_input_tokens) if mean_input_tokens is not None
               else profile.input_tokens.mean() if profile is not None else None)
    _check_prices(peak, mean_out, mean_in, gpu_hour_price, api_price_per_mtok_out,
                  api_price_per_mtok_in)
    required = peak * mean_out
    per_gpu = tokens_per_s_per_gpu * target_utilisation
    gpus_exact = required / per_gpu
    gpus = max(1, math.ceil(gpus_exact - 1e-9))  # 40.0000000001 from float error is 40
    utilisation = required / (gpus * tokens_per_s_per_gpu)
    result = CapacityPlan(
        profile=profile.name if profile is not None else "-",
        peak_qps=peak, mean_output_tokens=mean_out, mean_input_tokens=mean_in,
        tokens_per_s_per_gpu=float(tokens_per_s_per_gpu),
        target_utilisation=float(target_utilisation), required_tokens_per_s=required,
        gpus_exact=gpus_exact, gpus=gpus, utilisation_at_peak=utilisation,
        headroom=1.0 - utilisation, max_qps_per_gpu=per_gpu / mean_out,
        gpu_hour_price=gpu_hour_price, api_price_per_mtok_out=api_price_per_mtok_out)
    _add_costs(result, api_price_per_mtok_in)
    if prefill_tokens_per_s is not None:
        result.prompts = _prompt_plan(result, prefill_tokens_per_s)
    logger.debug("Plan for %s: %s GPUs.", result.profile, gpus)
    return result


def _prompt_plan(p: CapacityPlan, prefill_tokens_per_s: float) -> PromptPlan:
    """The fleet for ``p`` with its prompts' prefill counted too.

    Example:
        >>> p = plan(None, 1000, 0.5, peak_qps=10, mean_output_tokens=100,
        ...          mean_input_tokens=2000, prefill_tokens_per_s=10_000)
        >>> p.gpus, p.prompts.required_prompt_tokens_per_s, p.prompts.gpus
        (2, 20000.0, 6)
    """
    _positive("prefill_tokens_per_s", prefill_tokens_per_s)
    if p.mean_input_tokens is None:
        raise ValueError("prefill_tokens_per_s needs mean_input_tokens (or a profile)")
    prompt_rate = p.peak_qps * p.mean_input_tokens
    exact = (p.required_tokens_per_s / p.tokens_per_s_per_gpu
             + prompt_rate / prefill_tokens_per_s) / p.target_utilisation
    return PromptPlan(prefill_tokens_per_s=float(prefill_tokens_per_s),
                      required_prompt_tokens_per_s=prompt_rate, gpus_exact=exact,
                      gpus=max(1, math.ceil(exact - 1e-9)))


def _check_prices(peak: float, mean_out: float, mean_in: float | None,
                  gpu_hour_price: float | None, api_price_per_mtok_out: float | None,
                  api_price_per_mtok_in: float | None) -> None:
    """Refuse non-positive rates, lengths and prices, and an input price without what
    it needs (``ValueError``)."""
    for name, value in (("peak_qps", peak), ("mean_output_tokens", mean_out),
                        ("mean_input_tokens", mean_in), ("gpu_hour_price", gpu_hour_price),
                        ("api_price_per_mtok_out", api_price_per_mtok_out)):
        _positive(name, value)
    if api_price_per_mtok_in is not None:
        if api_price_per_mtok_in < 0:
            raise ValueError(f"{api_price_per_mtok_in=} must be >= 0")
        if api_price_per_mtok_out is None:
            raise ValueError("api_price_per_mtok_in needs api_price_per_mtok_out")
        if api_price_per_mtok_in > 0 and mean_in is None:
            raise ValueError("api_price_per_mtok_in needs mean_input_tokens (or a profile)")


def _add_costs(result: CapacityPlan, api_price_per_mtok_in: float | None) -> None:
    """The fleet's cost per hour, the API's cost per request and hour, and the
    break-even rate, as far as the prices given allow."""
    if result.gpu_hour_price is not None:
        result.gpu_cost_per_hour = result.gpus * result.gpu_hour_price
    if result.api_price_per_mtok_out is None:
        return
    price_in = api_price_per_mtok_in or 0.0
    result.api_price_per_mtok_in = price_in
    result.api_cost_per_request = (result.mean_output_tokens * result.api_price_per_mtok_out
                                   + (result.mean_input_tokens or 0.0) * price_in) / 1e6
    result.api_cost_per_hour_at_peak = result.peak_qps * 3600 * result.api_cost_per_request
    if result.gpu_hour_price is not None:
        result.break_even_qps = result.gpu_hour_price / 3600 / result.api_cost_per_request
        result.break_even_fits_one_gpu = result.break_even_qps <= result.max_qps_per_gpu


def format_plan(p: CapacityPlan) -> str:
    """A few human-readable lines describing ``p``.

    Example:
        >>> print(format_plan(plan(None, 1000, 0.5, peak_qps=100, mean_output_tokens=200)))
        ... # doctest: +ELLIPSIS
        Profile -: peak 100 QPS x 200.0 mean output tokens = 20,000 output tokens/s
        ...
    """
    lines = [
        f"Profile {p.profile}: peak {p.peak_qps:,.4g} QPS x {p.mean_output_tokens:,.1f} mean "
        f"output tokens = {p.required_tokens_per_s:,.0f} output tokens/s",
        f"GPUs: {p.required_tokens_per_s:,.0f} / ({p.tokens_per_s_per_gpu:,.0f} tok/s x "
        f"{p.target_utilisation:.2f}) = {p.gpus_exact:,.2f} -> {p.gpus} "
        f"(utilisation at peak {p.utilisation_at_peak:.0%}, headroom {p.headroom:.0%})",
        f"One GPU serves up to {p.max_qps_per_gpu:,.3g} QPS at "
        f"{p.target_utilisation:.0%} utilisation.",
        "Running, each sidecar applies this formula to its last 60 s: "
        "sts_sidecar_desired_gpus on its /metrics (docs/metrics.md, scale signal).",
    ]
    if (q := p.prompts) is not None:
        lines.append(
            f"With prompts: {q.required_prompt_tokens_per_s:,.0f} prompt tokens/s; "
            f"({p.required_tokens_per_s:,.0f} / {p.tokens_per_s_per_gpu:,.0f} + "
            f"{q.required_prompt_tokens_per_s:,.0f} / {q.prefill_tokens_per_s:,.0f} prefill "
            f"tok/s) / {p.target_utilisation:.2f} = {q.gpus_exact:,.2f} -> {q.gpus} GPUs")
    elif p.mean_input_tokens is not None and \
            p.mean_input_tokens >= LONG_PROMPTS * p.mean_output_tokens:
        lines.append(
            f"Prompts average {p.mean_input_tokens:,.0f} tokens, "
            f"{p.mean_input_tokens / p.mean_output_tokens:,.0f}x the output: this formula "
            "counts output tokens only; --prefill-tokens-per-s counts their prefill too.")
    if p.gpu_cost_per_hour is not None:
        lines.append(f"Self-hosted: {p.gpus} x ${p.gpu_hour_price:,.2f}/h = "
                     f"${p.gpu_cost_per_hour:,.2f}/h")
    if p.api_cost_per_request is not None:
        lines.append(f"API: ${p.api_cost_per_request:.6f} per request, "
                     f"${p.api_cost_per_hour_at_peak:,.2f}/h at peak")
    if p.break_even_qps is not None:
        verdict = ("one GPU can carry it, so above it self-hosting is cheaper"
                   if p.break_even_fits_one_gpu else
                   f"that is more than one GPU serves ({p.max_qps_per_gpu:,.3g} QPS), so the API "
                   "is cheaper at any rate at this utilisation")
        lines.append(f"Break-even: {p.break_even_qps:,.3g} QPS sustained per GPU; below it "
                     f"the API is cheaper; {verdict}.")
    return "\n".join(lines)


#: Output tokens/s of one GPU when none is measured: Llama-3.1-8B on one H100 with vLLM.
DEFAULT_TOKENS_PER_S = 3400.0

#: Prompts this many times longer than the output on average get a line saying the
#: formula leaves their prefill out.
LONG_PROMPTS = 4.0


def add_plan_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``sts plan`` options to ``parser`` (returned for chaining)."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile",
                        help="traffic profile: a name in conf/profiles (e.g. seed-200qps) "
                             "or a YAML path")
    source.add_argument("--trace", metavar="FILE",
                        help="a production trace (.csv: TIMESTAMP, ContextTokens, "
                             "GeneratedTokens; or .jsonl): its peak over 60 s and its mean "
                             "output length")
    parser.add_argument("--trace-rate", type=float, default=None, metavar="REQ_PER_S",
                        help="--trace: scale its arrival times to this mean rate (its bursts "
                             "scale with it)")
    parser.add_argument("--tokens-per-s", type=float, default=DEFAULT_TOKENS_PER_S,
                        help="output tokens/s one GPU sustains (default 3400: Llama-3.1-8B "
                             "on one H100, vLLM, ~3,400 output tok/s; replace with your "
                             "measured figure)")
    parser.add_argument("--prefill-tokens-per-s", type=float, default=None,
                        help="prompt tokens/s one GPU prefills (e.g. 20000 for an 8B model on "
                             "one H100): count the prompts too, which the seed's formula "
                             "leaves out (default: not counted)")
    parser.add_argument("--utilisation", type=float, default=0.7,
                        help="target utilisation at peak, in (0, 1] (seed: 0.6-0.75; "
                             "default 0.7)")
    parser.add_argument("--peak-qps", type=float, default=None,
                        help="plan for this peak instead of the profile's")
    parser.add_argument("--api-price-out", type=float, default=None,
                        help="API price, $ per million output tokens")
    parser.add_argument("--api-price-in", type=float, default=None,
                        help="API price, $ per million input tokens (default 0)")
    parser.add_argument("--gpu-hour-price", type=float, default=None,
                        help="$ per GPU-hour")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    return parser


def run_plan(args: argparse.Namespace) -> int:
    """Run ``sts plan`` with parsed ``args``; prints the plan and returns the exit code
    (0, or 2 for a missing or invalid profile or argument)."""
    prices = dict(api_price_per_mtok_out=args.api_price_out, gpu_hour_price=args.gpu_hour_price,
                  api_price_per_mtok_in=args.api_price_in,
                  prefill_tokens_per_s=getattr(args, "prefill_tokens_per_s", None))
    try:
        if getattr(args, "trace", None):
            return _plan_trace(args, prices)
        if getattr(args, "trace_rate", None) is not None:
            raise ValueError("--trace-rate needs --trace")
        result = plan(load_profile(args.profile), args.tokens_per_s, args.utilisation,
                      peak_qps=args.peak_qps, **prices)
    except (FileNotFoundError, ValueError) as e:
        print(f"sts: {one_line(e)} (sts plan)", file=sys.stderr)
        return 2
    print(json.dumps(dataclasses.asdict(result), indent=2) if args.json else format_plan(result))
    return 0


def _plan_trace(args: argparse.Namespace, prices: dict) -> int:
    """``sts plan --trace``: the trace's figures, then the plan for its peak."""
    from sts_capacity.trace import format_figures, read_trace

    trace = read_trace(args.trace)
    if args.trace_rate is not None:
        trace = trace.scaled(rate=args.trace_rate)
    figures = trace.figures()
    result = dataclasses.replace(
        plan(None, args.tokens_per_s, args.utilisation,
             peak_qps=args.peak_qps or figures.peak_rate,
             mean_output_tokens=figures.output_tokens["mean"],
             mean_input_tokens=figures.input_tokens["mean"], **prices),
        profile=f"trace {trace.name}")
    if args.json:
        print(json.dumps({"trace": dataclasses.asdict(figures),
                          "plan": dataclasses.asdict(result)}, indent=2))
    else:
        print(format_figures(trace, figures))
        print(format_plan(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m sts_capacity.plan --profile seed-200qps``."""
    parser = add_plan_arguments(argparse.ArgumentParser(
        prog="sts plan", description="GPUs needed for a traffic profile, and the API "
                                     "break-even."))
    return run_plan(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
