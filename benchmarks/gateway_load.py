"""The load of the gateway overhead benchmark, and the figures it yields.

Two measurements against a running sidecar:

* :func:`throughput`: client threads submit batches back to back for a window
  (closed loop); requests and RPCs per second, ack round trips, results finished,
  backlog, CPU shares.
* :func:`added_latency`: single-request submits a few milliseconds apart; the
  time on the wire, inside the sidecar, and until the result is visible on disk.

Every request is valid and cheap: a short prompt, ``max_tokens=1``, priority
``high`` and a deadline an hour away.

Example:
    >>> batch = make_batch("doc", 0, 2)
    >>> [r.request_id for r in batch.requests], batch.requests[0].max_tokens
    (['doc-0', 'doc-1'], 1)
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
import pyarrow.parquet as pq

from benchmarks.cpu_accounting import process_cpu_s
from benchmarks.gateway_sidecar import DEADLINE_MS, BenchmarkError
from benchmarks.result_watcher import ResultFileWatcher
from sidecar import percentile
from sidecar.client import SidecarClient
from sidecar.contract import now_ms
from sidecar.pb.sts.v1 import inference_pb2 as pb
from sidecar.pb.sts.v1 import inference_pb2_grpc as pb_grpc
from sts_harness.process import SidecarProcess
from sts_harness.result_check import wait_for_results

PROMPT = "Say hello."
"""The prompt of every benchmark request."""


def _summary(values: list[float], digits: int = 3) -> dict[str, float | None]:
    """Mean, p50, p99 and max of ``values``, rounded (all ``None`` for no values).

    Example:
        >>> _summary([1.0, 2.0, 3.0, 10.0])
        {'mean': 4.0, 'p50': 2.5, 'p99': 9.79, 'max': 10.0}
    """
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, digits)
    return {"mean": r(sum(values) / len(values) if values else None),
            "p50": r(percentile(values, 50)), "p99": r(percentile(values, 99)),
            "max": r(max(values) if values else None)}


def make_stub(target: str) -> tuple[grpc.Channel, pb_grpc.InferenceStub]:
    """A channel with its own connection (no subchannel shared with other threads)."""
    channel = grpc.insecure_channel(target, options=[
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_send_message_length", 64 * 1024 * 1024)])
    return channel, pb_grpc.InferenceStub(channel)


def make_batch(prefix: str, start: int, size: int) -> pb.SubmitBatchRequest:
    """``size`` valid requests ``{prefix}-{start}`` onwards (max_tokens=1, short prompt,
    deadline in an hour)."""
    now = now_ms()
    return pb.SubmitBatchRequest(requests=[
        pb.InferenceRequest(request_id=f"{prefix}-{i}", trace_id=prefix,
                            priority=pb.PRIORITY_HIGH, enqueue_ts=now,
                            deadline_ts=now + DEADLINE_MS, prompt=PROMPT, max_tokens=1)
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
        request = make_batch(prefix, sent, batch_size)
        sent += batch_size
        t0 = time.perf_counter()
        reply = stub.SubmitBatch(request, timeout=30.0)
        out.last_done = time.perf_counter()
        out.rpc_s.append(out.last_done - t0)
        for ack in reply.acks:
            if ack.duplicate:  # a replayed id costs no engine work: never counted
                out.refused["DUPLICATE"] = out.refused.get("DUPLICATE", 0) + 1
            elif ack.accepted:
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


def _sidecar_cpu_s(sidecar: SidecarProcess) -> float | None:
    """CPU seconds the sidecar process has used so far."""
    return process_cpu_s(sidecar.proc.pid) if sidecar.proc is not None else None


def throughput(sidecar: SidecarProcess, stubs: list[pb_grpc.InferenceStub], batch_size: int,
               duration_s: float, tag: str, pool: ThreadPoolExecutor,
               client_cores: int) -> dict[str, Any]:
    """One closed-loop window at ``batch_size``, one thread of ``pool`` per stub; the
    figures of that window (one ``throughput`` row of the JSON result)."""
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
    sidecar_cpu_idle = _sidecar_cpu_s(sidecar)  # the backlog's work included

    rpc_ms = [s * 1000.0 for r in loops for s in r.rpc_s]
    accepted = sum(r.accepted for r in loops)
    refused: dict[str, int] = {}
    for r in loops:
        for k, v in r.refused.items():
            refused[k] = refused.get(k, 0) + v
    p50, p99 = percentile(rpc_ms, 50), percentile(rpc_ms, 99)
    sidecar_util = (None if sidecar_cpu0 is None or sidecar_cpu1 is None
                    else round((sidecar_cpu1 - sidecar_cpu0) / wall, 3))
    # CPU per request from the window's start until the sidecar is idle again: robust
    # to a busy machine, unlike wall-clock rates (clock ticks: 10 ms resolution).
    sidecar_us = (None if sidecar_cpu0 is None or sidecar_cpu_idle is None or not accepted
                  else round((sidecar_cpu_idle - sidecar_cpu0) / accepted * 1e6, 1))
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
        "sidecar_cpu_us_per_request": sidecar_us,
        "client_cpu_util": round((cpu1 - cpu0) / wall / client_cores, 3),
    }


def added_latency(sidecar: SidecarProcess, stub: pb_grpc.InferenceStub, samples: int,
                  interval_s: float) -> dict[str, Any]:
    """Single-request submits ``interval_s`` apart; latency figures from the result rows
    (the ``added_latency`` part of the JSON result).

    Send times, row timestamps and the time a result file became visible are all epoch
    milliseconds from the same floored clock, so every difference has 1 ms resolution;
    the ack round trip is timed with ``perf_counter``.

    Raises:
        BenchmarkError: The sidecar refused one of the requests.
    """
    watcher = ResultFileWatcher(sidecar.results_dir)
    watcher.start()
    sent_ms: dict[str, int] = {}
    rtt_ms: list[float] = []
    try:
        # Up to 1 ms of jitter on each send, so that the millisecond row timestamps
        # are not read at one fixed phase of the clock (which would bias their means).
        jitter = random.Random(0)
        t0 = time.perf_counter()
        for i in range(samples):
            due = t0 + i * interval_s + jitter.uniform(0.0, 0.001)
            time.sleep(max(0.0, due - time.perf_counter()))
            request = make_batch("lat", i, 1)
            rid = request.requests[0].request_id
            sent = now_ms()
            start = time.perf_counter()
            ack = stub.SubmitBatch(request, timeout=30.0).acks[0]
            rtt_ms.append((time.perf_counter() - start) * 1000.0)
            if not ack.accepted:
                raise BenchmarkError(f"latency request {rid} refused: "
                                     f"{pb.RefusalReason.Name(ack.reason)} {ack.detail}")
            sent_ms[rid] = sent
        rows = wait_for_results(sidecar.results_dir, set(sent_ms), timeout_s=30.0)
    finally:
        watcher.stop()
    visible_ms: dict[str, int] = {}
    for name, seen in watcher.seen_ms.items():
        ids = pq.read_table(sidecar.results_dir / name, columns=["request_id"])
        for rid in ids.column("request_id").to_pylist():
            visible_ms[rid] = seen
    statuses: dict[str, int] = {}
    wire, inside, flush, total = [], [], [], []
    for rid, row in rows.items():
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
        wire.append(float(row["received_ts"] - sent_ms[rid]))
        inside.append(float(row["finish_ts"] - row["received_ts"]))
        if rid in visible_ms:
            flush.append(float(visible_ms[rid] - row["finish_ts"]))
            total.append(float(visible_ms[rid] - sent_ms[rid]))
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
