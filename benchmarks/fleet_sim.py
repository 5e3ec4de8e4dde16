"""Elastic capacity at fleet scale, in virtual time (issue 64): sts-spark's controller
against an oracle and the autoscalers users run today, on the production trace scaled
to 8 and 64 GPUs and on the load step of ``benchmarks.load_step``.

The fleet, the oracle and the policies are :mod:`sts_harness.fleet` and
:mod:`sts_harness.autoscalers`; sts-spark's controller is the pipeline's own class on
the sidecars' own scale signal. Each traffic is run once per policy, every policy from the
same start:

- **trace**: the Azure code trace (one hour, bursty) laid over itself ``copies`` times,
  each copy's arrivals moved by up to ``--jitter`` seconds, ``copies`` chosen so that
  the oracle's peak is the scale asked for (``--scales``); priorities and deadlines by
  the profile (``--profile``, the seed's 20/50/30 % and 3/8/30 s); a GPU serves after
  ``--cold-start`` seconds.
- **load step**: section 23's traffic (9 events/s, 4x for 3 minutes, the seed's
  lengths capped at 300 tokens, deadlines 8/15/30 s) between 1 and 4 GPUs with the
  controller settings of that run and a 15 s cold start (what the local-cluster run
  measured from the ask to a new sidecar's first answer); the recorded real runs
  (``benchmarks/results/load-step``) are shown beside it where present.

Reported per policy: GPU-seconds (billed from the ask to the release, a released GPU
until it has finished what it holds), their ratio to the oracle's (the sum over the
seconds of the GPUs the capacity formula gives for the next 60 s of arrivals) and to a
static fleet at the oracle's peak, the share of each priority's requests answered by its
deadline (requests no GPU could finish in time are counted apart), the scale actions and
the peak. ``fleet_sim.json`` holds it all; the command prints the tables.

Example:
    python -m benchmarks.fleet_sim                      # ~3 minutes
    python -m benchmarks.fleet_sim --scales 8 --no-load-step
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from sidecar import write_text_atomically
from spark_ext.config import ScalingConfig
from sts_capacity.profiles import load_profile
from sts_capacity.trace import read_trace
from sts_harness.autoscalers import (Autoscaler, KedaHpa, OracleScaler, RayServeScaler,
                                     StaticScaler, StsScaler)
from sts_harness.fleet import (PRIORITY_ORDER, GpuModel, Traffic, oracle_gpus, overlay,
                               simulate)

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "benchmarks" / "traces" / "azure-llm-inference-2023-code.csv"
#: The load-step run's controller settings and check interval (``benchmarks.load_step``).
LOAD_STEP_SCALING = {"up_window_s": 60.0, "down_window_s": 180.0, "cooldown_s": 120.0}
#: The load-step run's GPUs: one at least, four at most.
LOAD_STEP_GPUS = {"min_gpus": 1, "max_gpus": 4}
#: From the scale-up's ask to the new GPU's first answer in the local-cluster run
#: (section 23: asked at 688.8 s, serving at 703.9 s).
LOAD_STEP_COLD_START_S = 15.0


def trace_arrays(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrival seconds, prompt and output tokens of a trace file."""
    trace = read_trace(path)
    return (np.array([r.arrival_s for r in trace.requests]),
            np.array([r.input_tokens for r in trace.requests]),
            np.array([r.output_tokens for r in trace.requests]))


def copies_for(arrays: tuple[np.ndarray, np.ndarray, np.ndarray], gpu: GpuModel,
               gpus: int, **traffic: object) -> int:
    """How many copies of the trace make the oracle's peak ``gpus`` (the largest count
    that does not pass it).

    Example:
        >>> arrays = (np.arange(0.0, 600.0), np.ones(600, int), np.full(600, 770))
        >>> copies_for(arrays, GpuModel(), 4, jitter_s=0.0, priority_mix={"high": 1.0},
        ...            sla_ms={"high": 3000, "normal": 8000, "low": 30000})
        7
    """
    one = overlay("one", *arrays, copies=1, **traffic)
    per_second = one.tokens_per_second()
    window = np.convolve(per_second, np.ones(60), mode="valid") / 60 if len(per_second) >= 60 \
        else np.array([per_second.sum() / 60])
    estimate = max(1, int(gpus * gpu.capacity_tokens_per_s * gpu.target_utilisation
                          / max(window.max(), 1e-9)))
    while estimate > 1 and oracle_gpus(overlay("n", *arrays, copies=estimate, **traffic),
                                       gpu).max() > gpus:
        estimate -= 1
    return estimate


def load_step_traffic(seed: int = 0, max_tokens: int = 300) -> Traffic:
    """Section 23's load step as traffic (``benchmarks.load_step``'s events)."""
    from benchmarks.load_step import SLA_MS, Schedule, step_requests

    requests = step_requests(Schedule(9.0, 4.0, 600.0, 180.0, 360.0), seed=seed)
    return Traffic(
        "load-step", np.array([r.arrival_s for r in requests]),
        np.array([PRIORITY_ORDER.index(r.priority) for r in requests]),
        np.array([r.input_tokens for r in requests]),
        np.array([min(r.max_tokens, max_tokens) for r in requests]),
        tuple(SLA_MS[p] / 1000.0 for p in PRIORITY_ORDER))


def policies(gpu: GpuModel, oracle: np.ndarray, *, min_gpus: int, max_gpus: int,
             sts: dict[str, float]) -> list[tuple[Autoscaler, GpuModel, int]]:
    """Each policy with the GPU it sees (the oracle's starts at once) and its first
    number of GPUs; fresh objects (a policy keeps state)."""
    start = int(oracle[0])
    peak = int(oracle.max())
    scaling = ScalingConfig(enabled=True, min_gpus=min_gpus, max_gpus=max_gpus, **sts)
    full = dataclasses.replace(gpu, target_utilisation=1.0)
    return [
        (OracleScaler(oracle), dataclasses.replace(gpu, cold_start_s=0.0), start),
        (StsScaler(scaling), gpu, start),
        (StsScaler(scaling, name="sts-spark, target_utilisation 1.0"), full, start),
        (KedaHpa(min_gpus=min_gpus, max_gpus=max_gpus), gpu, start),
        (KedaHpa(metric="desired_gpus", threshold=1.0, min_gpus=min_gpus, max_gpus=max_gpus,
                 name="keda-hpa (desired_gpus)"), gpu, start),
        (RayServeScaler(target_ongoing_requests=gpu.batch * gpu.target_utilisation,
                        min_gpus=min_gpus, max_gpus=max_gpus), gpu, start),
        (StaticScaler(min_gpus, name=f"static {min_gpus}"), gpu, min_gpus),
        (StaticScaler(peak, name=f"static peak ({peak})"), gpu, peak),
    ]


def run_traffic(traffic: Traffic, gpu: GpuModel, *, min_gpus: int, max_gpus: int,
                sts: dict[str, float]) -> dict:
    """Every policy on ``traffic``: the oracle's figures and one row per policy."""
    oracle = oracle_gpus(traffic, gpu, min_gpus=min_gpus, max_gpus=max_gpus)
    oracle_s = float(oracle.sum())
    peak_s = float(oracle.max()) * len(oracle)
    rows = []
    for policy, seen_gpu, start in policies(gpu, oracle, min_gpus=min_gpus,
                                            max_gpus=max_gpus, sts=sts):
        began = time.monotonic()
        run = simulate(traffic, seen_gpu, policy, initial_gpus=start)
        row = run.as_dict()
        row.update(x_oracle=round(run.gpu_seconds / oracle_s, 3),
                   x_static_peak=round(run.gpu_seconds / peak_s, 3),
                   wall_s=round(time.monotonic() - began, 1))
        rows.append(row)
        print(f"  {policy.name}: {_row_line(row)}", file=sys.stderr, flush=True)
    return {"traffic": traffic.name, "requests": len(traffic.arrival_s),
            "duration_s": round(traffic.duration_s, 1),
            "mean_output_tokens_per_s": round(float(traffic.output_tokens.sum())
                                              / max(traffic.duration_s, 1.0), 1),
            "oracle_gpu_seconds": oracle_s, "oracle_peak_gpus": int(oracle.max()),
            "cold_start_s": gpu.cold_start_s, "min_gpus": min_gpus, "max_gpus": max_gpus,
            "sts_scaling": sts, "runs": rows}


def _row_line(row: dict) -> str:
    sla = " ".join(f"{p} {row['within_sla'][p]:.2%}" for p in PRIORITY_ORDER)
    return (f"{row['gpu_seconds']:.0f} GPU-s ({row['x_oracle']:.2f}x oracle, "
            f"{row['x_static_peak']:.2f}x static peak), within SLA {sla}, "
            f"{row['actions']} actions, peak {row['peak_gpus']}")


def recorded_load_step(folder: Path) -> list[dict]:
    """The real local-cluster runs of the load step, where recorded."""
    out = []
    for name in ("elastic", "static-1", "static-4"):
        path = folder / f"{name}.json"
        if path.is_file():
            d = json.loads(path.read_text())
            out.append({"run": name, "gpu_seconds": d["gpu_seconds"],
                        "within_sla": d["llm_within_sla_all"],
                        "actions": len(d.get("scale_actions", []))})
    return out


def format_table(result: dict) -> list[str]:
    """A Markdown table of one traffic's runs."""
    lines = [f"{result['traffic']}: {result['requests']:,} requests over "
             f"{result['duration_s']:.0f} s, oracle {result['oracle_gpu_seconds']:.0f} "
             f"GPU-s (peak {result['oracle_peak_gpus']}), cold start "
             f"{result['cold_start_s']:.0f} s", "",
             "| policy | GPU-s | x oracle | x static peak | high | normal | low | actions |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["runs"]:
        s = r["within_sla"]
        lines.append(f"| {r['policy']} | {r['gpu_seconds']:.0f} | {r['x_oracle']:.2f} | "
                     f"{r['x_static_peak']:.2f} | {s['high']:.2%} | {s['normal']:.2%} | "
                     f"{s['low']:.2%} | {r['actions']} |")
    return lines


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fleet_sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--scales", default="8,64",
                   help="the oracle's peak GPUs to scale the trace to (comma-separated)")
    p.add_argument("--jitter", type=float, default=10.0,
                   help="seconds each copy's arrivals are moved by, at most")
    p.add_argument("--cold-start", type=float, default=60.0,
                   help="seconds from a GPU's ask to its serving, on the trace")
    p.add_argument("--profile", default="seed-200qps",
                   help="priority mix and deadlines for the trace's requests")
    p.add_argument("--no-load-step", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "fleet-sim")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    try:
        scales = [int(s) for s in args.scales.split(",") if s.strip()]
    except ValueError:
        print(f"--scales {args.scales!r}: need whole numbers of GPUs", file=sys.stderr)
        return 2
    if not scales or min(scales) < 1:
        print(f"--scales {args.scales!r}: need at least one scale of 1 GPU or more",
              file=sys.stderr)
        return 2
    profile = load_profile(args.profile)
    gpu = GpuModel(cold_start_s=args.cold_start)
    arrays = trace_arrays(args.trace)
    shape = {"jitter_s": args.jitter, "priority_mix": profile.priority_mix,
             "sla_ms": profile.sla_ms, "seed": args.seed}
    sts_defaults = {f.name: getattr(ScalingConfig(), f.name)
                    for f in dataclasses.fields(ScalingConfig)
                    if f.name in ("up_window_s", "down_window_s", "cooldown_s", "tolerance")}
    results = []
    for scale in scales:
        copies = copies_for(arrays, gpu, scale, **shape)
        traffic = overlay(f"{args.trace.stem} x{copies}", *arrays, copies=copies, **shape)
        print(f"{traffic.name}: {len(traffic.arrival_s):,} requests", file=sys.stderr)
        result = run_traffic(traffic, gpu, min_gpus=1, max_gpus=2 * scale, sts=sts_defaults)
        result.update(scale=scale, copies=copies, jitter_s=args.jitter)
        results.append(result)
    if not args.no_load_step:
        print("load step", file=sys.stderr)
        step_gpu = dataclasses.replace(gpu, cold_start_s=LOAD_STEP_COLD_START_S)
        result = run_traffic(load_step_traffic(args.seed), step_gpu, sts=LOAD_STEP_SCALING,
                             **LOAD_STEP_GPUS)
        result["recorded"] = recorded_load_step(REPO / "benchmarks" / "results" / "load-step")
        results.append(result)
    doc = {"benchmark": "fleet_sim", "trace": args.trace.name,
           "gpu": {"batch": gpu.batch, "tpot_ms": round(gpu.tpot_s * 1000, 2),
                   "capacity_tokens_per_s": round(gpu.capacity_tokens_per_s, 1),
                   "target_utilisation": gpu.target_utilisation},
           "profile": args.profile, "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomically(args.out / "fleet_sim.json", json.dumps(doc, indent=1) + "\n")
    for result in results:
        print("\n".join(format_table(result)) + "\n")
    print(f"wrote {args.out / 'fleet_sim.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
