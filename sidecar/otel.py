"""OpenTelemetry tracing from the standard ``OTEL_*`` variables, for every layer.

Tracing is off unless the ``OTEL_*`` variables ask for it (:func:`tracing_requested`);
then :func:`start_tracing` builds a tracer provider with an OTLP/gRPC exporter behind a
batch span processor. Nothing of the OpenTelemetry SDK is imported while tracing is
off. The trace context a request carries (``traceparent``) is part of the contract:
:mod:`sidecar.contract.trace_context`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

_EXPORTERS = ("otlp", "console")
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def tracing_requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` variables switch tracing on.

    On when ``OTEL_TRACES_EXPORTER`` names ``otlp`` or ``console``, or, with that
    variable unset, when an OTLP endpoint is set; always off with
    ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``.

    Example:
        >>> tracing_requested({})
        False
        >>> tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"})
        True
        >>> tracing_requested({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})
        False
    """
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return any(e.strip() in _EXPORTERS for e in exporters.split(","))
    return any(env.get(name, "").strip() for name in _ENDPOINTS)


def otel_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``OTEL_*`` variables of ``env`` (default: this process), to hand to workers."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if k.startswith("OTEL_")}


class Tracing:
    """A tracer provider from the ``OTEL_*`` variables, and span helpers.

    Args:
        component: Resource attribute ``sts.component`` (``sidecar``, ``spark-task``, ...).
        service_name: ``service.name`` unless ``OTEL_SERVICE_NAME`` sets it.
        exporter: A span exporter to use instead of the configured ones (benchmarks).

    Spans get explicit start and end times (epoch ns) and parents, so they can be
    written after the fact from the timestamps a layer already keeps.
    """

    def __init__(self, component: str, service_name: str, *, exporter: Any = None) -> None:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        attributes: dict[str, str] = {"sts.component": component}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attributes[SERVICE_NAME] = service_name
        self._ids = _chosen_ids()
        self.provider = TracerProvider(resource=Resource.create(attributes),
                                       id_generator=self._ids)
        for e in [exporter] if exporter is not None else _configured_exporters():
            self.provider.add_span_processor(BatchSpanProcessor(e))
        self.tracer = self.provider.get_tracer("sts-spark")
        self._flushing = threading.Lock()

    def span(self, name: str, *, start_ns: int, parent: Any = None,
             attributes: Mapping[str, Any] | None = None, links: Sequence[Any] = (),
             span_id: str | None = None, trace_id: str | None = None) -> Any:
        """Start a span (end it with ``span.end(end_time=ns)``).

        Args:
            parent: A span of this provider, a ``(trace_id, span_id)`` pair of hex
                strings (a remote parent), or ``None`` for a root span.
            span_id, trace_id: Ids to give the span instead of random ones (hex);
                ``trace_id`` only applies to a root span.
        """
        from opentelemetry import trace

        if isinstance(parent, tuple):
            parent = trace.NonRecordingSpan(trace.SpanContext(
                int(parent[0], 16), int(parent[1], 16), is_remote=True,
                trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)))
        context = trace.set_span_in_context(parent) if parent is not None else None
        if trace_id is None and span_id is None:
            return self.tracer.start_span(name, context=context, start_time=start_ns,
                                          attributes=attributes, links=links)
        self._ids.choose(trace_id, span_id)
        try:
            return self.tracer.start_span(name, context=context, start_time=start_ns,
                                          attributes=attributes, links=links)
        finally:
            self._ids.choose(None, None)

    @staticmethod
    def link(span: Any, attributes: Mapping[str, Any] | None = None) -> Any:
        """A link to ``span`` (for ``links=``)."""
        from opentelemetry.trace import Link

        return Link(span.get_span_context(), attributes)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Export every finished span now and wait for it (with the collector down,
        the exporter's retries may take longer than ``timeout_s``)."""
        return self.provider.force_flush(int(timeout_s * 1000))

    def flush_soon(self) -> None:
        """Start exporting every finished span now, without waiting: a collector that
        is down never holds the caller (a Spark task, a stopping pipeline)."""
        if not self._flushing.acquire(blocking=False):
            return  # one flush at a time

        def run() -> None:
            try:
                self.provider.force_flush()
            finally:
                self._flushing.release()

        threading.Thread(target=run, name="sts-trace-flush", daemon=True).start()

    def shutdown(self) -> None:
        """Flush and stop the exporters. Idempotent."""
        self.provider.shutdown()


def start_tracing(component: str, service_name: str, *, exporter: Any = None
                  ) -> Tracing | None:
    """A :class:`Tracing` when the ``OTEL_*`` variables ask for it (or ``exporter`` is
    given), else ``None``. A configuration the SDK cannot use logs one warning and
    leaves tracing off; it never stops the caller."""
    if exporter is None and not tracing_requested():
        return None
    try:
        tracing = Tracing(component, service_name, exporter=exporter)
    except ImportError as e:
        logger.warning("sts: tracing is off: %s (install it with: pip install "
                       "'sts-spark[tracing]')", e)
        return None
    except Exception as e:  # tracing must never take the service down
        logger.warning("sts: tracing is off: %s (OTEL_* variables)", e)
        return None
    logger.info("Tracing on: %s spans exported by OTLP/gRPC (%s).", component,
                os.environ.get(_ENDPOINTS[0]) or os.environ.get(_ENDPOINTS[1])
                or "default endpoint")
    return tracing


def _configured_exporters() -> list[Any]:
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "otlp"
    exporters: list[Any] = []
    for name in (n.strip() for n in names.split(",")):
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter,
            )

            protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc")
            if protocol.strip().lower() != "grpc":
                logger.warning("sts: OTLP protocol %r is not supported; exporting by OTLP/gRPC "
                               "(OTEL_EXPORTER_OTLP_PROTOCOL)", protocol)
            exporters.append(OTLPSpanExporter())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
    return exporters


def _chosen_ids() -> Any:
    """An SDK id generator: random ids, except the ones chosen (``choose``) for the
    next span of this thread."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class ChosenIds(RandomIdGenerator):
        def __init__(self) -> None:
            self._local = threading.local()

        def choose(self, trace_id: str | None, span_id: str | None) -> None:
            self._local.trace_id = int(trace_id, 16) if trace_id else None
            self._local.span_id = int(span_id, 16) if span_id else None

        def generate_span_id(self) -> int:
            return getattr(self._local, "span_id", None) or super().generate_span_id()

        def generate_trace_id(self) -> int:
            return getattr(self._local, "trace_id", None) or super().generate_trace_id()

    return ChosenIds()
