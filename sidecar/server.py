"""The sidecar process: result channel, engine, scheduler and the gRPC server.

:func:`serve` builds everything from a :class:`SidecarConfig` inside one
:class:`contextlib.AsyncExitStack`, so a start that fails half-way (an engine
that does not load, an address that cannot be bound) undoes what it started,
and every exit runs the same steps in reverse. It serves until SIGTERM/SIGINT (or,
with ``server.owner``, until the process it serves has been gone a while:
:mod:`sidecar.owner_watch`), then drains: health turns ``NOT_SERVING``, new requests are refused
(``shed``/``draining``), queued and running requests finish or hit their
deadlines (at most ``drain_timeout_s``), the result channel delivers what it holds
(a bounded wait of ``drain_timeout_s`` more for Kafka), and it returns.

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
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sidecar.config import ServerConfig, SidecarConfig
from sidecar.engines import Engine, build_engine
from sidecar.exceptions import ConfigError, EngineDeadError
from sidecar.event_loop import running_loop_name
from sidecar.interceptors import ExceptionInterceptor
from sidecar.metrics import SidecarMetrics
from sidecar.owner_watch import watch_owner
from sidecar.pb.sts.v1 import inference_pb2, inference_pb2_grpc
from sidecar.request_state import ResultRecord
from sidecar.result_channels import ResultChannel, build_result_channel
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
from sidecar.servicer import InferenceServicer
from sidecar.tracing import SidecarTracer, sidecar_tracer
from sidecar.warmup import SpeedSample, calibrate, warm_up

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

    Start-up, in order (each step's undo is pushed on one exit stack, so any exit runs
    them in reverse): checks that hold nothing (address, credentials), tracing, the
    result channel (a bad channel setting fails before the engine loads), the gRPC
    server's address (bound, so the engine's own sockets can never take it, and a taken
    address fails before the engine loads), the engine (load, warm-up, calibration),
    the scheduler, ``/metrics``, the gRPC services started, the Kafka intake
    (``intake.topic``), and the drain that runs first on the way out.

    Args:
        config: The whole sidecar configuration.
        stop: Optional event to stop it from the same process (tests, embedding).
        gc_tuning: Call :func:`tune_gc` once started (process-wide, so only where the
            sidecar owns its process: ``sts sidecar`` does).

    Raises:
        ConfigError: refused address, unreadable credentials, address not bindable, a
            result channel that cannot be built (one line; nothing is left running).
        EngineStartError: the engine did not load.
        EngineDeadError: the engine died while serving (after the shutdown ran).

    Usage::

        asyncio.run(serve(SidecarConfig.from_yaml("conf/sidecar.yaml")))
    """
    started_at = time.monotonic()
    sidecar_id = config.server.sidecar_id or default_sidecar_id()
    stop = stop or asyncio.Event()
    access = _check_access(config.server)  # holds no resource: nothing to undo
    async with contextlib.AsyncExitStack() as stack:
        _handle_signals(stack, stop)
        tracer = sidecar_tracer()  # None unless the OTEL_* variables switch tracing on
        if tracer is not None:  # unwound after the channel's last rows: their spans go out
            stack.push_async_callback(asyncio.to_thread, tracer.shutdown)
        channel = _start_result_channel(stack, config, sidecar_id, tracer)
        # The address first: an engine that loads for a minute must not take the port
        # (vLLM's own sockets come from the same ephemeral range) or learn it is taken late.
        grpc_server = _bind_grpc(stack, config, access)
        engine, warmup_s, samples = await _start_engine(stack, config)
        results = _ResultSink(channel)
        scheduler = Scheduler(engine, results.emit, config.scheduler, sidecar_id,
                              log_requests=config.server.log_requests, results=channel)
        scheduler.tracer = tracer
        scheduler.estimator.calibrate(samples)
        scheduler.start()
        stack.push_async_callback(scheduler.abort_all)
        results.metrics = _start_metrics(stack, scheduler, config.server, warmup_s)
        health_servicer = await _start_grpc(grpc_server, config, scheduler, access,
                                            results.metrics, started_at=started_at)

        async def drain() -> None:
            logger.info("Draining: refusing new requests.")
            await health_servicer.enter_graceful_shutdown()
            await scheduler.drain(config.scheduler.drain_timeout_s)

        stack.push_async_callback(drain)
        if gc_tuning:
            tune_gc()
        await _report_serving(health_servicer, scheduler, config, access, sidecar_id,
                              warmup_s=warmup_s, destination=channel.destination)
        if config.intake.topic:  # stops first on the way out: unread records stay for others
            _start_intake(stack, config, scheduler, results.metrics)
        if config.server.owner.file is not None:
            watcher = asyncio.create_task(watch_owner(
                config.server.owner.file, config.server.owner.exit_after_s, stop,
                interval_s=config.scheduler.engine_check_interval_s))
            stack.callback(watcher.cancel)
        await _first_of(stop, scheduler.engine_dead)
        if scheduler.engine_error is not None:
            await _exit_after_engine_death(health_servicer, scheduler, config.server, stop,
                                           sidecar_id)


@dataclass(frozen=True)
class _Access:
    """How clients reach the sidecar, checked before anything starts."""

    token: str | None
    credentials: grpc.ServerCredentials | None
    socket_path: Path | None


def _check_access(server_cfg: ServerConfig) -> _Access:
    """The token, TLS credentials and unix socket of ``server_cfg``, checked (one-line
    :class:`ConfigError` on a refused address or unreadable credentials)."""
    token = server_token(server_cfg)
    check_listen(server_cfg, token=token)
    credentials = server_credentials(server_cfg)
    socket_path = unix_socket_path(server_cfg.listen)
    if socket_path is not None:
        prepare_socket_dir(socket_path)
    return _Access(token, credentials, socket_path)


def _start_result_channel(stack: contextlib.AsyncExitStack, config: SidecarConfig,
                          sidecar_id: str, tracer: SidecarTracer | None) -> ResultChannel:
    """Build and start the result channel; on the way out it delivers what is buffered
    (bounded by ``drain_timeout_s``) after the scheduler's last rows."""
    channel = build_result_channel(config.results, sidecar_id)
    if tracer is not None:
        channel.on_written = tracer.written
    stack.callback(lambda: logger.info("Sidecar stopped; %s.", channel.summary()))
    channel.start()
    stack.push_async_callback(channel.close, config.scheduler.drain_timeout_s)
    return channel


async def _start_engine(stack: contextlib.AsyncExitStack, config: SidecarConfig
                        ) -> tuple[Engine, float, list[SpeedSample]]:
    """Build, start, warm up and calibrate the engine; returns it, the warm-up's
    seconds and the calibration samples."""
    engine = build_engine(config.engine)
    stack.push_async_callback(engine.shutdown)  # also undoes a half-finished start
    logger.info("Starting %s engine.", engine.kind)
    await engine.start()
    warmup_s = await warm_up(engine, config.warmup)
    samples = await calibrate(engine, config.warmup,
                              min(config.scheduler.max_in_flight,
                                  config.warmup.calibration_max_batch))
    return engine, warmup_s, samples


class _ResultSink:
    """The scheduler's ``emit``: each row to the result channel, then to the metrics
    (set once they exist; they read the scheduler, which is built with this)."""

    __slots__ = ("channel", "metrics")

    def __init__(self, channel: ResultChannel) -> None:
        self.channel = channel
        self.metrics: SidecarMetrics | None = None

    def emit(self, record: ResultRecord) -> None:
        self.channel.emit(record)
        if (metrics := self.metrics) is not None:
            metrics.observe(record)


def _start_intake(stack: contextlib.AsyncExitStack, config: SidecarConfig,
                  scheduler: Scheduler, metrics: SidecarMetrics | None) -> None:
    """Read requests from ``intake.topic`` (:mod:`sidecar.kafka_intake`) until the
    sidecar drains; its counts on ``/metrics``."""
    from sidecar.kafka_intake import KafkaIntake

    bootstrap = config.intake_bootstrap()
    assert bootstrap is not None  # SidecarConfig checks it
    intake = KafkaIntake(config.intake, bootstrap, scheduler.submit_batch,
                         asyncio.get_running_loop())
    if metrics is not None:
        c = intake.counts
        metrics.count_intake(lambda: {"read": c.records, "admitted": c.admitted,
                                      "invalid": c.invalid})
    intake.start()
    stack.push_async_callback(intake.stop)


def _start_metrics(stack: contextlib.AsyncExitStack, scheduler: Scheduler,
                   server_cfg: ServerConfig, warmup_s: float) -> SidecarMetrics:
    """The metrics registry, served on ``/metrics`` when ``metrics_port`` is set."""
    metrics = SidecarMetrics(scheduler, asyncio.get_running_loop())
    metrics.warmup_seconds.set(warmup_s)
    if server_cfg.metrics_port is None:
        return metrics
    try:
        stack.callback(metrics.serve(server_cfg.metrics_port, server_cfg.metrics_addr))
    except OSError as e:
        raise ConfigError(f"cannot serve /metrics: {e.strerror or e} "
                          f"({server_cfg.metrics_addr}:{server_cfg.metrics_port})") from None
    logger.info("Prometheus metrics on http://%s:%d/metrics", server_cfg.metrics_addr,
                server_cfg.metrics_port)
    stack.callback(metrics.watch_gpus(server_cfg.metrics_gpus))
    return metrics


@dataclass
class _GrpcServer:
    """The gRPC server, its address bound before the engine loads, and its interceptors
    (whose refusals the metrics count once they exist)."""

    server: grpc.aio.Server
    guard: ExceptionInterceptor
    token_check: TokenInterceptor | None
    started: bool = False

    async def close(self, grace_s: float) -> None:
        """Stop serving and free the address. A server bound but never started (the
        engine did not load) holds its port until it has run: start it, then stop it."""
        if not self.started:
            await self.server.start()
        await self.server.stop(grace_s if self.started else None)


def _bind_grpc(stack: contextlib.AsyncExitStack, config: SidecarConfig,
               access: _Access) -> _GrpcServer:
    """The gRPC server with its interceptors, its address bound (held from here on; a
    connection waits until :func:`_start_grpc` serves); stopped on the way out."""
    server_cfg = config.server
    max_bytes = server_cfg.max_message_mb * 1024 * 1024
    guard = ExceptionInterceptor(max_inflight_bytes=server_cfg.max_inflight_rpc_mb * 1024 * 1024)
    interceptors: list[grpc.aio.ServerInterceptor] = [guard]
    token_check = TokenInterceptor(access.token) if access.token is not None else None
    if token_check is not None:
        interceptors.insert(0, token_check)
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[("grpc.max_receive_message_length", max_bytes),
                 ("grpc.max_send_message_length", max_bytes)],
    )
    _bind(server, config, access.credentials)
    bound = _GrpcServer(server, guard, token_check)
    stack.push_async_callback(bound.close, server_cfg.shutdown_grace_s)
    if (socket_path := access.socket_path) is not None:
        stack.callback(lambda: socket_path.unlink(missing_ok=True))
    return bound


async def _start_grpc(bound: _GrpcServer, config: SidecarConfig, scheduler: Scheduler,
                      access: _Access, metrics: SidecarMetrics, *,
                      started_at: float) -> health.aio.HealthServicer:
    """The inference and health services on the bound server, started; returns the
    health servicer (still reporting nothing)."""
    server_cfg, server, token_check = config.server, bound.server, bound.token_check
    metrics.count_refused_calls(lambda: {
        "unauthenticated": token_check.refused if token_check is not None else 0,
        "resource_exhausted": bound.guard.refused_for_bytes})
    inference_pb2_grpc.add_InferenceServicer_to_server(
        InferenceServicer(scheduler, engine_kind=scheduler.engine.kind, started_at=started_at,
                          submit_yield_ms=server_cfg.submit_yield_ms,
                          intake_topic=config.intake.topic), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    socket_path = access.socket_path
    with socket_umask(server_cfg.socket_mode) if socket_path else contextlib.nullcontext():
        await server.start()
    bound.started = True
    if socket_path is not None:
        restrict_socket(socket_path, server_cfg.socket_mode)
    return health_servicer


async def _report_serving(health_servicer: health.aio.HealthServicer, scheduler: Scheduler,
                          config: SidecarConfig, access: _Access, sidecar_id: str, *,
                          warmup_s: float, destination: str) -> None:
    """Health turns ``SERVING`` (``NOT_SERVING`` if the engine died meanwhile), the
    start-up is logged and ``sts sidecar ready on ...`` printed."""
    serving = (health_pb2.HealthCheckResponse.SERVING if scheduler.engine_error is None
               else health_pb2.HealthCheckResponse.NOT_SERVING)
    for name in _HEALTH_NAMES:
        await health_servicer.set(name, serving)
    engine, listen = scheduler.engine, config.server.listen
    logger.info("Sidecar %s serving %s (%s engine, model %s, warm-up %.2f s, %s event "
                "loop) on %s (%s%s); results to %s.", sidecar_id, SERVICE_NAME, engine.kind,
                engine.model_name, warmup_s, running_loop_name(), listen,
                "TLS" if access.credentials else "plaintext",
                ", token required" if access.token else "", destination)
    print(f"sts sidecar ready on {listen}", flush=True)


async def _exit_after_engine_death(health_servicer: health.aio.HealthServicer,
                                   scheduler: Scheduler, server_cfg: ServerConfig,
                                   stop: asyncio.Event, sidecar_id: str) -> NoReturn:
    """The engine died: ``NOT_SERVING`` for ``engine_death_grace_s`` (or until ``stop``),
    then :class:`EngineDeadError`, which runs the shutdown and exits non-zero."""
    for name in _HEALTH_NAMES:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    logger.error("Engine died (%s): NOT_SERVING; exiting in %.1f s.",
                 scheduler.engine_error, server_cfg.engine_death_grace_s)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(server_cfg.engine_death_grace_s):
            await stop.wait()
    raise EngineDeadError(f"the engine died: {scheduler.engine_error} (sidecar {sidecar_id})")
