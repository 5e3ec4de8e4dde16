"""Open-loop load against a running sidecar, and a per-priority report of the outcome.

Requests come from :func:`benchmarks.generate.generate` (arrival times, priority
mix, SLAs, long-tailed ``max_tokens``); :func:`send_on_schedule` submits each one
when it falls due, in small batches every ``tick_s`` (as Spark executors would),
however late a tick runs. ``enqueue_ts`` is the scheduled arrival, so latency is
measured from when a request was offered. :func:`report` says, per priority, how
many finished ``ok`` within their deadline, how many were shed and why, and
whether every request got exactly one result.

Used by ``sts bench`` (the ``engine`` scheme) and by the overload tests.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.generate import GeneratedRequest, generate
from sts_capacity.profiles import TrafficProfile
from sidecar import percentile
from sidecar.client import SidecarClient
from sidecar.contract import Priority, now_ms
from sidecar.pb.sts.v1 import inference_pb2 as pb
from sts_harness.result_check import wait_for_results

#: Wire value of each priority name, highest first.
PRIORITIES: dict[str, int] = {str(p): p.value for p in Priority}


@dataclass
class SentRequest:
    """One submitted request and its ack."""

    request_id: str
    priority: str
    max_tokens: int
    enqueue_ts: int
    deadline_ts: int
    accepted: bool
    reason: str


@dataclass
class LoadRun:
    """What was sent, plus sidecar gauges sampled while sending."""

    sent: list[SentRequest]
    samples: list[dict] = field(default_factory=list)
    """``{"t": seconds, "queued": {...}, "in_flight": {...}, ...}`` every sample."""
    start_ms: int = 0
    wall_s: float = 0.0


def _reason(ack: pb.SubmitAck) -> str:
    return "" if ack.accepted else \
        pb.RefusalReason.Name(ack.reason).removeprefix("REFUSAL_REASON_").lower()


def send_on_schedule(client: SidecarClient, requests: list[GeneratedRequest], *,
                     id_prefix: str, duration_s: float | None = None, tick_s: float = 0.05,
                     sample_every_s: float = 0.5,
                     on_sample: Callable[[dict, int], None] | None = None) -> LoadRun:
    """Submit ``requests`` as they fall due (blocking until the last is sent and at
    least ``duration_s`` has passed).

    Args:
        client: The sidecar.
        requests: From :func:`benchmarks.generate.generate`.
        id_prefix: ``request_id`` is ``f"{id_prefix}-{index}"`` (unique per run).
        duration_s: Keep going at least this long (default: the last arrival).
        tick_s: How often due requests are sent, as one ``SubmitBatch``.
        sample_every_s: How often the sidecar's pool gauges are sampled.
        on_sample: Called with each sample and the number sent so far.
    """
    pending = sorted(requests, key=lambda r: r.arrival_s)
    duration_s = duration_s if duration_s is not None else \
        (pending[-1].arrival_s if pending else 0.0)
    run = LoadRun(sent=[], start_ms=now_ms())
    start = time.monotonic()
    next_sample = start
    i = 0
    while i < len(pending) or time.monotonic() - start < duration_s:
        elapsed = time.monotonic() - start
        batch, meta = [], []
        while i < len(pending) and pending[i].arrival_s <= elapsed:
            r = pending[i]
            at = run.start_ms + round(r.arrival_s * 1000)
            rid = f"{id_prefix}-{r.index}"
            batch.append(pb.InferenceRequest(
                request_id=rid, trace_id=rid, priority=PRIORITIES[r.priority], enqueue_ts=at,
                deadline_ts=at + r.sla_ms, prompt=r.prompt, max_tokens=r.max_tokens))
            meta.append((rid, r, at))
            i += 1
        if batch:
            for (rid, r, at), ack in zip(meta, client.submit(batch).acks):
                run.sent.append(SentRequest(rid, r.priority, r.max_tokens, at, at + r.sla_ms,
                                            ack.accepted, _reason(ack)))
        if time.monotonic() >= next_sample:
            next_sample += sample_every_s
            sample = sample_stats(client, time.monotonic() - start)
            run.samples.append(sample)
            if on_sample:
                on_sample(sample, len(run.sent))
        time.sleep(tick_s)
    run.wall_s = time.monotonic() - start
    return run


def send_load(client: SidecarClient, profile: TrafficProfile, duration_s: float, *,
              seed: int = 0, id_prefix: str = "load", sample_every_s: float = 0.5) -> LoadRun:
    """Generate ``duration_s`` seconds of ``profile`` and send it on schedule."""
    return send_on_schedule(client, generate(profile, duration_s, seed=seed),
                            id_prefix=id_prefix, duration_s=duration_s,
                            sample_every_s=sample_every_s)


def sample_stats(client: SidecarClient, t: float) -> dict:
    """Queue depth, in-flight and estimated wait per pool, and throughput, at one instant."""
    st = client.stats()
    pools = {str(Priority(p.priority)): p for p in st.pools}
    return {
        "t": round(t, 3),
        "queued": {name: p.queued for name, p in pools.items()},
        "in_flight": {name: p.in_flight for name, p in pools.items()},
        "estimated_wait_ms": {name: p.estimated_queue_wait_ms for name, p in pools.items()},
        "output_tokens_per_s": st.output_tokens_per_s,
    }


def collect(run: LoadRun, results_dir: str | Path, timeout_s: float = 120.0) -> dict[str, dict]:
    """Wait for one result per sent request; fails if any has two or none."""
    return wait_for_results(Path(results_dir), {s.request_id for s in run.sent}, timeout_s)


def report(run: LoadRun, results: dict[str, dict]) -> dict:
    """Per-priority outcome of a run.

    ``on_time`` counts results ``ok`` with ``finish_ts <= deadline_ts``;
    ``on_time_rate`` is over everything sent of that priority (a shed request
    counts as not on time).
    """
    out: dict[str, dict] = {}
    for prio in PRIORITIES:
        sent = [s for s in run.sent if s.priority == prio]
        rows = [results[s.request_id] for s in sent if s.request_id in results]
        status = collections.Counter(r["status"] for r in rows)
        shed = collections.Counter(r["reason"] for r in rows if r["status"] == "shed")
        on_time = sum(1 for r in rows if r["status"] == "ok" and r["finish_ts"] <= r["deadline_ts"])
        latencies = [r["finish_ts"] - r["received_ts"] for r in rows if r["status"] == "ok"]
        out[prio] = {
            "sent": len(sent),
            "results": len(rows),
            "on_time": on_time,
            "on_time_rate": on_time / len(sent) if sent else None,
            "by_status": dict(status),
            "shed_by_reason": dict(shed),
            "ok_latency_ms_p50": percentile(latencies, 50),
            "ok_latency_ms_p99": percentile(latencies, 99),
        }
    total_shed = sum(sum(v["shed_by_reason"].values()) for v in out.values())
    return {
        "by_priority": out,
        "sent": len(run.sent),
        "results": len(results),
        "shed": total_shed,
        "shed_share_by_priority": {
            p: (sum(v["shed_by_reason"].values()) / total_shed if total_shed else 0.0)
            for p, v in out.items()},
        "max_queued_seen": {
            p: max((s["queued"][p] for s in run.samples), default=0) for p in PRIORITIES},
        "wall_s": run.wall_s,
    }
