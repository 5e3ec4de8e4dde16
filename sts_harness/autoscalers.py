"""Autoscaling policies for the fleet simulation (:mod:`sts_harness.fleet`): sts-spark's
own controller and the ones users run today, each with the defaults its documentation
gives, deciding how many GPUs a fleet should have from what the fleet shows.

- :class:`StsScaler`: sts-spark's controller (:class:`~spark_ext.pipeline.scaling.ScaleController`,
  the very class the pipeline runs) on the sidecars' scale signal
  (:func:`sidecar.compute_scale_signal`), checked every 30 s as the pipeline does.
- :class:`OracleScaler`: knows the load in advance and scales instantly: at each second
  the GPUs the capacity formula gives for the next window's arrivals.
- :class:`StaticScaler`: a fixed number (the minimum, or the peak).
- :class:`KedaHpa`: KEDA feeding Kubernetes' HPA a metric, with the HPA's defaults: a
  15 s sync, 10 % tolerance, scale-up by at most ``max(4 pods, 100 %)`` per 15 s,
  scale-down to the highest recommendation of the last 300 s; KEDA polls every 30 s. The
  metric is the requests waiting for a batch slot (vLLM's ``num_requests_waiting``, 10 per
  GPU), or the pipeline's exported ``desired_gpus`` (1 per GPU, docs/metrics.md).
- :class:`RayServeScaler`: Ray Serve's ``target_ongoing_requests`` autoscaling (requests
  running plus waiting, per replica, averaged over 30 s, sampled every 10 s) with its
  30 s upscale and 600 s downscale delays.

Every policy is called every :attr:`Autoscaler.interval_s` seconds of virtual time with a
:class:`FleetView` and returns the GPUs it wants; the simulation starts and releases them.
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from spark_ext.config import ScalingConfig
from spark_ext.pipeline.scaling import ScaleController


@dataclass(frozen=True)
class FleetView:
    """What an autoscaler can see of the fleet at one moment."""

    now: float
    """Seconds of virtual time."""
    provisioned: int
    """GPUs asked for and not released: serving plus starting."""
    serving: int
    """GPUs that serve (their cold start over)."""
    waiting: int
    """Requests waiting for a batch slot."""
    running: int
    """Requests in a batch."""
    signal: Callable[[], float]
    """The sidecars' scale signal now: the capacity formula's unrounded GPUs."""


class Autoscaler(Protocol):
    """A policy: the GPUs it wants, asked every ``interval_s`` seconds."""

    name: str
    interval_s: int

    def target(self, view: FleetView) -> int:
        """The GPUs the fleet should have after this decision."""
        ...


@dataclass
class StaticScaler:
    """Always ``gpus``."""

    gpus: int
    name: str = "static"
    interval_s: int = 60

    def target(self, view: FleetView) -> int:
        return self.gpus


@dataclass
class OracleScaler:
    """The GPUs of ``per_second[t]`` at second ``t``: what the capacity formula gives for
    the load ahead (:func:`sts_harness.fleet.oracle_gpus`), with no cold start."""

    per_second: Sequence[int]
    name: str = "oracle"
    interval_s: int = 1

    def target(self, view: FleetView) -> int:
        t = min(int(view.now), len(self.per_second) - 1)
        return int(self.per_second[t])


@dataclass
class StsScaler:
    """sts-spark's controller on the sidecars' scale signal.

    Args:
        config: The pipeline's ``scaling`` section.
        interval_s: Seconds between checks (the pipeline's 30).
    """

    config: ScalingConfig
    interval_s: int = 30
    name: str = "sts-spark"
    decisions: list[tuple[float, str, int, str]] = field(default_factory=list)
    """``(time, action, target, why)`` of every action taken."""
    _controller: ScaleController | None = None

    def target(self, view: FleetView) -> int:
        return self.decide(view.now, view.signal(), view.provisioned)

    def decide(self, now: float, desired: float, current: int) -> int:
        """The controller's decision for a signal of ``desired`` GPUs with ``current``
        there (also how a recorded signal is replayed)."""
        if self._controller is None:
            self._controller = ScaleController(self.config)
        decision = self._controller.decide(now, desired=desired, current=current)
        if decision.action != "hold":
            self.decisions.append((now, decision.action, decision.target, decision.why))
        return decision.target


@dataclass
class KedaHpa:
    """KEDA on one metric, through Kubernetes' HPA with its defaults.

    Args:
        metric: ``waiting`` (requests waiting for a slot) or ``desired_gpus`` (the scale
            signal rounded up, as the pipeline's ``/metrics`` exports it).
        threshold: The metric's value per GPU the HPA aims at (the scaled object's target;
            KEDA's Kafka scaler defaults its lag threshold to 10).
    """

    metric: str = "waiting"
    threshold: float = 10.0
    min_gpus: int = 1
    max_gpus: int = 64
    interval_s: int = 15
    """The HPA's sync period."""
    poll_s: float = 30.0
    """KEDA's polling interval: the metric the HPA reads is this old at most."""
    tolerance: float = 0.1
    down_stabilization_s: float = 300.0
    up_pods: int = 4
    up_percent: float = 100.0
    name: str = "keda-hpa (queue)"
    _metric: float = 0.0
    _polled_at: float | None = None
    _recommendations: collections.deque = field(default_factory=collections.deque)

    def __post_init__(self) -> None:
        if self.metric not in ("waiting", "desired_gpus"):
            raise ValueError(f"KedaHpa metric {self.metric!r}: waiting or desired_gpus")

    def target(self, view: FleetView) -> int:
        if self._polled_at is None or view.now - self._polled_at >= self.poll_s:
            value = (view.waiting if self.metric == "waiting"
                     else max(1, math.ceil(view.signal() - 1e-9)))
            self._metric, self._polled_at = float(value), view.now
        current = max(view.provisioned, 1)
        ratio = self._metric / (self.threshold * current)
        wanted = current if abs(ratio - 1) <= self.tolerance else \
            math.ceil(self._metric / self.threshold)
        wanted = min(max(wanted, self.min_gpus), self.max_gpus)
        recs = self._recommendations
        recs.append((view.now, wanted))
        while recs and recs[0][0] < view.now - self.down_stabilization_s:
            recs.popleft()
        if wanted < current:  # scale-down: the highest recommendation of the window
            return min(current, max(r for _, r in recs))
        limit = max(current + self.up_pods, math.floor(current * (1 + self.up_percent / 100)))
        return min(wanted, limit)


@dataclass
class RayServeScaler:
    """Ray Serve's autoscaler: requests running and waiting per replica against
    ``target_ongoing_requests``, with its delays.

    Args:
        target_ongoing_requests: Requests per GPU aimed at (Ray's default is 2, meant for
            one-request-at-a-time replicas; an LLM replica batches, so the simulation sets
            its batch at the scale signal's target utilisation).
    """

    target_ongoing_requests: float
    min_gpus: int = 1
    max_gpus: int = 64
    metrics_interval_s: float = 10.0
    look_back_s: float = 30.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    interval_s: int = 1
    """The control loop's period (Ray's is 0.1 s; a second is this simulation's tick)."""
    name: str = "ray-serve"
    _samples: collections.deque = field(default_factory=collections.deque)
    _sampled_at: float | None = None
    _counter: int = 0
    """Consecutive decisions above the current number (> 0) or below it (< 0)."""

    def target(self, view: FleetView) -> int:
        if self._sampled_at is None or view.now - self._sampled_at >= self.metrics_interval_s:
            self._samples.append((view.now, view.waiting + view.running))
            self._sampled_at = view.now
        while self._samples and self._samples[0][0] < view.now - self.look_back_s:
            self._samples.popleft()
        ongoing = statistics.fmean(n for _, n in self._samples)
        current = view.provisioned
        desired = min(max(math.ceil(ongoing / self.target_ongoing_requests - 1e-9),
                          self.min_gpus), self.max_gpus)
        if desired > current:
            self._counter = max(self._counter, 0) + 1
            if self._counter > self.upscale_delay_s / self.interval_s:  # as Ray counts
                self._counter = 0
                return desired
        elif desired < current:
            self._counter = min(self._counter, 0) - 1
            if -self._counter > self.downscale_delay_s / self.interval_s:
                self._counter = 0
                return desired
        else:
            self._counter = 0
        return current
