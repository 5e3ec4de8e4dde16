"""Open-loop load against a running sidecar, and a per-priority report of the outcome.

Arrivals are Poisson at ``rate_per_s``, sent in small batches every
``batch_interval_s`` (as Spark executors would send them), with a priority mix,
per-priority SLAs and a long-tailed (log-normal) ``max_tokens``. The report
says, per priority, how many requests finished ``ok`` within their deadline,
how many were shed and why, how many timed out, and whether every request got
exactly one result.

Used by the overload tests and by ``sts bench``.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sidecar.client import SidecarClient
from sidecar.pb.sts.v1 import inference_pb2 as pb
from sidecar.result_reader import wait_for_results

_PRIORITIES = {"high": pb.PRIORITY_HIGH, "normal": pb.PRIORITY_NORMAL, "low": pb.PRIORITY_LOW}


@dataclass
class LoadProfile:
    """What to send."""

    rate_per_s: float
    """Mean arrivals per second (Poisson)."""

    duration_s: float
    """How long to send."""

    priority_mix: dict[str, float] = field(
        default_factory=lambda: {"high": 0.1, "normal": 0.3, "low": 0.6})
    """Share of arrivals per priority (normalised)."""

    sla_ms: dict[str, int] = field(
        default_factory=lambda: {"high": 3000, "normal": 8000, "low": 20_000})
    """Deadline after arrival, per priority."""

    max_tokens_median: float = 48.0
    """Median ``max_tokens`` (log-normal)."""

    max_tokens_sigma: float = 0.8
    """Log-normal shape: 0.8 puts the 99th percentile near 6.4 x the median."""

    max_tokens_cap: int = 512
    """Largest ``max_tokens`` drawn."""

    prompt: str = ("You are a support assistant. Classify the ticket and draft a one-line "
                   "reply.\nTicket #{i}: my order has not arrived yet, what can I do?")
    """Prompt template; ``{i}`` is the arrival number (stable prefix first)."""

    batch_interval_s: float = 0.05
    """Send what arrived every this many seconds."""

    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate_per_s <= 0 or self.duration_s <= 0:
            raise ValueError(f"{self.rate_per_s=} and {self.duration_s=} must be positive")
        if set(self.priority_mix) - set(_PRIORITIES) or set(self.sla_ms) - set(_PRIORITIES):
            raise ValueError("priority_mix and sla_ms keys must be high, normal, low")


@dataclass
class SentRequest:
    request_id: str
    priority: str
    max_tokens: int
    sent_ts: int
    deadline_ts: int
    accepted: bool
    reason: str


@dataclass
class LoadRun:
    """What was sent, plus gauges sampled while sending."""

    sent: list[SentRequest]
    samples: list[dict] = field(default_factory=list)
    """``{"t": seconds, "queued": {...}, "in_flight": {...}, ...}`` every sample."""
    wall_s: float = 0.0


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def send_load(client: SidecarClient, profile: LoadProfile, *, id_prefix: str = "load",
              sample_every_s: float = 0.5,
              on_sample: Callable[[dict], None] | None = None) -> LoadRun:
    """Send ``profile`` to the sidecar behind ``client`` (blocking for ``duration_s``)."""
    rng = np.random.default_rng(profile.seed)
    names = list(profile.priority_mix)
    weights = np.array([profile.priority_mix[n] for n in names], dtype=float)
    weights /= weights.sum()
    sent: list[SentRequest] = []
    run = LoadRun(sent)
    start = time.monotonic()
    next_sample = start
    emitted = 0
    expected = 0.0
    while (elapsed := time.monotonic() - start) < profile.duration_s:
        # Open loop: arrivals owed up to now, however late this tick runs.
        expected_now = profile.rate_per_s * elapsed
        n = int(rng.poisson(max(expected_now - expected, 0.0)))
        expected = expected_now
        batch, meta = [], []
        now = _now_ms()
        for _ in range(n):
            prio = names[int(rng.choice(len(names), p=weights))]
            max_tokens = int(min(profile.max_tokens_cap, max(1, round(
                rng.lognormal(np.log(profile.max_tokens_median), profile.max_tokens_sigma)))))
            rid = f"{id_prefix}-{emitted}"
            deadline = now + profile.sla_ms[prio]
            batch.append(pb.InferenceRequest(
                request_id=rid, trace_id=rid, priority=_PRIORITIES[prio], enqueue_ts=now,
                deadline_ts=deadline, prompt=profile.prompt.format(i=emitted),
                max_tokens=max_tokens, temperature=0.0))
            meta.append((rid, prio, max_tokens, deadline))
            emitted += 1
        if batch:
            acks = client.submit(batch).acks
            for (rid, prio, max_tokens, deadline), ack in zip(meta, acks):
                reason = "" if ack.accepted else \
                    pb.RefusalReason.Name(ack.reason).removeprefix("REFUSAL_REASON_").lower()
                sent.append(SentRequest(rid, prio, max_tokens, now, deadline, ack.accepted,
                                        reason))
        if time.monotonic() >= next_sample:
            next_sample += sample_every_s
            sample = sample_stats(client, time.monotonic() - start)
            run.samples.append(sample)
            if on_sample:
                on_sample(sample)
        time.sleep(profile.batch_interval_s)
    run.wall_s = time.monotonic() - start
    return run


def sample_stats(client: SidecarClient, t: float) -> dict:
    """Queue depth, in-flight and throughput per pool at one instant."""
    st = client.stats()
    name = {v: k for k, v in _PRIORITIES.items()}
    return {
        "t": round(t, 3),
        "queued": {name[p.priority]: p.queued for p in st.pools},
        "in_flight": {name[p.priority]: p.in_flight for p in st.pools},
        "estimated_wait_ms": {name[p.priority]: p.estimated_queue_wait_ms for p in st.pools},
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
    for prio in _PRIORITIES:
        sent = [s for s in run.sent if s.priority == prio]
        rows = [results[s.request_id] for s in sent if s.request_id in results]
        status = collections.Counter(r["status"] for r in rows)
        shed = collections.Counter(r["reason"] for r in rows if r["status"] == "shed")
        on_time = sum(1 for r in rows if r["status"] == "ok" and r["finish_ts"] <= r["deadline_ts"])
        latencies = sorted(r["finish_ts"] - r["received_ts"] for r in rows if r["status"] == "ok")
        out[prio] = {
            "sent": len(sent),
            "results": len(rows),
            "on_time": on_time,
            "on_time_rate": on_time / len(sent) if sent else None,
            "by_status": dict(status),
            "shed_by_reason": dict(shed),
            "ok_latency_ms_p50": latencies[len(latencies) // 2] if latencies else None,
            "ok_latency_ms_p99": latencies[int(len(latencies) * 0.99)] if latencies else None,
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
            p: max((s["queued"][p] for s in run.samples), default=0) for p in _PRIORITIES},
        "wall_s": run.wall_s,
    }
