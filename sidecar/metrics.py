"""Prometheus metrics of the sidecar (``sts sidecar --metrics-port``).

Two kinds, on a registry of their own (vLLM registers its ``vllm:*`` metrics
on the global one; keeping ours apart keeps the endpoint small and lint-clean):

* **Histograms** of each terminal result, observed as it is emitted: time to
  first token, time per output token and end-to-end latency (receive to
  finish), per priority; and a counter of results by priority, status and
  reason (every shed is counted with its priority and reason). Late rows
  (``finish_and_backfill``) are not terminal: they are counted apart, in
  ``late_results`` by priority, and in nothing else.
* **Live figures** read from :meth:`Scheduler.stats` at scrape time: queue
  depth, in-flight requests and tokens per pool, estimated queue wait, engine
  output tokens/s, KV-cache usage and prefix-cache hit ratio, submitted,
  accepted and duplicate (dedupe hit) counts, late work running and aborted, and
  the result channel's rows produced, delivered, failed and buffered.

Names follow Prometheus conventions: ``sts_sidecar_`` prefix, base units
(seconds, ratios 0..1), ``_total`` on counters.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from sidecar.contract import PRIORITY_NAMES, RefusalReason, Status
from sidecar.request_state import ResultRecord
from sidecar.result_channels import ResultChannelStats
from sidecar.scale_signal import ScaleSignal

_PREFIX = "sts_sidecar"
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 15.0, 30.0, 60.0, 120.0)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.0)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _LiveCollector(Collector):
    """Gauges and counters computed from the scheduler's live stats at scrape time."""

    def __init__(self, scheduler, loop: asyncio.AbstractEventLoop | None) -> None:  # type: ignore[no-untyped-def]
        self.scheduler = scheduler
        self.loop = loop

    def _stats(self):  # type: ignore[no-untyped-def]
        """Read the stats on the scheduler's event loop (scrapes come from an HTTP thread)."""
        if self.loop is None or _running_loop() is self.loop:
            return self.scheduler.stats()

        async def snapshot():  # type: ignore[no-untyped-def]
            return self.scheduler.stats()

        return asyncio.run_coroutine_threadsafe(snapshot(), self.loop).result(timeout=10)

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        per_pool = {
            "queue_depth": ("Requests waiting in the pool's queue.", "queued"),
            "in_flight_requests": ("Requests of the pool inside the engine.", "in_flight"),
            "in_flight_tokens": ("Prompt plus max_tokens of the pool's requests in the engine.",
                                 "tokens_in_flight"),
            "estimated_queue_wait_seconds": ("Estimated queue wait of a request admitted now.",
                                             "estimated_queue_wait_s"),
            "max_queued_requests": ("Configured max_queued of the pool.", "max_queued"),
        }
        for name, (doc, attr) in per_pool.items():
            g = GaugeMetricFamily(f"{_PREFIX}_{name}", doc, labels=["priority"])
            for priority, pool in s.pools.items():
                g.add_metric([str(priority)], float(getattr(pool, attr)))
            yield g
        counters = {
            "requests_submitted": ("Requests received by SubmitBatch.", s.admissions.submitted),
            "requests_accepted": ("Requests admitted into a pool.", s.admissions.accepted),
            "dedupe_hits": ("Requests whose request_id had been seen before.",
                            s.admissions.duplicates),
            "id_conflicts": ("Repeated request_ids whose prompt or max_tokens differed from "
                             "the first submission's (two requests sharing an id).",
                             s.admissions.id_conflicts),
            "prompt_tokens": ("Prompt tokens of requests that reached the engine.",
                              s.prompt_tokens_total),
            "cached_prompt_tokens": ("Prompt tokens served from the prefix cache.",
                                     s.cached_tokens_total),
            "late_work_aborted": ("Requests generating past their deadline "
                                  "(finish_and_backfill) aborted without a late result.",
                                  s.late_aborted),
            "preemptions": ("Running requests aborted and requeued for higher-priority work.",
                            s.preemptions),
            "batch_catch_ups": ("Checks at which a running request behind its deadline had "
                                "lower work held back, then preempted, for a smaller batch, "
                                "or narrowed the lower priorities' intake windows.",
                                s.batch_catch_ups),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(f"{_PREFIX}_{name}", doc, value=float(value))
        gauges = {
            "output_tokens_per_second": ("Engine output tokens per second (10 s window).",
                                         s.output_tokens_per_s),
            "prefix_cache_hit_ratio": ("Prefix-cache hits over lookups (engine counters when "
                                       "it keeps them).", s.prefix_cache_hit_rate),
            "draining": ("1 while the sidecar drains for shutdown.", float(s.draining)),
            "late_in_flight_requests": ("Requests generating past their deadline "
                                        "(finish_and_backfill late work).",
                                        float(s.late_in_flight)),
        }
        if s.engine.kv_cache_usage is not None:
            gauges["kv_cache_usage_ratio"] = ("Share of the engine's KV cache in use.",
                                              s.engine.kv_cache_usage)
        if s.engine.running is not None:
            gauges["engine_running_requests"] = ("Sequences running in the engine.",
                                                 float(s.engine.running))
        if s.engine.waiting is not None:
            gauges["engine_waiting_requests"] = ("Sequences waiting inside the engine.",
                                                 float(s.engine.waiting))
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(f"{_PREFIX}_{name}", doc, value=float(value))
        err = GaugeMetricFamily(
            f"{_PREFIX}_queue_wait_estimate_error_seconds",
            "Actual minus admission-time estimated queue wait of recently started requests.",
            labels=["priority", "stat"])
        for priority, summary in s.wait_error_s.items():
            for stat in ("p50", "p99"):
                if (value := summary.get(stat)) is not None:
                    err.add_metric([str(priority), stat], float(value))
        yield err
        if s.result_channel is not None:
            yield from _result_channel_families(s.result_channel)
        if s.scale is not None:
            yield from _scale_families(s.scale)


def _scale_families(scale: ScaleSignal) -> Iterator[Metric]:
    """The scale signal (:mod:`sidecar.scale_signal`): what an autoscaler (KEDA, an HPA)
    scales this sidecar's kind of GPU on (``sts_sidecar_desired_gpus``; over the
    sidecars of a pipeline, ``sts_sidecar_desired_gpus_exact`` summed, then rounded up),
    and what it rests on."""
    gauges = {
        "desired_gpus": ("GPUs the capacity formula asks for: demand / (one GPU's measured "
                         "capacity x target utilisation), rounded up (at least 1).",
                         scale.desired_gpus),
        "desired_gpus_exact": ("The capacity formula's value before rounding: what to sum "
                               "over the sidecars of a pipeline (then round up).",
                               scale.desired_gpus_exact),
        "served_gpus": ("GPUs this sidecar serves.", scale.gpus),
        "demand_tokens_per_second": ("Output tokens/s asked for: the last 60 s of arrivals "
                                     "(accepted or refused, at their expected length) "
                                     "plus the queued backlog over 60 s.",
                                     scale.demand_tokens_per_s),
        "capacity_tokens_per_second": ("One GPU's measured output tokens/s at the full "
                                       "batch (0 while unknown).",
                                       scale.capacity_tokens_per_s),
        "utilisation_ratio": ("Demand over the capacity of the GPUs there are (above 1: "
                              "short).", scale.utilisation),
        "refused_ratio": ("Share of the last 60 s of arrivals refused at admission.",
                          scale.refused_share),
        "timeout_ratio": ("Share of the last 60 s of terminal rows that were timeout.",
                          scale.timeout_share),
    }
    for name, (doc, value) in gauges.items():
        yield GaugeMetricFamily(f"{_PREFIX}_{name}", doc, value=float(value))


def _result_channel_families(c: ResultChannelStats) -> Iterator[Metric]:
    """``sts_sidecar_result_channel_*``: rows produced, delivered and failed, rows
    buffered (produced, not delivered yet) and whether the destination answers."""
    counters = {
        "produced": ("Result rows handed to the result channel.", c.produced),
        "delivered": ("Result rows readers can see: in a visible file, or acknowledged by "
                      "the Kafka brokers.", c.delivered),
        "delivery_errors": ("Failed deliveries: file writes that failed (retried), Kafka "
                            "deliveries that failed for good.", c.delivery_errors),
    }
    for name, (doc, value) in counters.items():
        family = CounterMetricFamily(f"{_PREFIX}_result_channel_{name}", doc, labels=["kind"])
        family.add_metric([c.kind], float(value))
        yield family
    gauge = GaugeMetricFamily(f"{_PREFIX}_result_channel_buffered",
                              "Result rows produced and not delivered yet (Kafka: not "
                              "acknowledged by the brokers).", labels=["kind"])
    gauge.add_metric([c.kind], float(c.buffered))
    yield gauge
    if c.up is not None:
        up = GaugeMetricFamily(f"{_PREFIX}_result_channel_up",
                               "1 while the result channel's destination answers (the Kafka "
                               "brokers), 0 while it does not.", labels=["kind"])
        up.add_metric([c.kind], float(c.up))
        yield up


class _Series:
    """One label set of a :class:`_Histogram`: per-bucket counts (the last one is
    ``+Inf``) and the sum. Written on the event loop only."""

    __slots__ = ("counts", "total")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)
        self.total = 0.0


class _Histogram(Collector):
    """A histogram observed once per result, cheaply: a bisect and two additions per
    value, no lock and no ``labels()`` lookup (``prometheus_client``'s ``Histogram``
    takes a lock per bucket and per sum, several times the cost). Exposed at scrape
    time with the same names, labels and buckets; a scrape from the HTTP thread may see
    a count one observation ahead of its sum, as a scrape a moment later would.

    Example:
        >>> h = _Histogram("demo_seconds", "Demo.", ["priority"], (0.1, 1.0))
        >>> series = h.series("high")
        >>> for v in (0.05, 0.5, 3.0):
        ...     h.observe(series, v)
        >>> samples = next(h.collect()).samples
        >>> [(s.labels.get("le"), s.value) for s in samples if s.name.endswith("_bucket")]
        [('0.1', 1.0), ('1.0', 2.0), ('+Inf', 3.0)]
        >>> [(s.name, s.value) for s in samples if not s.name.endswith("_bucket")]
        [('demo_seconds_count', 3.0), ('demo_seconds_sum', 3.55)]
    """

    def __init__(self, name: str, documentation: str, labelnames: list[str],
                 buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self.bounds = tuple(sorted(buckets))
        self._les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        self._series: dict[tuple[str, ...], _Series] = {}

    def series(self, *labelvalues: str) -> _Series:
        """The series of one label set (created at its first use)."""
        if (s := self._series.get(labelvalues)) is None:
            s = self._series[labelvalues] = _Series(len(self.bounds))
        return s

    def observe(self, series: _Series, value: float) -> None:
        series.counts[bisect.bisect_left(self.bounds, value)] += 1
        series.total += value

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labelvalues, s in list(self._series.items()):
            cumulative, buckets = 0, []
            for le, n in zip(self._les, list(s.counts)):
                cumulative += n
                buckets.append((le, float(cumulative)))
            family.add_metric(list(labelvalues), buckets, s.total)
        yield family


class _CountsCollector(Collector):
    """A counter family whose values live in a dict of one-element lists (label values ->
    ``[count]``), bumped in place on the event loop and read at scrape time."""

    def __init__(self, name: str, documentation: str, labelnames: list[str],
                 counts: dict[tuple[str, ...], list[int]]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labelvalues, cell in list(self.counts.items()):
            family.add_metric(list(labelvalues), float(cell[0]))
        yield family


class _LabelledCounts(Collector):
    """One counter family whose values, by one label, are plain ints read at scrape time
    (counted elsewhere: the interceptors, the Kafka intake's thread)."""

    def __init__(self, name: str, documentation: str, label: str,
                 counts: Callable[[], dict[str, int]]) -> None:
        self.name, self.documentation, self.label = name, documentation, label
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        for value_of_label, value in sorted(self.counts().items()):
            family.add_metric([value_of_label], float(value))
        yield family


class SidecarMetrics:
    """The sidecar's metrics registry.

    Args:
        scheduler: Source of the live figures (read at scrape time).
        loop: The event loop the scheduler runs on; scrapes read the live
            figures there. ``None`` reads them directly (single-threaded use).

    Usage::

        metrics = SidecarMetrics(scheduler)
        metrics.serve(9400)  # http://host:9400/metrics
    """

    def __init__(self, scheduler, loop: asyncio.AbstractEventLoop | None = None) -> None:  # type: ignore[no-untyped-def]
        self.registry = CollectorRegistry()
        self._results: dict[tuple[str, str, str], list[int]] = {}
        """Terminal results per (priority, status, reason): a one-element list each, bumped
        in place (a ``prometheus_client`` counter child takes a lock per increment)."""
        self.registry.register(_CountsCollector(
            f"{_PREFIX}_results", "Terminal results by priority, status and refusal reason.",
            ["priority", "status", "reason"], self._results))
        self.late_results = Counter(
            f"{_PREFIX}_late_results", "Late ok results by priority (finish_and_backfill; "
            "the request's terminal result was timeout).", ["priority"],
            registry=self.registry)
        self.ttft = _Histogram(
            f"{_PREFIX}_time_to_first_token_seconds",
            "Receive to first generated token (includes queue wait).", ["priority"],
            _TTFT_BUCKETS)
        self.tpot = _Histogram(
            f"{_PREFIX}_time_per_output_token_seconds",
            "Decode time per output token after the first.", ["priority"], _TPOT_BUCKETS)
        self.e2e = _Histogram(
            f"{_PREFIX}_request_latency_seconds",
            "Receive to terminal result, every status.", ["priority", "status"],
            _LATENCY_BUCKETS)
        for histogram in (self.ttft, self.tpot, self.e2e):
            self.registry.register(histogram)
        self.warmup_seconds = Gauge(
            f"{_PREFIX}_warmup_seconds",
            "Duration of the warm-up generations run before SERVING (0: no warm-up).",
            registry=self.registry)
        self.engine_up = Gauge(
            f"{_PREFIX}_engine_up", "1 while the engine serves, 0 once it died.",
            registry=self.registry)
        self.engine_up.set_function(lambda: 0.0 if scheduler.engine_error else 1.0)
        self.registry.register(_LiveCollector(scheduler, loop))
        self._children: dict[tuple[str, str, str], tuple[list[int], _Series]] = {}
        """Labelled results counter and latency series per (priority, status, reason):
        ``labels()`` costs more than the observation itself."""
        self._ttft_series: dict[str, _Series] = {}
        self._tpot_series: dict[str, _Series] = {}
        # The results an alert watches, and the latency series a dashboard rates, start at
        # 0, so their first observation is an increase (a series born at 1 has no rate).
        for priority in PRIORITY_NAMES:
            self._ttft_series[priority] = self.ttft.series(priority)
            self._tpot_series[priority] = self.tpot.series(priority)
            self._results.setdefault((priority, str(Status.TIMEOUT), "none"), [0])
            for reason in RefusalReason:
                if reason.status is Status.SHED:
                    self._results.setdefault((priority, str(Status.SHED), str(reason)), [0])

    def observe(self, record: ResultRecord) -> None:
        """Count one result (call it for every result emitted); a late row counts
        only in ``late_results``."""
        priority = record.priority or "unknown"
        if record.late:
            self.late_results.labels(priority).inc()
            return
        key = (priority, record.status, record.reason or "none")
        if (children := self._children.get(key)) is None:
            count = self._results.setdefault(key, [0])
            children = self._children[key] = (count, self.e2e.series(priority, record.status))
        children[0][0] += 1
        bisect_left = bisect.bisect_left
        e2e = children[1]
        latency = (record.finish_ts - record.received_ts) / 1000.0
        if latency < 0.0:
            latency = 0.0
        e2e.counts[bisect_left(self.e2e.bounds, latency)] += 1
        e2e.total += latency
        if record.ttft_ms is not None:
            if (ttft := self._ttft_series.get(priority)) is None:
                ttft = self._ttft_series[priority] = self.ttft.series(priority)
            value = record.ttft_ms / 1000.0
            ttft.counts[bisect_left(self.ttft.bounds, value)] += 1
            ttft.total += value
        if record.tpot_ms is not None:
            if (tpot := self._tpot_series.get(priority)) is None:
                tpot = self._tpot_series[priority] = self.tpot.series(priority)
            value = record.tpot_ms / 1000.0
            tpot.counts[bisect_left(self.tpot.bounds, value)] += 1
            tpot.total += value

    def count_refused_calls(self, counts: Callable[[], dict[str, int]]) -> None:
        """Export ``sts_sidecar_rpc_refused_total{reason}``: whole calls refused before
        admission (``unauthenticated``: no or a wrong token; ``resource_exhausted``: the
        in-flight byte cap), read from ``counts()`` at scrape time."""
        self.registry.register(_LabelledCounts(
            f"{_PREFIX}_rpc_refused", "RPCs refused before admission, by reason.", "reason",
            counts))

    def count_intake(self, counts: Callable[[], dict[str, int]]) -> None:
        """Export ``sts_sidecar_intake_records_total{outcome}``: records the Kafka intake
        (``intake.topic``) read (``read``), admitted (``admitted``: accepted or refused
        with a row) and found naming no request (``invalid``), from ``counts()``."""
        self.registry.register(_LabelledCounts(
            f"{_PREFIX}_intake_records", "Records of intake.topic, by outcome: read, "
            "admitted (accepted or refused with a row), invalid (naming no request).",
            "outcome", counts))

    def watch_gpus(self, selection: list[int | str] | None = None) -> Callable[[], None]:
        """Export utilisation and memory of the sidecar's GPUs through NVML
        (:mod:`sidecar.gpu_metrics`; ``selection``: ``server.metrics_gpus``). Nothing is
        exported, and nothing fails, without a GPU or ``nvidia-ml-py``. Returns a
        function that releases NVML."""
        from sidecar.gpu_metrics import GpuCollector

        collector = GpuCollector.open(selection)
        if collector is None:
            return lambda: None
        self.registry.register(collector)

        def close() -> None:
            self.registry.unregister(collector)
            collector.close()

        return close

    def serve(self, port: int, addr: str = "0.0.0.0") -> Callable[[], None]:
        """Expose ``/metrics`` on ``addr:port`` from a daemon thread; returns a
        function that stops it."""
        httpd, _ = start_http_server(port, addr=addr, registry=self.registry)

        def stop() -> None:
            httpd.shutdown()
            httpd.server_close()

        return stop
