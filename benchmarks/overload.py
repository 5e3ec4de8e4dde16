"""The 10x-overload benchmark: does ``high`` stay on time when the sidecar is swamped?

A sidecar child process with the shipped ``conf/sidecar.yaml`` (engine chosen by
``--engine``), driven over gRPC in two phases:

1. **Capacity**: a backlog of ``normal``/``low`` requests with the overload's output
   lengths and generous deadlines, with the pools' ``max_in_flight`` lifted to the
   engine's (the engine's capacity, not the policy's); capacity is the rate they
   complete (requests/s).
2. **Overload**: ``--factor`` x capacity offered for ``--duration`` seconds (Poisson;
   longer when needed to offer at least ``--min-high`` ``high`` requests),
   ``high`` at ``--high-share`` of capacity with short outputs (at most
   ``--high-max-tokens``) and ``--high-sla-ms`` deadlines; the rest ``normal`` (SLA
   ``--normal-sla-ms``, 10 s) and ``low`` (SLA 30 s), ``--normal-share`` of it
   ``normal`` (0.4), with long-tailed outputs.

3. With ``--high-only``: the overload's ``high`` arrivals alone, to a fresh sidecar
   (what the engine gives ``high`` with nothing else in its way); the overload's
   ``high`` on time is then reported as a share of this (``high_vs_high_only``).

Reported per priority: sent, on time (``ok`` by the deadline), shed by reason, ``ok``
latency; the preemptions (``/metrics``); whether every request got exactly one row;
whether the on-time shares keep the order ``high`` >= ``normal`` >= ``low``
(``order_kept``); and, from the sidecar's log (``server.log_requests``), the error of
the queue-wait estimate (actual minus estimated wait, P50/P99 per pool, for requests
that started).

Example:
    python -m benchmarks.overload --engine simulated
    python -m benchmarks.overload --engine vllm --duration 20
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.cpu_accounting import machine_info
from benchmarks.generate import GeneratedRequest
from benchmarks.loadgen import collect, report, send_on_schedule
from sidecar import ENGINES, SidecarConfig, percentile, write_text_atomically
from sts_harness.process import SidecarProcess, free_port

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "overload-{engine}.json"
SLA_MS = {"high": 3000, "normal": 10_000, "low": 30_000}
PROMPT = "My order has not arrived yet and the tracking page shows no update. Please help."
_WAIT_LINE = re.compile(r"Queue wait of \S+ \((\w+)\): estimated ([\d.]+) ms, actual ([\d.]+) ms")


def _log(msg: str, *args: object) -> None:
    print(f"[overload] {msg % args if args else msg}", file=sys.stderr, flush=True)


def _long_tail(rng: np.random.Generator, median: float, cap: int) -> int:
    """Log-normal output length (sigma 0.9: P99 ~ 8x the median), 1..cap tokens."""
    return int(min(cap, max(1, round(rng.lognormal(np.log(median), 0.9)))))


def make_requests(*, capacity: float, factor: float, duration_s: float, high_share: float,
                  high_max_tokens: int, high_sla_ms: int, median_tokens: int, cap: int,
                  seed: int, normal_share: float = 0.4,
                  normal_sla_ms: int = SLA_MS["normal"]) -> list[GeneratedRequest]:
    """The overload's arrivals (Poisson per priority), in arrival order."""
    rng = np.random.default_rng(seed)
    total = factor * capacity
    rates = {"high": high_share * capacity}
    rest = max(total - rates["high"], 0.0)
    rates["normal"], rates["low"] = normal_share * rest, (1.0 - normal_share) * rest
    sla_ms = {**SLA_MS, "normal": normal_sla_ms}
    draws = []
    for prio, rate in rates.items():
        t = rng.exponential(1.0 / rate) if rate > 0 else duration_s
        while t < duration_s:
            if prio == "high":
                tokens = int(min(high_max_tokens, max(8, round(rng.lognormal(np.log(48), 0.5)))))
                sla = high_sla_ms
            else:
                tokens, sla = _long_tail(rng, median_tokens, cap), sla_ms[prio]
            draws.append((t, prio, tokens, sla))
            t += rng.exponential(1.0 / rate)
    draws.sort()
    return [GeneratedRequest(index=i, arrival_s=t, priority=p, input_tokens=20, max_tokens=m,
                             sla_ms=s, prompt=PROMPT, content=PROMPT)
            for i, (t, p, m, s) in enumerate(draws)]


def measure_capacity(sidecar: SidecarProcess, *, n: int, median_tokens: int, cap: int,
                     seed: int) -> dict:
    """Requests/s the sidecar completes with a backlog of ``normal``/``low`` work."""
    rng = np.random.default_rng(seed + 1)
    reqs = [GeneratedRequest(index=i, arrival_s=0.0, priority="normal" if i % 5 < 2 else "low",
                             input_tokens=20, max_tokens=_long_tail(rng, median_tokens, cap),
                             sla_ms=600_000, prompt=PROMPT, content=PROMPT) for i in range(n)]
    assert sidecar.client is not None
    run = send_on_schedule(sidecar.client, reqs, id_prefix="cap", duration_s=0.0)
    results = collect(run, sidecar.results_dir, timeout_s=1800)
    ok = sorted(r["finish_ts"] for r in results.values() if r["status"] == "ok")
    if len(ok) < n // 2:
        raise RuntimeError(f"capacity run: only {len(ok)} of {n} requests finished ok")
    # Steady state: skip the first and last tenth (ramp-up and the tail of the backlog).
    lo, hi = ok[len(ok) // 10], ok[-(len(ok) // 10) - 1]
    done = len(ok) - 2 * (len(ok) // 10) - 1
    rate = done / max((hi - lo) / 1000.0, 1e-3)
    return {"requests": n, "ok": len(ok), "requests_per_s": round(rate, 3)}


def _metric(url: str, name: str) -> float | None:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{}"):
            return float(line.split()[-1])
    return None


def wait_estimate_errors(log_path: Path) -> dict[str, dict]:
    """Actual minus estimated queue wait (ms) per pool, from the sidecar's log."""
    errors: dict[str, list[float]] = collections.defaultdict(list)
    for line in log_path.read_text(errors="replace").splitlines():
        if m := _WAIT_LINE.search(line):
            errors[m.group(1)].append(float(m.group(3)) - float(m.group(2)))
    return {p: {"n": len(xs), "p50_ms": percentile(xs, 50), "p99_ms": percentile(xs, 99),
                "p1_ms": percentile(xs, 1)} for p, xs in sorted(errors.items())}


def run(engine: str, *, factor: float, duration_s: float, high_share: float,
        high_max_tokens: int, high_sla_ms: int, median_tokens: int, cap: int,
        capacity_requests: int, capacity: float | None, seed: int, config: Path,
        min_high: int, extra: list[str], out: Path | None, high_only: bool = False,
        normal_share: float = 0.4, normal_sla_ms: int = SLA_MS["normal"]) -> dict:
    """Both phases against one fresh sidecar (a second for the overload, so the capacity
    backlog leaves nothing behind). Returns the JSON result."""
    result: dict = {"benchmark": "overload", "engine": engine,
                    "simulated": engine == "simulated",
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine_info(),
                    "settings": {"factor": factor, "duration_s": duration_s,
                                 "high_share_of_capacity": high_share,
                                 "high_max_tokens": high_max_tokens, "sla_ms": {
                                     **SLA_MS, "high": high_sla_ms, "normal": normal_sla_ms},
                                 "normal_share_of_rest": normal_share,
                                 "median_tokens": median_tokens, "cap": cap, "seed": seed,
                                 "config": str(config), "extra_args": extra}}
    with tempfile.TemporaryDirectory(prefix="sts-overload-") as tmp:
        def sidecar(name: str, more: tuple[str, ...] = ()) -> SidecarProcess:
            port = free_port()
            args = ["--config", str(config), "--engine", engine, "--metrics-port", str(port),
                    "--sidecar-id", f"overload-{name}", "--set", "server.log_requests=true",
                    *extra, *more]
            proc = SidecarProcess(Path(tmp) / name / "results", args, start_timeout_s=300,
                                  log_path=Path(tmp) / name / "sidecar.log")
            proc.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
            return proc

        if capacity is None:
            _log("capacity: %d normal/low requests as a backlog", capacity_requests)
            slots = SidecarConfig.from_yaml(config).scheduler.max_in_flight
            lift = tuple(x for p in ("normal", "low") for x in (
                "--set", f"scheduler.pools.{p}.max_in_flight={slots}"))
            with sidecar("capacity", lift) as s:
                result["capacity"] = measure_capacity(s, n=capacity_requests,
                                                      median_tokens=median_tokens, cap=cap,
                                                      seed=seed)
            capacity = result["capacity"]["requests_per_s"]
        else:
            result["capacity"] = {"requests_per_s": capacity, "given": True}
        duration_s = max(duration_s, min_high / (high_share * capacity))
        result["settings"]["duration_s"] = round(duration_s, 1)
        _log("capacity %.2f requests/s; offering %.1fx for %.0f s", capacity, factor,
             duration_s)
        reqs = make_requests(capacity=capacity, factor=factor, duration_s=duration_s,
                             high_share=high_share, high_max_tokens=high_max_tokens,
                             high_sla_ms=high_sla_ms, median_tokens=median_tokens, cap=cap,
                             seed=seed, normal_share=normal_share, normal_sla_ms=normal_sla_ms)
        with sidecar("overload") as s:
            assert s.client is not None
            load = send_on_schedule(s.client, reqs, id_prefix="ovl", duration_s=duration_s)
            results = collect(load, s.results_dir, timeout_s=600)
            outcome = report(load, results)
            outcome["preemptions"] = _metric(s.metrics_url,  # type: ignore[attr-defined]
                                             "sts_sidecar_preemptions_total")
            log_path = s.log_path
            outcome["exactly_one_row"] = (outcome["results"] == outcome["sent"] and all(
                sum(p["by_status"].values()) == p["sent"]
                for p in outcome["by_priority"].values()))
        outcome["wait_estimate_error"] = wait_estimate_errors(log_path)
        outcome["order_kept"] = order_kept(outcome)
        result["overload"] = outcome
        if high_only:
            highs = [r for r in reqs if r.priority == "high"]
            _log("high only: the overload's %d high requests alone", len(highs))
            with sidecar("high-only") as s:
                assert s.client is not None
                load = send_on_schedule(s.client, highs, id_prefix="hio",
                                        duration_s=duration_s)
                result["high_only"] = report(load, collect(load, s.results_dir,
                                                           timeout_s=600))
            alone = result["high_only"]["by_priority"]["high"]["on_time"]
            mine = outcome["by_priority"]["high"]["on_time"]
            result["high_vs_high_only"] = round(mine / alone, 3) if alone else None
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if out is not None:
        write_text_atomically(out, json.dumps(result, indent=2, default=str) + "\n")
        _log("wrote %s", out)
    return result


def order_kept(outcome: dict) -> bool:
    """Whether the on-time shares keep ``high`` >= ``normal`` >= ``low`` (priorities
    that were not offered are left out)."""
    rates = [outcome["by_priority"][p]["on_time_rate"] for p in ("high", "normal", "low")
             if p in outcome["by_priority"] and outcome["by_priority"][p]["sent"]]
    return all(a >= b for a, b in zip(rates, rates[1:]))


def format_table(result: dict) -> str:
    """Per-priority outcome, shed shares and the wait-estimate error."""
    o = result["overload"]
    lines = [f"engine {result['engine']}{' (SIMULATED)' if result['simulated'] else ''}; "
             f"capacity {result['capacity']['requests_per_s']} requests/s; "
             f"offered {result['settings']['factor']}x for {result['settings']['duration_s']} s",
             f"{'priority':<8} {'sent':>5} {'on time':>8} {'rate':>7} {'ok p50 ms':>9} "
             f"{'ok p99 ms':>9} {'shed share':>10}  shed by reason"]
    for prio, p in o["by_priority"].items():
        rate = "-" if p["on_time_rate"] is None else f"{p['on_time_rate']:.1%}"
        lines.append(f"{prio:<8} {p['sent']:>5} {p['on_time']:>8} {rate:>7} "
                     f"{p['ok_latency_ms_p50'] or 0:>9.0f} {p['ok_latency_ms_p99'] or 0:>9.0f} "
                     f"{o['shed_share_by_priority'][prio]:>10.0%}  {p['shed_by_reason']}")
    lines.append(f"preemptions {o['preemptions']}; exactly one row per request: "
                 f"{o['exactly_one_row']}; order high >= normal >= low: {o['order_kept']}")
    if "high_only" in result:
        alone = result["high_only"]["by_priority"]["high"]
        lines.append(f"high alone: {alone['on_time']} of {alone['sent']} on time; under "
                     f"overload {result['high_vs_high_only']} of that")
    lines.append("queue-wait estimate error (actual - estimated, ms):")
    for prio, e in o["wait_estimate_error"].items():
        lines.append(f"  {prio:<7} n {e['n']:>5}  p50 {e['p50_ms']:>8.1f}  p99 {e['p99_ms']:>8.1f}"
                     f"  p1 {e['p1_ms']:>8.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: run both phases, print the table, write the JSON result."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overload",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=ENGINES.names, default="simulated")
    parser.add_argument("--config", type=Path, default=REPO / "conf" / "sidecar.yaml")
    parser.add_argument("--factor", type=float, default=10.0, help="offered / capacity")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of overload")
    parser.add_argument("--high-share", type=float, default=0.3,
                        help="high arrivals as a share of capacity (default 0.3)")
    parser.add_argument("--min-high", type=int, default=100,
                        help="run long enough to offer this many high requests (default 100)")
    parser.add_argument("--high-max-tokens", type=int, default=96)
    parser.add_argument("--high-sla-ms", type=int, default=3000)
    parser.add_argument("--normal-share", type=float, default=0.4,
                        help="normal's share of the arrivals that are not high (default 0.4; "
                             "the rest low)")
    parser.add_argument("--normal-sla-ms", type=int, default=SLA_MS["normal"])
    parser.add_argument("--median-tokens", type=int, default=None,
                        help="median max_tokens of normal/low (default 128; 48 for vllm)")
    parser.add_argument("--cap", type=int, default=None,
                        help="longest max_tokens (default 1024; 256 for vllm)")
    parser.add_argument("--capacity-requests", type=int, default=None,
                        help="backlog of the capacity phase (default 150; 60 for vllm)")
    parser.add_argument("--capacity", type=float, default=None,
                        help="skip the capacity phase and use this many requests/s")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra `sts sidecar --set` overrides (repeatable)")
    parser.add_argument("--slow-cpu", action="store_true",
                        help="the simulated engine timed like vLLM on a slow CPU (AVX2 only: "
                             "TPOT 99 ms alone, 154 ms at batch 8; "
                             "sidecar.engines.simulated.SLOW_CPU)")
    parser.add_argument("--high-only", action="store_true",
                        help="also offer the high arrivals alone (a fresh sidecar) and report "
                             "the overload's high on time as a share of that")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON result (default benchmarks/results/overload-ENGINE.json)")
    args = parser.parse_args(argv)
    vllm = args.engine == "vllm"
    extra = [x for kv in args.set for x in ("--set", kv)]
    if args.slow_cpu:
        if vllm:
            parser.error("--slow-cpu times the simulated engine: use --engine simulated")
        from sidecar import SLOW_CPU, simulated_set_args

        extra = simulated_set_args(SLOW_CPU)[2:] + extra
    out = args.out or Path(str(DEFAULT_OUT).format(engine=args.engine))
    try:
        result = run(args.engine, factor=args.factor, duration_s=args.duration,
                     high_share=args.high_share, high_max_tokens=args.high_max_tokens,
                     high_sla_ms=args.high_sla_ms,
                     median_tokens=args.median_tokens or (48 if vllm else 128),
                     cap=args.cap or (256 if vllm else 1024),
                     capacity_requests=args.capacity_requests or (60 if vllm else 150),
                     capacity=args.capacity, seed=args.seed, config=args.config,
                     min_high=args.min_high, extra=extra, out=out,
                     high_only=args.high_only, normal_share=args.normal_share,
                     normal_sla_ms=args.normal_sla_ms)
    except (RuntimeError, TimeoutError, ValueError) as e:
        print(f"overload: {e}", file=sys.stderr)
        return 1
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
