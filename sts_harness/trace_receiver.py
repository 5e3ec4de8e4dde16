"""A small OTLP/gRPC trace receiver: spans in, JSON lines out (``sts trace receive``).

It implements the collector's ``TraceService`` (``opentelemetry-proto``) on a real
gRPC port, so the OTLP exporters of the sidecar and the Spark side send to it as
to any collector. Each span becomes one JSON line (:func:`span_rows`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import IO, Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(v, kind)
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return str(getattr(v, kind)) if kind else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def span_rows(request: ts_pb2.ExportTraceServiceRequest) -> Iterator[dict[str, Any]]:
    """One flat dict per span of an export request: ids (hex), name, service,
    ``start_ns``/``end_ns``, attributes, events and links."""
    for rs in request.resource_spans:
        resource = _attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                yield {
                    "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(), "name": s.name,
                    "service": resource.get("service.name", ""),
                    "component": resource.get("sts.component", ""),
                    "start_ns": s.start_time_unix_nano, "end_ns": s.end_time_unix_nano,
                    "status": s.status.code, "attributes": _attributes(s.attributes),
                    "events": [{"name": e.name, "time_ns": e.time_unix_nano,
                                "attributes": _attributes(e.attributes)} for e in s.events],
                    "links": [{"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex()}
                              for link in s.links],
                }


class _Servicer(ts_grpc.TraceServiceServicer):
    def __init__(self, receiver: TraceReceiver) -> None:
        self.receiver = receiver

    def Export(self, request: ts_pb2.ExportTraceServiceRequest,
               context: grpc.ServicerContext) -> ts_pb2.ExportTraceServiceResponse:
        self.receiver.add(list(span_rows(request)))
        return ts_pb2.ExportTraceServiceResponse()


class TraceReceiver:
    """An OTLP trace receiver on ``addr:port`` (``port=0``: a free one, see :attr:`port`).

    Args:
        addr: Address to listen on.
        port: Port (0 picks one).
        out: JSON-lines file the spans are appended to (``None``: memory only).

    Usage::

        with TraceReceiver(port=0, out="spans.jsonl") as receiver:
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
            ...
            spans = receiver.spans

    Raises:
        OSError: the address cannot be listened on.
    """

    def __init__(self, addr: str = "127.0.0.1", port: int = 4317,
                 out: str | Path | None = None) -> None:
        self.spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                                   options=[("grpc.so_reuseport", 0)])  # a port in use fails
        ts_grpc.add_TraceServiceServicer_to_server(_Servicer(self), self._server)
        try:
            self.port = self._server.add_insecure_port(f"{addr}:{port}")
        except RuntimeError as e:
            raise OSError(f"cannot listen on {addr}:{port}: {e}") from None
        self.addr = addr
        if out is not None:
            self._file = open(out, "a", encoding="utf-8")  # appends; never truncates

    @property
    def endpoint(self) -> str:
        """The value for ``OTEL_EXPORTER_OTLP_ENDPOINT`` (plaintext)."""
        return f"http://{self.addr}:{self.port}"

    def add(self, rows: list[dict[str, Any]]) -> None:
        """Keep (and write) received spans."""
        with self._lock:
            self.spans.extend(rows)
            if self._file is not None:
                self._file.writelines(json.dumps(r) + "\n" for r in rows)
                self._file.flush()

    def start(self) -> TraceReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop listening and close the file. Idempotent."""
        self._server.stop(1).wait()
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> TraceReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
