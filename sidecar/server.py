"""The sidecar process: engine, scheduler, result writer and the gRPC server.

:func:`serve` builds everything from a :class:`SidecarConfig` inside one
:class:`contextlib.AsyncExitStack`, so a start that fails half-way (an engine
that does not load, an address that cannot be bound) undoes what it started,
and every exit runs the same steps in reverse. It serves until SIGTERM/SIGINT,
then drains: health turns ``NOT_SERVING``, new requests are refused
(``shed``/``draining``), queued and running requests finish or hit their
deadlines (at most ``drain_timeout_s``), results are flushed, and it returns.

When the engine dies, health turns ``NOT_SERVING`` at once, new requests are
refused (``engine_unavailable``, one row each), queued and running requests end
``error`` (one row each), and after ``server.engine_death_grace_s`` the same
shutdown runs and :class:`~sidecar.exceptions.EngineDeadError` is raised, so the
process exits non-zero and a supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sidecar.config import SidecarConfig
from sidecar.engines import build_engine
from sidecar.exceptions import ConfigError, EngineDeadError
from sidecar.event_loop import running_loop_name
from sidecar.interceptors import ExceptionInterceptor
from sidecar.metrics import SidecarMetrics
from sidecar.pb.sts.v1 import inference_pb2, inference_pb2_grpc
from sidecar.request_state import ResultRecord
from sidecar.result_writer import ParquetResultWriter
from sidecar.scheduler import Scheduler
from sidecar.security import (
    TokenInterceptor,
    check_listen,
    prepare_socket_dir,
    restrict_socket,
    server_credentials,
    server_token,
    socket_umask,
    unix_socket_path,
)
from sidecar.tracing import sidecar_tracer
from sidecar.servicer import InferenceServicer
from sidecar.warmup import calibrate, warm_up

logger = logging.getLogger(__name__)

#: The fully-qualified service name used with the health service.
SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name

#: Health service names the sidecar reports.
_HEALTH_NAMES = ("", SERVICE_NAME)

#: Allocations (net of frees) between young-generation collections once serving. Python's
#: default, 700, runs a collection every few requests, and each one walks the objects of
#: every request still in flight (they live a few milliseconds); measured in the gateway
#: benchmark, that was about a tenth of the sidecar's CPU.
GC_GEN0_THRESHOLD = 10_000


def tune_gc() -> None:
    """Prepare the cyclic garbage collector for serving: collect once, move every object
    alive after start-up (modules, the engine, the model's Python objects) out of future
    collections (``gc.freeze()``), and collect the young generation every
    :data:`GC_GEN0_THRESHOLD` allocations instead of every 700. Reference counting
    frees a request's objects as it ends either way; this only makes the periodic scan
    for cycles rarer and shorter. Process-wide: call it once, after start-up.

    Usage::

        tune_gc()  # what serve(config, gc_tuning=True) does before it reports SERVING
    """
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def default_sidecar_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _handle_signals(stack: contextlib.AsyncExitStack, stop: asyncio.Event) -> None:
    """SIGTERM/SIGINT set ``stop`` until the stack unwinds (main thread only)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            continue
        stack.callback(loop.remove_signal_handler, sig)


async def _first_of(*events: asyncio.Event) -> None:
    """Return as soon as one of ``events`` is set."""
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


def _bind(server: grpc.aio.Server, config: SidecarConfig,
          credentials: grpc.ServerCredentials | None) -> None:
    """Add the listening port; a failure is one line naming the address."""
    listen = config.server.listen
    socket_path = unix_socket_path(listen)
    try:
        with socket_umask(config.server.socket_mode) if socket_path else \
                contextlib.nullcontext():
            port = (server.add_secure_port(listen, credentials) if credentials is not None
                    else server.add_insecure_port(listen))
    except RuntimeError as e:
        raise ConfigError(f"cannot listen on this address: {e} ({listen})") from None
    if port == 0 and socket_path is None:
        raise ConfigError(f"cannot listen on this address: in use, or not an address of this "
                          f"host ({listen})")


async def serve(config: SidecarConfig, *, stop: asyncio.Event | None = None,
                gc_tuning: bool = False) -> None:
    """Run the sidecar until ``stop`` is set or SIGTERM/SIGINT arrives, then drain.

    Args:
        config: The whole sidecar configuration.
        stop: Optional event to stop it from the same process (tests, embedding).
        gc_tuning: Call :func:`tune_gc` once started (process-wide, so only where the
            sidecar owns its process: ``sts sidecar`` does).

    Raises:
        ConfigError: refused address, unreadable credentials, address not bindable
            (one line; nothing is left running).
        EngineStartError: the engine did not load.
        EngineDeadError: the engine died while serving (after the shutdown ran).

    Usage::

        asyncio.run(serve(SidecarConfig.from_yaml("conf/sidecar.yaml")))
    """
    started_at = time.monotonic()
    server_cfg = config.server
    sidecar_id = server_cfg.sidecar_id or default_sidecar_id()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    # Checks that hold no resource come first: nothing to undo when they fail.
    token = server_token(server_cfg)
    check_listen(server_cfg, token=token)
    credentials = server_credentials(server_cfg)
    socket_path = unix_socket_path(server_cfg.listen)
    if socket_path is not None:
        prepare_socket_dir(socket_path)

    async with contextlib.AsyncExitStack() as stack:
        _handle_signals(stack, stop)
        engine = build_engine(config.engine)
        stack.push_async_callback(engine.shutdown)  # also undoes a half-finished start
        logger.info("Starting %s engine.", engine.kind)
        await engine.start()
        warmup_s = await warm_up(engine, config.warmup)
        samples = await calibrate(engine, config.warmup,
                                  min(config.scheduler.max_in_flight,
                                      config.warmup.calibration_max_batch))

        tracer = sidecar_tracer()  # None unless the OTEL_* variables switch tracing on
        if tracer is not None:  # unwound after the writer's last file: its spans go out too
            stack.push_async_callback(asyncio.to_thread, tracer.shutdown)
        writer = ParquetResultWriter(config.results, sidecar_id)
        if tracer is not None:
            writer.on_written = tracer.written
        stack.callback(lambda: logger.info("Sidecar stopped; %d results in %d files.",
                                           writer.rows_written, writer.files_written))
        writer.start()
        stack.push_async_callback(writer.close)
        metrics: SidecarMetrics | None = None

        def emit(record: ResultRecord) -> None:
            writer.emit(record)
            if metrics is not None:
                metrics.observe(record)

        scheduler = Scheduler(engine, emit, config.scheduler, sidecar_id,
                              log_requests=server_cfg.log_requests)
        scheduler.tracer = tracer
        scheduler.estimator.calibrate(samples)
        scheduler.start()
        stack.push_async_callback(scheduler.abort_all)
        metrics = SidecarMetrics(scheduler, loop)
        metrics.warmup_seconds.set(warmup_s)
        if server_cfg.metrics_port is not None:
            try:
                stack.callback(metrics.serve(server_cfg.metrics_port, server_cfg.metrics_addr))
            except OSError as e:
                raise ConfigError(f"cannot serve /metrics: {e.strerror or e} "
                                  f"({server_cfg.metrics_addr}:{server_cfg.metrics_port})"
                                  ) from None
            logger.info("Prometheus metrics on http://%s:%d/metrics", server_cfg.metrics_addr,
                        server_cfg.metrics_port)
            stack.callback(metrics.watch_gpus(server_cfg.metrics_gpus))

        max_bytes = server_cfg.max_message_mb * 1024 * 1024
        guard = ExceptionInterceptor(
            max_inflight_bytes=server_cfg.max_inflight_rpc_mb * 1024 * 1024)
        interceptors: list[grpc.aio.ServerInterceptor] = [guard]
        token_check = TokenInterceptor(token) if token is not None else None
        if token_check is not None:
            interceptors.insert(0, token_check)
        metrics.count_refused_calls(lambda: {
            "unauthenticated": token_check.refused if token_check is not None else 0,
            "resource_exhausted": guard.refused_for_bytes})
        server = grpc.aio.server(
            interceptors=interceptors,
            options=[("grpc.max_receive_message_length", max_bytes),
                     ("grpc.max_send_message_length", max_bytes)],
        )
        inference_pb2_grpc.add_InferenceServicer_to_server(
            InferenceServicer(scheduler, engine_kind=engine.kind, started_at=started_at,
                              submit_yield_ms=server_cfg.submit_yield_ms), server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        _bind(server, config, credentials)
        stack.push_async_callback(server.stop, server_cfg.shutdown_grace_s)
        with socket_umask(server_cfg.socket_mode) if socket_path else contextlib.nullcontext():
            await server.start()
        if socket_path is not None:
            restrict_socket(socket_path, server_cfg.socket_mode)
            stack.callback(lambda: socket_path.unlink(missing_ok=True))

        async def drain() -> None:
            logger.info("Draining: refusing new requests.")
            await health_servicer.enter_graceful_shutdown()
            await scheduler.drain(config.scheduler.drain_timeout_s)

        stack.push_async_callback(drain)
        if gc_tuning:
            tune_gc()
        serving = (health_pb2.HealthCheckResponse.SERVING if scheduler.engine_error is None
                   else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in _HEALTH_NAMES:
            await health_servicer.set(name, serving)
        logger.info("Sidecar %s serving %s (%s engine, model %s, warm-up %.2f s, %s event "
                    "loop) on %s (%s%s); results in %s.", sidecar_id, SERVICE_NAME, engine.kind,
                    engine.model_name, warmup_s, running_loop_name(), server_cfg.listen,
                    "TLS" if credentials else "plaintext",
                    ", token required" if token else "", config.results.results_dir)
        print(f"sts sidecar ready on {server_cfg.listen}", flush=True)

        await _first_of(stop, scheduler.engine_dead)
        if scheduler.engine_error is not None:
            for name in _HEALTH_NAMES:
                await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
            logger.error("Engine died (%s): NOT_SERVING; exiting in %.1f s.",
                         scheduler.engine_error, server_cfg.engine_death_grace_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(server_cfg.engine_death_grace_s):
                    await stop.wait()
            raise EngineDeadError(f"the engine died: {scheduler.engine_error} "
                                  f"(sidecar {sidecar_id})")
