"""Gateway overhead micro-benchmark: what the sidecar itself costs, per core.

The sidecar runs as a child process pinned to one CPU core, in front of a
``simulated`` engine that absorbs work at once (a 0.01 ms step, no per-sequence
cost, effectively unlimited sequences and KV cache), with every admission limit,
watermark and deadline check out of the way. What is left is the gateway's own
work: gRPC, admission, queueing, dispatch, the per-request engine task and the
Parquet result channel.

Two measurements (:mod:`benchmarks.gateway_load`; the sidecar under test is set up by
:mod:`benchmarks.gateway_sidecar`):

* **Throughput**, per batch size: ``threads`` client threads (in this process,
  pinned to the other cores when there are any) each submit batches back to
  back for ``duration_s`` (closed loop). Reported: requests accepted per second,
  RPCs per second, the ack round trip per RPC and per request (p50/p99), the
  results the sidecar finished per second in the same window, the backlog left
  at its end, the CPU share the sidecar and the client used, and the sidecar's
  CPU microseconds per request (window start until it is idle again; robust to a
  busy machine).
* **Added latency** at low load: single-request submits spaced a few
  milliseconds apart. From the result rows: ``received_ts - send time`` (wire
  and gRPC), ``finish_ts - received_ts`` (admission, queue, dispatch, the
  instant engine, the result record); and, separately, the time until the
  result is visible on disk (Parquet flush interval, up to 200 ms). Row
  timestamps are epoch milliseconds, so those figures have 1 ms resolution; the
  ack round trip is timed in the client with ``perf_counter``.

Example:
    python -m benchmarks.gateway_overhead --duration 5 --batch-sizes 1,8,64,256 \\
        --threads 2 --out benchmarks/results/gateway_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from benchmarks.cpu_accounting import machine_info, pin_threads, reference_cpu_ms
from benchmarks.gateway_load import PROMPT, added_latency, make_stub, throughput
from benchmarks.gateway_sidecar import (
    DEADLINE_MS,
    MAX_IN_FLIGHT,
    SIDECAR_SETTINGS,
    BenchmarkError,
    pinned_sidecar,
)
from sidecar import EVENT_LOOPS, write_text_atomically

if TYPE_CHECKING:
    from sts_harness.process import SidecarProcess

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "gateway_overhead.json"
DEFAULT_BATCH_SIZES = (1, 8, 64, 256)

_WARMUP_S = 0.5


def _log(msg: str, *args: object) -> None:
    """One progress line on stderr."""
    print(f"[gateway_overhead] {msg % args if args else msg}", file=sys.stderr, flush=True)


def _or_nan(x: float | None) -> float:
    """``x``, or NaN for a missing figure (progress lines only)."""
    return float("nan") if x is None else x


def run(duration_s: float, batch_sizes: list[int], threads: int, out: Path | None, *,
        latency_samples: int = 200, latency_interval_s: float = 0.005,
        sidecar_core: int | None = None, event_loop: str = "auto") -> dict:
    """Run the benchmark and return (and, with ``out``, write) the JSON result.

    While it runs, every thread of this process is pinned to the cores other
    than the sidecar's (when there are any); the original affinity is restored.

    Args:
        duration_s: Seconds of closed-loop load per batch size.
        batch_sizes: Requests per ``SubmitBatch`` call, one window each.
        threads: Client threads submitting concurrently.
        out: Where to write the JSON result (folders are created); ``None``: nowhere.
        latency_samples: Single-request submits in the added-latency run.
        latency_interval_s: Spacing of those submits.
        sidecar_core: Core to pin the sidecar to (default: the lowest usable core).
        event_loop: The sidecar's ``server.event_loop`` (``auto``: uvloop where
            installed).

    Returns:
        ``{"machine", "settings", "throughput": [one dict per batch size],
        "added_latency"}``.

    Raises:
        ValueError: An argument is out of range.
        BenchmarkError: The sidecar failed to start, died, or refused requests.
    """
    _check(duration_s, batch_sizes, threads, latency_samples, latency_interval_s)
    original = os.sched_getaffinity(0)
    cores = sorted(original)
    core = cores[0] if sidecar_core is None else sidecar_core
    if core not in original:
        raise ValueError(f"{sidecar_core=} is not one of the usable cores {cores}")
    client_cores = (original - {core}) or original
    settings = {
        "duration_s": duration_s, "batch_sizes": list(batch_sizes), "threads": threads,
        "sidecar_core": core, "client_cores": sorted(client_cores),
        "client_shares_sidecar_core": core in client_cores,
        "request": {"prompt": PROMPT, "max_tokens": 1, "priority": "high",
                    "deadline_in_ms": DEADLINE_MS},
        "latency_samples": latency_samples, "latency_interval_ms": latency_interval_s * 1000,
        "warmup_s": _WARMUP_S, "sidecar_max_in_flight": MAX_IN_FLIGHT,
        "sidecar_settings": SIDECAR_SETTINGS, "event_loop": event_loop,
    }
    result: dict[str, Any] = {"benchmark": "gateway_overhead",
                              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                              "machine": machine_info(), "settings": settings}
    # How fast this machine runs Python now, on the sidecar's core (shared VMs vary).
    reference = {"before_ms": _reference_on(core, original)}
    result["machine"]["reference_cpu_ms"] = reference
    _log("reference workload on core %d: %.1f ms CPU", core, reference["before_ms"])
    with tempfile.TemporaryDirectory(prefix="sts-gateway-bench-") as tmp:
        _log("starting the sidecar pinned to core %d (client cores %s)", core,
             sorted(client_cores))
        with pinned_sidecar(Path(tmp), core, event_loop) as sidecar:
            _log("sidecar serving on %s", sidecar.target)
            try:
                result.update(_measure(sidecar, batch_sizes, duration_s, threads,
                                       client_cores, latency_samples, latency_interval_s))
            finally:
                pin_threads(original)
    reference["after_ms"] = _reference_on(core, original)
    _log("reference workload on core %d after the run: %.1f ms CPU", core,
         reference["after_ms"])
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if out is not None:
        write_text_atomically(out, json.dumps(result, indent=2) + "\n")
        _log("wrote %s", out)
    return result


def _check(duration_s: float, batch_sizes: list[int], threads: int, latency_samples: int,
           latency_interval_s: float) -> None:
    """Refuse arguments out of range (``ValueError``)."""
    if not duration_s > 0:
        raise ValueError(f"{duration_s=} must be > 0")
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ValueError(f"{batch_sizes=} must be a non-empty list of positive sizes")
    if threads < 1 or latency_samples < 1 or latency_interval_s < 0:
        raise ValueError(f"{threads=} and {latency_samples=} must be >= 1, "
                         f"{latency_interval_s=} >= 0")


def _reference_on(core: int, original: set[int]) -> float:
    """CPU ms of the reference workload on ``core`` (then back to ``original``)."""
    pin_threads({core})
    try:
        return reference_cpu_ms()
    finally:
        pin_threads(original)


def _measure(sidecar: SidecarProcess, batch_sizes: list[int], duration_s: float,
             threads: int, client_cores: set[int], latency_samples: int,
             latency_interval_s: float) -> dict[str, Any]:
    """Warm up, then the added-latency run and one throughput window per batch size,
    from ``threads`` client threads pinned to ``client_cores``."""
    assert sidecar.client is not None
    out: dict[str, Any] = {}
    channels = [make_stub(sidecar.target) for _ in range(threads)]
    stubs = [stub for _, stub in channels]
    try:
        with ThreadPoolExecutor(threads, thread_name_prefix="bench-client") as pool:
            pin_threads(client_cores)
            _log("warm-up %.1f s", _WARMUP_S)
            throughput(sidecar, stubs, 8, _WARMUP_S, "warm", pool, len(client_cores))
            time.sleep(0.3)  # let the warm-up's results reach disk
            _log("added latency: %d single-request submits %.0f ms apart", latency_samples,
                 latency_interval_s * 1000)
            out["added_latency"] = lat = added_latency(
                sidecar, stubs[0], latency_samples, latency_interval_s)
            _log("  ack rtt p50 %.3f ms, received->finish mean %.2f ms, "
                 "finish->visible mean %.1f ms", lat["ack_rtt_ms"]["p50"],
                 lat["received_to_finish_ms"]["mean"],
                 _or_nan(lat["finish_to_visible_ms"]["mean"]))
            out["throughput"] = []
            for window, size in enumerate(batch_sizes):
                _log("batch %d: %d thread(s) for %.1f s", size, threads, duration_s)
                pin_threads(client_cores)
                # Ids unique per window: a batch size given twice is new work again.
                row = throughput(sidecar, stubs, size, duration_s, f"w{window}-b{size}",
                                 pool, len(client_cores))
                if row["refused"]:
                    raise BenchmarkError(f"batch {size}: sidecar refused requests "
                                         f"{row['refused']}; the engine is not absorbing")
                out["throughput"].append(row)
                _log("  %.0f req/s, %.0f rpc/s, ack p50 %.3f ms, completed %.0f/s, "
                     "sidecar cpu %s, %s us cpu/request", row["submissions_per_s"],
                     row["rpcs_per_s"], row["ack_ms_per_rpc"]["p50"],
                     row["completed_per_s"], row["sidecar_cpu_util"],
                     row["sidecar_cpu_us_per_request"])
    except grpc.RpcError as e:
        raise BenchmarkError(f"RPC to the sidecar failed: {e.code()} {e.details()}. "
                             f"Sidecar log:\n{sidecar.tail_log()}") from e
    finally:
        for channel, _ in channels:
            channel.close()
    return out


def format_table(result: dict) -> str:
    """The throughput rows and the added-latency figures as a small text table."""
    lines = [f"{'batch':>5} {'req/s':>9} {'rpc/s':>8} {'ack p50 ms':>10} {'ack p99 ms':>10} "
             f"{'us/req p50':>10} {'us/req p99':>10} {'done/s':>9} {'backlog':>7} "
             f"{'sidecar cpu':>11} {'cpu us/req':>10} {'client cpu':>10}"]
    for r in result["throughput"]:
        cpu = "-" if r["sidecar_cpu_util"] is None else f"{r['sidecar_cpu_util']:.0%}"
        us = r.get("sidecar_cpu_us_per_request")
        us_text = "-" if us is None else f"{us:.1f}"
        lines.append(
            f"{r['batch_size']:>5} {r['submissions_per_s']:>9.0f} {r['rpcs_per_s']:>8.0f} "
            f"{r['ack_ms_per_rpc']['p50']:>10.3f} {r['ack_ms_per_rpc']['p99']:>10.3f} "
            f"{r['ack_us_per_request']['p50']:>10.1f} {r['ack_us_per_request']['p99']:>10.1f} "
            f"{r['completed_per_s']:>9.0f} {r['backlog_at_end']:>7} {cpu:>11} {us_text:>10} "
            f"{r['client_cpu_util']:>10.0%}")
    ref = result["machine"].get("reference_cpu_ms")
    if ref:
        lines.append(f"(reference workload on the sidecar's core: {ref['before_ms']:.1f} ms CPU "
                     f"before, {ref.get('after_ms', float('nan')):.1f} ms after; higher: a "
                     "slower machine at the time)")
    lat = result["added_latency"]
    lines.append(f"\nadded latency, {lat['samples']} single requests "
                 f"{lat['interval_ms']:.0f} ms apart (ms; row timestamps have 1 ms resolution):")
    for key in ("ack_rtt_ms", "send_to_received_ms", "received_to_finish_ms",
                "finish_to_visible_ms", "send_to_visible_ms"):
        s = lat[key]
        lines.append(f"  {key[:-3]:<20} mean {s['mean']} p50 {s['p50']} p99 {s['p99']} "
                     f"max {s['max']}")
    return "\n".join(lines)


def _sizes(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def main(argv: list[str] | None = None) -> int:
    """Command line: run, print the table, write the JSON result."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway_overhead",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0,
                        help="seconds of closed-loop load per batch size (default 5)")
    parser.add_argument("--batch-sizes", type=_sizes, default=list(DEFAULT_BATCH_SIZES),
                        help="comma-separated requests per SubmitBatch (default 1,8,64,256)")
    parser.add_argument("--threads", type=int, default=2, help="client threads (default 2)")
    parser.add_argument("--latency-samples", type=int, default=200,
                        help="single-request submits in the added-latency run (default 200)")
    parser.add_argument("--latency-interval-ms", type=float, default=5.0,
                        help="spacing of those submits (default 5)")
    parser.add_argument("--sidecar-core", type=int, default=None,
                        help="core to pin the sidecar to (default: lowest usable core)")
    parser.add_argument("--event-loop", choices=EVENT_LOOPS, default="auto",
                        help="the sidecar's server.event_loop (default auto: uvloop where "
                             "installed)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"JSON result (default {DEFAULT_OUT.relative_to(REPO)})")
    args = parser.parse_args(argv)
    try:
        result = run(args.duration, args.batch_sizes, args.threads, args.out,
                     latency_samples=args.latency_samples,
                     latency_interval_s=args.latency_interval_ms / 1000.0,
                     sidecar_core=args.sidecar_core, event_loop=args.event_loop)
    except (BenchmarkError, ValueError) as e:
        print(f"gateway_overhead: {e}", file=sys.stderr)
        return 1
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
