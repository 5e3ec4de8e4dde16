"""The sidecar process: engine, scheduler, result writer and the gRPC server.

:func:`serve` builds everything from a :class:`SidecarConfig`, serves until
SIGTERM/SIGINT, then drains: health turns ``NOT_SERVING``, new requests are
refused (``shed``/``draining``), queued and running requests finish or hit their
deadlines (at most ``drain_timeout_s``), results are flushed, and it returns.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sidecar.config import SidecarConfig
from sidecar.engines import build_engine
from sidecar.interceptors import ExceptionInterceptor
from sidecar.metrics import SidecarMetrics
from sidecar.pb.sts.v1 import inference_pb2, inference_pb2_grpc
from sidecar.request_state import ResultRecord
from sidecar.result_writer import ParquetResultWriter
from sidecar.scheduler import Scheduler
from sidecar.servicer import InferenceServicer

logger = logging.getLogger(__name__)

#: The fully-qualified service name used with the health service.
SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name


def default_sidecar_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


async def serve(config: SidecarConfig, *, stop: asyncio.Event | None = None) -> None:
    """Run the sidecar until ``stop`` is set or SIGTERM/SIGINT arrives, then drain.

    Args:
        config: The whole sidecar configuration.
        stop: Optional event to stop it from the same process (tests, embedding).

    Usage::

        asyncio.run(serve(SidecarConfig.from_yaml("conf/sidecar.yaml")))
    """
    started_at = time.monotonic()
    sidecar_id = config.server.sidecar_id or default_sidecar_id()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass

    engine = build_engine(config.engine)
    logger.info("Starting %s engine.", engine.kind)
    await engine.start()
    writer = ParquetResultWriter(config.results, sidecar_id)
    writer.start()
    metrics: SidecarMetrics | None = None

    def emit(record: ResultRecord) -> None:
        writer.emit(record)
        if metrics is not None:
            metrics.observe(record)

    scheduler = Scheduler(engine, emit, config.scheduler, sidecar_id,
                          log_requests=config.server.log_requests)
    scheduler.start()
    metrics = SidecarMetrics(scheduler, loop)
    if config.server.metrics_port is not None:
        metrics.serve(config.server.metrics_port, config.server.metrics_addr)
        logger.info("Prometheus metrics on http://%s:%d/metrics", config.server.metrics_addr,
                    config.server.metrics_port)

    max_bytes = config.server.max_message_mb * 1024 * 1024
    server = grpc.aio.server(
        interceptors=[ExceptionInterceptor()],
        options=[("grpc.max_receive_message_length", max_bytes),
                 ("grpc.max_send_message_length", max_bytes)],
    )
    inference_pb2_grpc.add_InferenceServicer_to_server(
        InferenceServicer(scheduler, engine_kind=engine.kind, started_at=started_at), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if server.add_insecure_port(config.server.listen) == 0 and \
            not config.server.listen.startswith("unix:"):
        raise OSError(f"could not bind {config.server.listen}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    logger.info("Sidecar %s serving %s (%s engine, model %s) on %s; results in %s.",
                sidecar_id, SERVICE_NAME, engine.kind, engine.model_name,
                config.server.listen, config.results.results_dir)
    print(f"sts sidecar ready on {config.server.listen}", flush=True)

    try:
        await stop.wait()
    finally:
        logger.info("Draining: refusing new requests.")
        await health_servicer.enter_graceful_shutdown()
        await scheduler.drain(config.scheduler.drain_timeout_s)
        await writer.close()
        await server.stop(config.server.shutdown_grace_s)
        await engine.shutdown()
        logger.info("Sidecar stopped; %d results in %d files.",
                    writer.rows_written, writer.files_written)
