"""Gateway overhead micro-benchmark: what the sidecar itself costs, per core.

The sidecar runs as a child process pinned to one CPU core, in front of a
``simulated`` engine that absorbs work at once (a 0.01 ms step, no per-sequence
cost, effectively unlimited sequences and KV cache), with every admission limit,
watermark and deadline check out of the way. What is left is the gateway's own
work: gRPC, admission, queueing, dispatch, the per-request engine task and the
Parquet result channel.

Two measurements:

* **Throughput**, per batch size: ``threads`` client threads (in this process,
  pinned to the other cores when there are any) each submit batches back to
  back for ``duration_s`` (closed loop). Reported: requests accepted per second,
  RPCs per second, the ack round trip per RPC and per request (p50/p99), the
  results the sidecar finished per second in the same window, the backlog left
  at its end, and the CPU share the sidecar and the client used.
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
import contextlib
import json
import logging
import math
import os
import platform
import random
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pyarrow.parquet as pq

from sidecar.client import SidecarClient
from sidecar.pb.sts.v1 import inference_pb2 as pb
from sidecar.pb.sts.v1 import inference_pb2_grpc as pb_grpc
from sidecar.process import SidecarProcess
from sidecar.result_reader import wait_for_results

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "gateway_overhead.json"
DEFAULT_BATCH_SIZES = (1, 8, 64, 256)

_PROMPT = "Say hello."
_DEADLINE_MS = 3_600_000
_BIG = 1 << 40
_WARMUP_S = 0.5

#: ``--set`` overrides that make the engine absorb work at once and take every
#: admission limit out of the way (recorded in the JSON result).
SIDECAR_SETTINGS: dict[str, Any] = {
    "engine.simulated.max_num_seqs": 1_000_000,
    "engine.simulated.step_base_ms": 0.01,
    "engine.simulated.step_per_seq_ms": 0.0,
    "engine.simulated.prefill_tokens_per_s": 1e12,
    "engine.simulated.kv_capacity_tokens": _BIG,
    "scheduler.deadline_admission": False,
    "scheduler.load_shedding.queue_depth": {"low": 1_000_000_000, "normal": 1_000_000_000},
    "scheduler.load_shedding.tokens_in_flight": {"low": _BIG, "normal": _BIG},
    **{f"scheduler.pools.{p}.{k}": v for p in ("high", "normal", "low") for k, v in (
        ("max_queued", 100_000_000), ("max_in_flight", 1_000_000),
        ("max_queue_delay_ms", _DEADLINE_MS), ("max_tokens_in_flight", _BIG))},
}
_MAX_IN_FLIGHT = 1_000_000


class BenchmarkError(RuntimeError):
    """The benchmark could not run (sidecar failed to start, died or refused work)."""


def _log(msg: str, *args: object) -> None:
    """One progress line on stderr."""
    print(f"[gateway_overhead] {msg % args if args else msg}", file=sys.stderr, flush=True)


def _now_ms() -> int:
    """Wall clock in epoch milliseconds, floored like the sidecar's ``now_ms``."""
    return time.time_ns() // 1_000_000


def _or_nan(x: float | None) -> float:
    """``x``, or NaN for a missing figure (progress lines only)."""
    return float("nan") if x is None else x


def _percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..1); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _summary(values: list[float], digits: int = 3) -> dict[str, float | None]:
    """Mean, p50, p99 and max of ``values``, rounded."""
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, digits)
    return {"mean": r(sum(values) / len(values) if values else None),
            "p50": r(_percentile(values, 0.5)), "p99": r(_percentile(values, 0.99)),
            "max": r(max(values) if values else None)}


def _pin_threads(cores: set[int]) -> None:
    """Set the CPU affinity of every thread of this process (Linux: per thread)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:  # the thread ended meanwhile
            pass


def _process_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of process ``pid`` (all threads), from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_info() -> dict[str, Any]:
    """CPU count, usable cores, platform and versions (goes into the JSON result)."""
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "usable_cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else None,
        "cpu_model": model,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "grpc": grpc.__version__,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _sidecar_args(workdir: Path) -> list[str]:
    """Flags of the child ``sts sidecar`` (``--listen`` and ``--results-dir`` come from
    :class:`~sidecar.process.SidecarProcess`). An empty config file keeps the
    benchmark independent of ``conf/sidecar.yaml``."""
    config = workdir / "sidecar.yaml"
    config.write_text("# gateway_overhead: built-in defaults plus --set overrides\n")
    args = ["--config", str(config), "--engine", "simulated",
            "--max-in-flight", str(_MAX_IN_FLIGHT), "--sidecar-id", "gateway-bench",
            "--drain-timeout", "5"]
    for key, value in SIDECAR_SETTINGS.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    return args


@contextlib.contextmanager
def pinned_sidecar(workdir: Path, core: int | None) -> Iterator[SidecarProcess]:
    """The benchmark's sidecar, pinned to ``core``, stopped (SIGTERM, then kill) on exit.

    Raises:
        BenchmarkError: It exited before serving or did not serve within 120 s.
    """
    sidecar = SidecarProcess(workdir / "results", _sidecar_args(workdir),
                             start_timeout_s=120.0, stop_timeout_s=15.0,
                             log_path=workdir / "sidecar.log",
                             cpus={core} if core is not None else None)
    try:
        sidecar.__enter__()
    except BaseException as e:
        sidecar.__exit__(None, None, None)
        if isinstance(e, (RuntimeError, TimeoutError)):
            raise BenchmarkError(f"the sidecar did not start: {e}") from e
        raise
    try:
        yield sidecar
    finally:
        sidecar.__exit__(None, None, None)


def _sidecar_cpu_s(sidecar: SidecarProcess) -> float | None:
    """CPU seconds the sidecar process has used so far."""
    return _process_cpu_s(sidecar.proc.pid) if sidecar.proc is not None else None


def _stub(target: str) -> tuple[grpc.Channel, pb_grpc.InferenceStub]:
    """A channel with its own connection (no subchannel shared with other threads)."""
    channel = grpc.insecure_channel(target, options=[
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_send_message_length", 64 * 1024 * 1024)])
    return channel, pb_grpc.InferenceStub(channel)


def _batch(prefix: str, start: int, size: int) -> pb.SubmitBatchRequest:
    """``size`` valid requests (max_tokens=1, short prompt, deadline in an hour)."""
    now = _now_ms()
    return pb.SubmitBatchRequest(requests=[
        pb.InferenceRequest(request_id=f"{prefix}-{i}", trace_id=prefix,
                            priority=pb.PRIORITY_HIGH, enqueue_ts=now,
                            deadline_ts=now + _DEADLINE_MS, prompt=_PROMPT, max_tokens=1)
        for i in range(start, start + size)])


@dataclass
class _LoopResult:
    """What one client thread did in one closed-loop window."""

    rpc_s: list[float] = field(default_factory=list)
    accepted: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    last_done: float = 0.0


def _closed_loop(stub: pb_grpc.InferenceStub, prefix: str, batch_size: int, start: float,
                 end: float) -> _LoopResult:
    """Submit batches back to back from ``start`` until ``end`` (``perf_counter``)."""
    out = _LoopResult()
    time.sleep(max(0.0, start - time.perf_counter()))
    sent = 0
    while time.perf_counter() < end:
        request = _batch(prefix, sent, batch_size)
        sent += batch_size
        t0 = time.perf_counter()
        reply = stub.SubmitBatch(request, timeout=30.0)
        out.last_done = time.perf_counter()
        out.rpc_s.append(out.last_done - t0)
        for ack in reply.acks:
            if ack.accepted:
                out.accepted += 1
            else:
                name = pb.RefusalReason.Name(ack.reason)
                out.refused[name] = out.refused.get(name, 0) + 1
    return out


def _backlog(client: SidecarClient) -> tuple[int, int]:
    """(requests queued or in flight, terminal results so far) from GetStats."""
    st = client.stats()
    return (sum(p.queued + p.in_flight for p in st.pools), sum(st.results_by_status.values()))


def _wait_idle(client: SidecarClient, timeout_s: float = 120.0) -> float:
    """Wait until nothing is queued or in flight; return how long that took."""
    t0 = time.monotonic()
    while _backlog(client)[0]:
        if time.monotonic() - t0 > timeout_s:
            raise BenchmarkError(f"sidecar still busy {timeout_s:.0f} s after the load stopped")
        time.sleep(0.05)
    return time.monotonic() - t0


def _throughput(sidecar: SidecarProcess, stubs: list[pb_grpc.InferenceStub], batch_size: int,
                duration_s: float, tag: str, pool: ThreadPoolExecutor,
                client_cores: int) -> dict[str, Any]:
    """One closed-loop window at ``batch_size``; the figures of that window."""
    assert sidecar.client is not None
    _, results_before = _backlog(sidecar.client)
    start = time.perf_counter() + 0.05
    end = start + duration_s
    futures = [pool.submit(_closed_loop, stub, f"{tag}-t{i}", batch_size, start, end)
               for i, stub in enumerate(stubs)]
    time.sleep(max(0.0, start - time.perf_counter()))
    cpu0, sidecar_cpu0 = time.process_time(), _sidecar_cpu_s(sidecar)
    loops = [f.result() for f in futures]
    wall = max(r.last_done for r in loops) - start
    cpu1, sidecar_cpu1 = time.process_time(), _sidecar_cpu_s(sidecar)
    backlog_end, results_end = _backlog(sidecar.client)
    drain_s = _wait_idle(sidecar.client)

    rpc_ms = [s * 1000.0 for r in loops for s in r.rpc_s]
    accepted = sum(r.accepted for r in loops)
    refused: dict[str, int] = {}
    for r in loops:
        for k, v in r.refused.items():
            refused[k] = refused.get(k, 0) + v
    p50, p99 = _percentile(rpc_ms, 0.5), _percentile(rpc_ms, 0.99)
    sidecar_util = (None if sidecar_cpu0 is None or sidecar_cpu1 is None
                    else round((sidecar_cpu1 - sidecar_cpu0) / wall, 3))
    return {
        "batch_size": batch_size,
        "wall_s": round(wall, 3),
        "rpcs": len(rpc_ms),
        "accepted": accepted,
        "refused": refused,
        "submissions_per_s": round(accepted / wall, 1),
        "rpcs_per_s": round(len(rpc_ms) / wall, 1),
        "ack_ms_per_rpc": {"p50": round(p50, 3), "p99": round(p99, 3)},
        "ack_us_per_request": {"p50": round(p50 * 1000 / batch_size, 2),
                               "p99": round(p99 * 1000 / batch_size, 2)},
        "completed_per_s": round((results_end - results_before) / wall, 1),
        "backlog_at_end": backlog_end,
        "drain_s": round(drain_s, 3),
        "sidecar_cpu_util": sidecar_util,
        "client_cpu_util": round((cpu1 - cpu0) / wall / client_cores, 3),
    }


class _FileWatcher(threading.Thread):
    """Notes when each new result file appears in a directory (polls every ``period_s``)."""

    def __init__(self, directory: Path, period_s: float = 0.001) -> None:
        super().__init__(name="result-file-watcher", daemon=True)
        self.directory = directory
        self.period_s = period_s
        self.known = set(self._names())
        self.seen_ms: dict[str, float] = {}
        self.stopped = threading.Event()

    def _names(self) -> list[str]:
        try:
            return [e.name for e in os.scandir(self.directory)
                    if e.name.endswith(".parquet") and not e.name.startswith(".")]
        except FileNotFoundError:
            return []

    def scan(self) -> None:
        now = time.time() * 1000.0
        for name in self._names():
            if name not in self.known and name not in self.seen_ms:
                self.seen_ms[name] = now

    def run(self) -> None:
        while not self.stopped.is_set():
            self.scan()
            time.sleep(self.period_s)

    def stop(self) -> None:
        self.stopped.set()
        self.join()
        self.scan()


def _added_latency(sidecar: SidecarProcess, stub: pb_grpc.InferenceStub, samples: int,
                   interval_s: float) -> dict[str, Any]:
    """Single-request submits ``interval_s`` apart; latency figures from the result rows."""
    watcher = _FileWatcher(sidecar.results_dir)
    watcher.start()
    sent: dict[str, tuple[int, float]] = {}  # id -> (send ms floored, send ms float)
    rtt_ms: list[float] = []
    try:
        # Up to 1 ms of jitter on each send, so that the millisecond row timestamps
        # are not read at one fixed phase of the clock (which would bias their means).
        jitter = random.Random(0)
        t0 = time.perf_counter()
        for i in range(samples):
            due = t0 + i * interval_s + jitter.uniform(0.0, 0.001)
            time.sleep(max(0.0, due - time.perf_counter()))
            request = _batch("lat", i, 1)
            rid = request.requests[0].request_id
            wall_ns = time.time_ns()
            start = time.perf_counter()
            ack = stub.SubmitBatch(request, timeout=30.0).acks[0]
            rtt_ms.append((time.perf_counter() - start) * 1000.0)
            if not ack.accepted:
                raise BenchmarkError(f"latency request {rid} refused: "
                                     f"{pb.RefusalReason.Name(ack.reason)} {ack.detail}")
            sent[rid] = (wall_ns // 1_000_000, wall_ns / 1e6)
        rows = wait_for_results(sidecar.results_dir, set(sent), timeout_s=30.0)
    finally:
        watcher.stop()
    visible_ms: dict[str, float] = {}
    for name, seen in watcher.seen_ms.items():
        ids = pq.read_table(sidecar.results_dir / name, columns=["request_id"])
        for rid in ids.column("request_id").to_pylist():
            visible_ms[rid] = seen
    statuses: dict[str, int] = {}
    wire, inside, flush, total = [], [], [], []
    for rid, row in rows.items():
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
        send_floor, send_exact = sent[rid]
        wire.append(float(row["received_ts"] - send_floor))
        inside.append(float(row["finish_ts"] - row["received_ts"]))
        if rid in visible_ms:
            flush.append(visible_ms[rid] - row["finish_ts"])
            total.append(visible_ms[rid] - send_exact)
    return {
        "samples": samples,
        "interval_ms": interval_s * 1000.0,
        "statuses": statuses,
        "ack_rtt_ms": _summary(rtt_ms),
        "send_to_received_ms": _summary(wire),
        "received_to_finish_ms": _summary(inside),
        "finish_to_visible_ms": _summary(flush),
        "send_to_visible_ms": _summary(total),
        "visible_samples": len(flush),
    }


def run(duration_s: float, batch_sizes: list[int], threads: int, out: Path | None, *,
        latency_samples: int = 200, latency_interval_s: float = 0.005,
        sidecar_core: int | None = None) -> dict:
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

    Returns:
        ``{"machine", "settings", "throughput": [one dict per batch size],
        "added_latency"}``.

    Raises:
        ValueError: An argument is out of range.
        BenchmarkError: The sidecar failed to start, died, or refused requests.

    Example:
        >>> result = run(1.0, [1, 16], 1, None)  # doctest: +SKIP
        >>> result["throughput"][1]["submissions_per_s"] > 0  # doctest: +SKIP
        True
    """
    if not duration_s > 0:
        raise ValueError(f"{duration_s=} must be > 0")
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ValueError(f"{batch_sizes=} must be a non-empty list of positive sizes")
    if threads < 1 or latency_samples < 1 or latency_interval_s < 0:
        raise ValueError(f"{threads=} and {latency_samples=} must be >= 1, "
                         f"{latency_interval_s=} >= 0")
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
        "request": {"prompt": _PROMPT, "max_tokens": 1, "priority": "high",
                    "deadline_in_ms": _DEADLINE_MS},
        "latency_samples": latency_samples, "latency_interval_ms": latency_interval_s * 1000,
        "warmup_s": _WARMUP_S, "sidecar_max_in_flight": _MAX_IN_FLIGHT,
        "sidecar_settings": SIDECAR_SETTINGS,
    }
    result: dict[str, Any] = {"benchmark": "gateway_overhead",
                              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                              "machine": machine_info(), "settings": settings}
    with tempfile.TemporaryDirectory(prefix="sts-gateway-bench-") as tmp:
        _log("starting the sidecar pinned to core %d (client cores %s)", core,
             sorted(client_cores))
        with pinned_sidecar(Path(tmp), core) as sidecar, \
                ThreadPoolExecutor(threads, thread_name_prefix="bench-client") as pool:
            assert sidecar.client is not None
            _log("sidecar serving on %s", sidecar.target)
            channels = [_stub(sidecar.target) for _ in range(threads)]
            stubs = [stub for _, stub in channels]
            try:
                _pin_threads(client_cores)
                _log("warm-up %.1f s", _WARMUP_S)
                _throughput(sidecar, stubs, 8, _WARMUP_S, "warm", pool, len(client_cores))
                time.sleep(0.3)  # let the warm-up's results reach disk
                _log("added latency: %d single-request submits %.0f ms apart", latency_samples,
                     latency_interval_s * 1000)
                result["added_latency"] = lat = _added_latency(
                    sidecar, stubs[0], latency_samples, latency_interval_s)
                _log("  ack rtt p50 %.3f ms, received->finish mean %.2f ms, "
                     "finish->visible mean %.1f ms", lat["ack_rtt_ms"]["p50"],
                     lat["received_to_finish_ms"]["mean"],
                     _or_nan(lat["finish_to_visible_ms"]["mean"]))
                result["throughput"] = []
                for size in batch_sizes:
                    _log("batch %d: %d thread(s) for %.1f s", size, threads, duration_s)
                    _pin_threads(client_cores)
                    row = _throughput(sidecar, stubs, size, duration_s, f"b{size}", pool,
                                      len(client_cores))
                    if row["refused"]:
                        raise BenchmarkError(f"batch {size}: sidecar refused requests "
                                             f"{row['refused']}; the engine is not absorbing")
                    result["throughput"].append(row)
                    _log("  %.0f req/s, %.0f rpc/s, ack p50 %.3f ms, completed %.0f/s, "
                         "sidecar cpu %s", row["submissions_per_s"], row["rpcs_per_s"],
                         row["ack_ms_per_rpc"]["p50"], row["completed_per_s"],
                         row["sidecar_cpu_util"])
            except grpc.RpcError as e:
                raise BenchmarkError(f"RPC to the sidecar failed: {e.code()} {e.details()}. "
                                     f"Sidecar log:\n{sidecar.tail_log()}") from e
            finally:
                for channel, _ in channels:
                    channel.close()
                _pin_threads(original)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        _log("wrote %s", out)
    return result


def format_table(result: dict) -> str:
    """The throughput rows and the added-latency figures as a small text table."""
    lines = [f"{'batch':>5} {'req/s':>9} {'rpc/s':>8} {'ack p50 ms':>10} {'ack p99 ms':>10} "
             f"{'us/req p50':>10} {'us/req p99':>10} {'done/s':>9} {'backlog':>7} "
             f"{'sidecar cpu':>11} {'client cpu':>10}"]
    for r in result["throughput"]:
        cpu = "-" if r["sidecar_cpu_util"] is None else f"{r['sidecar_cpu_util']:.0%}"
        lines.append(
            f"{r['batch_size']:>5} {r['submissions_per_s']:>9.0f} {r['rpcs_per_s']:>8.0f} "
            f"{r['ack_ms_per_rpc']['p50']:>10.3f} {r['ack_ms_per_rpc']['p99']:>10.3f} "
            f"{r['ack_us_per_request']['p50']:>10.1f} {r['ack_us_per_request']['p99']:>10.1f} "
            f"{r['completed_per_s']:>9.0f} {r['backlog_at_end']:>7} {cpu:>11} "
            f"{r['client_cpu_util']:>10.0%}")
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
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"JSON result (default {DEFAULT_OUT.relative_to(REPO)})")
    args = parser.parse_args(argv)
    try:
        result = run(args.duration, args.batch_sizes, args.threads, args.out,
                     latency_samples=args.latency_samples,
                     latency_interval_s=args.latency_interval_ms / 1000.0,
                     sidecar_core=args.sidecar_core)
    except (BenchmarkError, ValueError) as e:
        print(f"gateway_overhead: {e}", file=sys.stderr)
        return 1
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
