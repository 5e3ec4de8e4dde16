"""Prometheus metrics of the Spark side, served by the driver (``output.metrics_port``).

A :class:`~pyspark.sql.streaming.StreamingQueryListener` records each micro-batch of the
pipeline's queries (input and processing rates, batch duration, rows); a collector reads
the pipeline's own figures at scrape time: requests submitted, answers by source,
requests still waiting for an answer (the backlog), safety-net fallbacks, output
validation failures by rule, and where the answers micro-batches' time goes (by step).
Names: ``sts_spark_`` prefix, base units, ``_total`` on counters, on a registry of their
own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, Metric,
                                   SummaryMetricFamily)
from prometheus_client.registry import Collector
from pyspark.sql.streaming import StreamingQueryListener

from spark_ext.config import QUERIES, REALTIME_PUBLISH
from spark_ext.pipeline.scaling import pipeline_scale
from spark_ext.sources.kafka import kafka_lag

_PREFIX = "sts_spark"


def _rule_names(pipeline: Any) -> list[str]:
    """The validation rules the pipeline applies (their counters start at 0)."""
    validator = getattr(pipeline, "validator", None)
    return list(validator.rules) if validator is not None else []


class _PipelineCollector(Collector):
    """The pipeline's counters, read when Prometheus scrapes."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline

    def collect(self) -> Iterator[Metric]:
        p = self.pipeline
        stats = p.store.stats
        submitted = CounterMetricFamily(f"{_PREFIX}_requests_submitted",
                                        "Requests submitted to the sidecar (ack rows).")
        submitted.add_metric([], p.submitted)
        yield submitted
        answers = CounterMetricFamily(f"{_PREFIX}_answers",
                                      "Answer rows written, by source and status (a backfill "
                                      "upgrades a fallback answer: source backfill, status ok).",
                                      labels=["source", "status"])
        counts = {("llm", "ok"): 0, ("backfill", "ok"): 0} | dict(stats.by_source_status)
        for (source, status), n in sorted(counts.items()):
            answers.add_metric([source, status], n)
        yield answers
        backlog = GaugeMetricFamily(f"{_PREFIX}_backlog_requests",
                                    "Accepted requests still waiting for their answer.")
        backlog.add_metric([], p.open_requests)
        yield backlog
        lost = CounterMetricFamily(f"{_PREFIX}_safety_net_fallbacks",
                                   "Requests answered by the safety net (no result in time).")
        lost.add_metric([], p.counts.no_result_fallbacks)
        yield lost
        conflicts = CounterMetricFamily(f"{_PREFIX}_write_conflicts_retried",
                                        "Delta writes tried again because another writer "
                                        "committed first.")
        conflicts.add_metric([], p.counts.conflicts_retried)
        yield conflicts
        steps = SummaryMetricFamily(
            f"{_PREFIX}_answers_batch_step_seconds",
            "Time of the answers micro-batches by step: ledger (the stateful step and the "
            "output's caching), a table's name (its append), <table>_merge, release, total.",
            labels=["step"])
        seconds, batches = dict(p.counts.step_seconds), dict(p.counts.step_batches)
        for step in sorted(batches):
            steps.add_metric([step], batches[step], seconds.get(step, 0.0))
        yield steps
        invalid = CounterMetricFamily(f"{_PREFIX}_validation_failures",
                                      "Answers replaced by the fallback, by validation rule.",
                                      labels=["rule"])
        failures = dict.fromkeys(_rule_names(p), 0) | dict(p.validation_failures)
        for rule, n in sorted(failures.items()):
            invalid.add_metric([rule], n)
        yield invalid
        dead = CounterMetricFamily(f"{_PREFIX}_dead_letters",
                                   "Source records that are not events (the dead_letters "
                                   "table).")
        dead.add_metric([], p.dead_letters)
        yield dead


class PipelineMetrics(StreamingQueryListener):
    """Micro-batch figures of the pipeline's queries plus its counters, on a registry.

    Args:
        pipeline: The :class:`~spark_ext.pipeline.sts_pipeline.StsPipeline` whose queries (``sts-*``)
            and counters are exported.
        registry: Where the metrics live (a new one by default).

    Usage::

        metrics = PipelineMetrics(pipeline)
        spark.streams.addListener(metrics)
        metrics.serve(9401)          # http://127.0.0.1:9401/metrics
    """

    def __init__(self, pipeline: Any, registry: CollectorRegistry | None = None
                 ) -> None:
        self.registry = registry or CollectorRegistry()
        self.queries = {f"sts-{q}" for q in (*QUERIES, REALTIME_PUBLISH)}
        labels = ["query"]
        self.input_rate = Gauge(f"{_PREFIX}_input_rows_per_second",
                                "Input rows/s of the last micro-batch.", labels,
                                registry=self.registry)
        self.processing_rate = Gauge(f"{_PREFIX}_processed_rows_per_second",
                                     "Processed rows/s of the last micro-batch.", labels,
                                     registry=self.registry)
        self.batch_duration = Gauge(f"{_PREFIX}_batch_duration_seconds",
                                    "Duration of the last micro-batch with rows.", labels,
                                    registry=self.registry)
        self.batches = Counter(f"{_PREFIX}_batches", "Micro-batches with rows.", labels,
                               registry=self.registry)
        self.rows = Counter(f"{_PREFIX}_input_rows", "Input rows.", labels,
                            registry=self.registry)
        self.kafka_lag = Gauge(f"{_PREFIX}_kafka_lag_records",
                               "Records of a Kafka topic partition not yet read by the query "
                               "(newest offset minus the offset read to), at its last "
                               "micro-batch.", ["query", "topic", "partition"],
                               registry=self.registry)
        self.scale = Gauge(f"{_PREFIX}_scale", "The sidecars' scale signal summed over the "
                           "distinct sidecars the executors reached at the last check: "
                           "measure gpus (GPUs they serve), desired_gpus (what the "
                           "capacity formula asks for: the sidecars' unrounded values summed, "
                           "then rounded up), desired_gpus_exact, demand_tokens_per_second.",
                           ["measure"], registry=self.registry)
        self.registry.register(_PipelineCollector(pipeline))
        self._server: Any = None
        self._lock = threading.Lock()

    def sidecars_checked(self, rows: list[dict]) -> None:
        """The rows of a sidecar check (:func:`~spark_ext.submit.submission.check_sidecars`):
        sum the scale signal over the distinct sidecars that answered."""
        totals = pipeline_scale(rows)
        for measure, value in totals.items():
            self.scale.labels(measure).set(value)

    # StreamingQueryListener -------------------------------------------------------------

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        name = progress.name
        if name not in self.queries:
            return
        with self._lock:
            self.input_rate.labels(name).set(progress.inputRowsPerSecond or 0.0)
            self.processing_rate.labels(name).set(progress.processedRowsPerSecond or 0.0)
            if progress.numInputRows:
                self.batches.labels(name).inc()
                self.rows.labels(name).inc(progress.numInputRows)
                total_ms = progress.durationMs.get("triggerExecution")
                if total_ms is not None:
                    self.batch_duration.labels(name).set(total_ms / 1000.0)
            for source in progress.sources:
                for (topic, partition), lag in kafka_lag(source).items():
                    self.kafka_lag.labels(name, topic, str(partition)).set(lag)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    # HTTP -------------------------------------------------------------------------------

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``addr:port`` (0: a free port); return the port."""
        server, _ = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        return self.port

    @property
    def port(self) -> int | None:
        """The port ``/metrics`` is served on (``None``: not serving)."""
        return None if self._server is None else self._server.server_address[1]

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
