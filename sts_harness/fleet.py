"""A GPU fleet in virtual time (issue 64): how an autoscaling policy
(:mod:`sts_harness.autoscalers`) does on a traffic, in GPU-seconds and in requests
answered within their deadline, against an oracle; an hour of traffic over 8-64 GPUs
takes seconds to minutes.

The fleet is a model, kept simple where the policies cannot tell the difference:

- **A GPU** is a continuous-batching engine with ``batch`` slots (the simulated engine's
  timing, :class:`~sidecar.engines.simulated.SimulatedEngineConfig`): a request holds one
  slot for its output tokens at the full batch's time per token. Its capacity is what the
  scale signal measures, ``batch / TPOT(batch)`` output tokens/s: the GPU the capacity
  formula counts (prompts' prefill is left out, as the formula leaves it out; the
  sidecar's measured TPOT carries it on a real engine), so the policies are compared on
  their reactions, not on the formula's error.
- **The fleet** pools its GPUs' slots (a router that always finds a free slot where
  there is one). Waiting requests take free slots ``high`` first, then ``normal``, then
  ``low``, each in arrival order; a request whose deadline can no longer be met when a
  slot frees for it is shed (the rule fallback) and counts as missed. A request that
  could not meet its deadline even alone on an idle GPU is *out of reach* and counted
  apart (no policy can serve it).
- **Scaling**: a GPU asked for serves after ``cold_start_s`` and is billed from the ask;
  a GPU released takes no new request, finishes the ones it holds (billed while it
  does), then goes. A policy is asked every ``interval_s`` seconds what the fleet should
  have.
- **The signal** sts-spark's controller reads is the sidecars' own
  (:func:`sidecar.compute_scale_signal` over a :class:`~sidecar.DemandMeter`
  on the virtual clock): the last 60 s of arrivals' output tokens plus the queued tokens.

The **oracle** (:func:`oracle_gpus`) knows the load in advance and scales instantly: at
each second, the GPUs the capacity formula gives for the output tokens that arrive over
the next 60 s; its GPU-seconds are that series' sum.
"""

from __future__ import annotations

import collections
import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from sidecar import DemandMeter, SimulatedEngineConfig, compute_scale_signal, desired_gpus
from sidecar.contract import Priority
from sts_harness.autoscalers import Autoscaler, FleetView

#: Seconds of arrivals the sidecars' scale signal measures demand over (its own default).
WINDOW_S = DemandMeter().window_s

#: Priorities in the order waiting requests take free slots.
PRIORITY_ORDER = ("high", "normal", "low")
_SIGNAL_PRIORITY = (Priority.HIGH, Priority.NORMAL, Priority.LOW)


@dataclass(frozen=True)
class GpuModel:
    """One GPU of the fleet: its engine's timing, the share of it the capacity formula
    plans to use, and how long a new one takes to serve."""

    engine: SimulatedEngineConfig = field(
        default_factory=lambda: SimulatedEngineConfig(max_num_seqs=32))
    """The engine's timing (default: ``conf/sidecar-gpu-sim.yaml``'s, an 8B model on an
    H100-class GPU, 32 sequences at once: ~2,200 output tokens/s)."""
    target_utilisation: float = 0.7
    """The scale signal's (``scheduler.target_utilisation``)."""
    cold_start_s: float = 60.0
    """From the ask to serving: a node's executor, its Python workers, the sidecar and
    the model's weights."""

    @property
    def batch(self) -> int:
        return self.engine.max_num_seqs

    @property
    def tpot_s(self) -> float:
        """Seconds per output token at the full batch."""
        return self.engine.step_seconds(self.batch)

    @property
    def capacity_tokens_per_s(self) -> float:
        """Output tokens/s at the full batch (what the scale signal measures)."""
        return self.batch / self.tpot_s

    def gpus_for(self, demand_tokens_per_s: float) -> float:
        """The capacity formula: GPUs for a demand (unrounded)."""
        return desired_gpus(demand_tokens_per_s, self.capacity_tokens_per_s,
                            self.target_utilisation)


@dataclass(frozen=True)
class Traffic:
    """Requests in arrival order, as arrays (a fleet's hour is millions of them)."""

    name: str
    arrival_s: np.ndarray
    """Seconds from the start, ascending."""
    priority: np.ndarray
    """Index into :data:`PRIORITY_ORDER`."""
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    sla_s: tuple[float, float, float]
    """Deadline after arrival per priority, in :data:`PRIORITY_ORDER`."""

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if not all(len(a) == n for a in (self.priority, self.input_tokens,
                                         self.output_tokens)):
            raise ValueError(f"traffic {self.name}: its arrays differ in length")
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise ValueError(f"traffic {self.name}: arrivals must be in order")

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self.arrival_s) else 0.0

    def tokens_per_second(self) -> np.ndarray:
        """Output tokens arriving in each second ``[t, t + 1)``."""
        seconds = int(math.ceil(self.duration_s)) + 1
        return np.bincount(self.arrival_s.astype(np.int64), weights=self.output_tokens,
                           minlength=seconds)


def overlay(name: str, arrival_s: np.ndarray, input_tokens: np.ndarray,
            output_tokens: np.ndarray, *, copies: int, jitter_s: float,
            priority_mix: dict[str, float], sla_ms: dict[str, int], seed: int = 0
            ) -> Traffic:
    """A trace's traffic ``copies`` times over, each copy's arrivals moved by a random
    ``[0, jitter_s)`` each (within the trace's span): the rate is ``copies`` times the
    trace's, its shape over minutes (what an autoscaler sees) and its bursts kept, its
    length too. Priorities drawn by ``priority_mix``.

    Example:
        >>> t = overlay("t", np.array([0.0, 10.0]), np.array([5, 5]), np.array([3, 4]),
        ...             copies=3, jitter_s=1.0, priority_mix={"high": 1.0},
        ...             sla_ms={"high": 3000, "normal": 8000, "low": 30000})
        >>> len(t.arrival_s), int(t.output_tokens.sum()), t.sla_s
        (6, 21, (3.0, 8.0, 30.0))
    """
    rng = np.random.default_rng(seed)
    span = float(arrival_s.max()) if len(arrival_s) else 0.0
    arrivals = np.concatenate([np.minimum(arrival_s + rng.uniform(0, jitter_s, len(arrival_s)),
                                          span) for _ in range(copies)])
    order = np.argsort(arrivals, kind="stable")
    names = [p for p in PRIORITY_ORDER if priority_mix.get(p, 0) > 0]
    shares = np.array([priority_mix[p] for p in names], dtype=float)
    drawn = rng.choice(len(names), size=len(arrivals), p=shares / shares.sum())
    priority = np.array([PRIORITY_ORDER.index(p) for p in names])[drawn]
    return Traffic(name, arrivals[order], priority[order],
                   np.tile(input_tokens, copies)[order], np.tile(output_tokens, copies)[order],
                   tuple(sla_ms[p] / 1000.0 for p in PRIORITY_ORDER))


def oracle_gpus(traffic: Traffic, gpu: GpuModel, *, window_s: float = WINDOW_S,
                min_gpus: int = 1, max_gpus: int | None = None) -> np.ndarray:
    """The oracle's GPUs at each second ``t``: the capacity formula for the output tokens
    arriving over ``[t, t + window_s)``, rounded up, within ``min_gpus``-``max_gpus``.

    Example:
        >>> gpu = GpuModel()
        >>> per_s = round(gpu.capacity_tokens_per_s * gpu.target_utilisation * 2.5)
        >>> t = Traffic("t", np.arange(120.0), np.zeros(120, int), np.zeros(120, int),
        ...             np.full(120, per_s), (3.0, 8.0, 30.0))
        >>> g = oracle_gpus(t, gpu)
        >>> int(g[0]), int(g[90]), int(g[-1])
        (3, 2, 1)
    """
    w = int(window_s)
    per_second = traffic.tokens_per_second()
    cumulative = np.concatenate([[0.0], np.cumsum(per_second), np.zeros(w)])
    cumulative[len(per_second) + 1:] = cumulative[len(per_second)]
    ahead = (cumulative[w:w + len(per_second)] - cumulative[:len(per_second)]) / w
    gpus = np.ceil(ahead / (gpu.capacity_tokens_per_s * gpu.target_utilisation) - 1e-9)
    return np.clip(gpus, min_gpus, max_gpus if max_gpus is not None else None).astype(int)


@dataclass
class FleetRun:
    """What one policy did on one traffic."""

    policy: str
    gpu_seconds: float
    requests: int
    out_of_reach: int
    """Requests that could not meet their deadline even alone on an idle GPU."""
    within_sla: dict[str, float]
    """Per priority: the share of requests within reach answered by their deadline."""
    shed: int
    actions: int
    """Changes of the GPUs asked for."""
    peak_gpus: int
    gpus_per_minute: list[float] = field(default_factory=list)
    """GPUs billed, averaged over each minute."""

    def as_dict(self) -> dict:
        return {"policy": self.policy, "gpu_seconds": round(self.gpu_seconds, 1),
                "requests": self.requests, "out_of_reach": self.out_of_reach,
                "within_sla": {p: round(v, 4) for p, v in self.within_sla.items()},
                "shed": self.shed, "actions": self.actions, "peak_gpus": self.peak_gpus,
                "gpus_per_minute": [round(g, 2) for g in self.gpus_per_minute]}


class _Fleet:
    """The pooled slots, the waiting queues and the GPUs' states (see the module doc)."""

    def __init__(self, traffic: Traffic, gpu: GpuModel, initial_gpus: int) -> None:
        self.traffic, self.gpu = traffic, gpu
        self.serving = initial_gpus
        self.starting: list[float] = []
        """Ready times of the GPUs starting."""
        self.running = 0
        self.finishing: list[float] = []
        self.waiting = [collections.deque() for _ in PRIORITY_ORDER]
        self.waiting_tokens = 0.0
        self.service_s = traffic.output_tokens * gpu.tpot_s
        self.deadline_s = traffic.arrival_s + np.asarray(traffic.sla_s)[traffic.priority]
        self.in_reach = self.service_s <= np.asarray(traffic.sla_s)[traffic.priority]
        self.answered = [0, 0, 0]
        self.shed = 0

    @property
    def slots(self) -> int:
        return self.serving * self.gpu.batch

    @property
    def billed(self) -> int:
        draining = math.ceil(max(0, self.running - self.slots) / self.gpu.batch)
        return self.serving + len(self.starting) + draining

    def arrive(self, i: int, now: float) -> None:
        self.waiting[int(self.traffic.priority[i])].append(i)
        self.waiting_tokens += float(self.traffic.output_tokens[i])
        self.dispatch(now)

    def shed_late(self, now: float) -> None:
        """Shed the oldest waiting requests whose deadline can no longer be met (the
        sidecar's queues do not keep them either)."""
        for queue in self.waiting:
            while queue and now + self.service_s[queue[0]] > self.deadline_s[queue[0]]:
                self.waiting_tokens -= float(self.traffic.output_tokens[queue.popleft()])
                self.shed += 1

    def finish(self, now: float) -> None:
        self.running -= 1
        self.dispatch(now)

    def dispatch(self, now: float) -> None:
        tokens = self.traffic.output_tokens
        while self.running < self.slots:
            queue = next((q for q in self.waiting if q), None)
            if queue is None:
                return
            i = queue.popleft()
            self.waiting_tokens -= float(tokens[i])
            if now + self.service_s[i] > self.deadline_s[i]:
                self.shed += 1
                continue
            self.running += 1
            heapq.heappush(self.finishing, now + float(self.service_s[i]))
            self.answered[int(self.traffic.priority[i])] += 1

    def scale_to(self, target: int, now: float) -> None:
        have = self.serving + len(self.starting)
        if target > have:
            self.starting.extend([now + self.gpu.cold_start_s] * (target - have))
            self.starting.sort()
        while target < self.serving + len(self.starting) and self.starting:
            self.starting.pop()  # the latest asked for goes first
        self.serving = min(self.serving, max(target, 0))

    def start_ready(self, now: float) -> None:
        ready = sum(1 for t in self.starting if t <= now)
        if ready:
            del self.starting[:ready]
            self.serving += ready
            self.dispatch(now)


def simulate(traffic: Traffic, gpu: GpuModel, policy: Autoscaler, *, initial_gpus: int,
             tail_s: float | None = None) -> FleetRun:
    """Run ``policy`` over ``traffic`` from ``initial_gpus`` serving GPUs, one virtual
    second at a time, until every request has ended (``tail_s`` after the last arrival;
    default the longest deadline).

    Example:
        >>> from sts_harness.autoscalers import StaticScaler
        >>> t = Traffic("t", np.arange(0.0, 60.0, 0.5), np.zeros(120, int),
        ...             np.full(120, 100), np.full(120, 50), (3.0, 8.0, 30.0))
        >>> run = simulate(t, GpuModel(), StaticScaler(1), initial_gpus=1)
        >>> run.within_sla["high"], run.gpu_seconds, run.actions
        (1.0, 91.0, 0)
    """
    fleet = _Fleet(traffic, gpu, initial_gpus)
    clock = [0.0]
    meter = DemandMeter(window_s=WINDOW_S, clock=lambda: clock[0])
    arrivals, n = traffic.arrival_s, len(traffic.arrival_s)
    end = int(math.ceil(traffic.duration_s + (tail_s if tail_s is not None
                                               else max(traffic.sla_s)))) + 1
    i, billed, actions, peak = 0, 0.0, 0, initial_gpus
    per_minute: list[float] = []
    for second in range(end):
        now = float(second)
        clock[0] = now
        fleet.shed_late(now)
        fleet.start_ready(now)
        if second % policy.interval_s == 0:
            view = FleetView(now=now, provisioned=fleet.serving + len(fleet.starting),
                             serving=fleet.serving, waiting=sum(map(len, fleet.waiting)),
                             running=fleet.running,
                             signal=lambda: _signal(meter, fleet))
            target = policy.target(view)
            if target != view.provisioned:
                actions += 1
                fleet.scale_to(target, now)
                fleet.start_ready(now)
        arrived = [0.0, 0.0, 0.0]
        counts = [0, 0, 0]
        until = now + 1.0
        finishing = fleet.finishing
        while True:
            next_arrival = arrivals[i] if i < n else math.inf
            next_finish = finishing[0] if finishing else math.inf
            if min(next_arrival, next_finish) >= until:
                break
            if next_finish <= next_arrival:
                heapq.heappop(finishing)
                fleet.finish(next_finish)
            else:
                p = int(traffic.priority[i])
                arrived[p] += float(traffic.output_tokens[i])
                counts[p] += 1
                fleet.arrive(i, float(next_arrival))
                i += 1
        clock[0] = until
        for p, tokens in enumerate(arrived):
            if counts[p]:
                meter.arrived(_SIGNAL_PRIORITY[p], tokens=tokens, requests=counts[p],
                              refused=0)
        billed += fleet.billed
        peak = max(peak, fleet.billed)
        if second % 60 == 0:
            per_minute.append(0.0)
        per_minute[-1] += fleet.billed / 60.0
    reach = fleet.in_reach
    within = {}
    for p, name in enumerate(PRIORITY_ORDER):
        reachable = int(np.sum(reach & (traffic.priority == p)))
        within[name] = fleet.answered[p] / reachable if reachable else 1.0
    return FleetRun(policy=policy.name, gpu_seconds=billed, requests=n,
                    out_of_reach=int(n - reach.sum()), within_sla=within,
                    shed=fleet.shed, actions=actions, peak_gpus=peak,
                    gpus_per_minute=per_minute)


def _signal(meter: DemandMeter, fleet: _Fleet) -> float:
    """The sidecars' scale signal summed over the serving GPUs (unrounded GPUs)."""
    serving = max(fleet.serving, 1)
    return compute_scale_signal(meter, backlog_tokens=fleet.waiting_tokens,
                        full_batch=fleet.gpu.batch * serving,
                        tpot_at_full_batch_s=fleet.gpu.tpot_s, gpus=serving,
                        target_utilisation=fleet.gpu.target_utilisation,
                        finished=0, timeouts=0).desired_gpus_exact
