"""The gateway's CPU per request, in process: no gRPC transport, no second process.

Drives what ``SubmitBatch`` does per request inside one event loop, with the
settings of ``python -m benchmarks.gateway_overhead`` (the simulated engine
absorbing at once, every limit out of the way): parse the wire bytes, build the
domain requests, admit them, build and serialise the acks, then let the
dispatcher, the serving tasks and the engine run until every request has its
result, write the result rows as Parquet and count them in the metrics. Reports
CPU microseconds per request (``time.process_time``), so a busy shared machine
changes it less than wall time.

Example:
    PYTHONPATH=. python scripts/gateway_inprocess.py --requests 100000 --batch 64
    PYTHONPATH=. python scripts/gateway_inprocess.py --loop asyncio   # without uvloop
    PYTHONPATH=. python scripts/gateway_inprocess.py --profile cprofile   # top functions
    PYTHONPATH=. python scripts/gateway_inprocess.py --profile pyinstrument  # pip install pyinstrument
    PYTHONPATH=. python scripts/gateway_inprocess.py --trace otlp  # every request traced,
        # spans exported by OTLP/gRPC to `sts trace receive` in a child process
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks.gateway_load import make_batch
from benchmarks.gateway_sidecar import MAX_IN_FLIGHT, SIDECAR_SETTINGS
from sidecar.config import SidecarConfig
from sidecar.contract import TRACEPARENT, format_traceparent
from sidecar.engines import build_engine
from sidecar.event_loop import EVENT_LOOPS
from sidecar.event_loop import run as run_event_loop
from sidecar.metrics import SidecarMetrics
from sidecar.pb.sts.v1 import inference_pb2 as pb
from sidecar.result_channels import build_result_channel
from sidecar.scheduler import Scheduler
from sidecar.server import tune_gc
from sidecar.servicer import InferenceServicer
from sts_harness.process import free_port


def _config(results_dir: str) -> SidecarConfig:
    overrides = {**SIDECAR_SETTINGS, "engine.kind": "simulated",
                 "scheduler.max_in_flight": MAX_IN_FLIGHT,
                 "results.results_dir": results_dir, "server.sidecar_id": "inprocess"}
    return SidecarConfig().with_overrides(overrides)


def _traced(wire: bytes, n: int, sampled: bool) -> bytes:
    """The batch with a ``traceparent`` attribute on every request."""
    msg = pb.SubmitBatchRequest.FromString(wire)
    for i, r in enumerate(msg.requests):
        r.attributes[TRACEPARENT] = format_traceparent(f"{n + i + 1:032x}", f"{n + i + 1:016x}",
                                                       sampled)
    return msg.SerializeToString()


def _receiver(results_dir: str) -> tuple[subprocess.Popen[bytes], str]:
    """`sts trace receive` in a child process (its CPU is not the gateway's)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sidecar.cli", "trace", "receive",
                             "--port", str(port), "--out", f"{results_dir}/spans.jsonl"],
                            stdout=subprocess.DEVNULL)
    time.sleep(2.0)
    return proc, f"http://127.0.0.1:{port}"


async def _run(requests: int, batch: int, results_dir: str,
               profiler: cProfile.Profile | None, trace: str = "off", split: bool = False
               ) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, rows written) for ``requests`` requests."""
    config = _config(results_dir)
    tracer = None
    if trace != "off":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        from sidecar import Tracing
        from sidecar.tracing import SidecarTracer

        os.environ.setdefault("OTEL_BSP_MAX_QUEUE_SIZE", "1000000")  # drop no span
        receiver, endpoint = _receiver(results_dir)
        tracer = SidecarTracer(Tracing("sidecar", "sts-sidecar", exporter=OTLPSpanExporter(
            endpoint=endpoint, insecure=True)))
    engine = build_engine(config.engine)
    await engine.start()
    writer = build_result_channel(config.results, "inprocess")
    writer.on_written = tracer.written if tracer is not None else None
    writer.start()
    metrics: SidecarMetrics | None = None

    def emit(record) -> None:  # type: ignore[no-untyped-def]
        writer.emit(record)
        if metrics is not None:
            metrics.observe(record)

    scheduler = Scheduler(engine, emit, config.scheduler, "inprocess")
    scheduler.tracer = tracer
    scheduler.start()
    metrics = SidecarMetrics(scheduler)
    servicer = InferenceServicer(scheduler, engine_kind=engine.kind, started_at=0.0)
    wires = [make_batch("p", i, batch).SerializeToString()
             for i in range(0, requests, batch)]
    if tracer is not None:
        wires = [_traced(w, i * batch, trace == "otlp") for i, w in enumerate(wires)]
    await asyncio.sleep(0.05)
    tune_gc()  # as the server does once started
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if profiler:
        profiler.enable()
    submit_cpu = 0.0
    # Reading the process's CPU clock is a system call (tens of microseconds on a busy
    # machine): per batch only with --split, or it would dominate small batches.
    clock = time.process_time if split else (lambda: 0.0)
    for wire in wires:
        t0 = clock()
        msg = pb.SubmitBatchRequest.FromString(wire)
        reply = await servicer.SubmitBatch(msg, None)  # type: ignore[arg-type]
        reply.SerializeToString()
        submit_cpu += clock() - t0
        await asyncio.sleep(0)  # let the dispatcher and the engine run, as between RPCs
    await scheduler.wait_idle()
    t0 = time.process_time()
    await writer.flush()
    if tracer is not None:  # every span exported, on this process's CPU
        tracer.tracing.flush(60.0)
    flush_cpu = time.process_time() - t0
    if profiler:
        profiler.disable()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(f"  submit {submit_cpu / requests * 1e6:.1f} us (--split), "
          f"final flush {flush_cpu / requests * 1e6:.1f} us, "
          f"writer files {writer.files_written}", flush=True)
    await scheduler.drain(1.0)
    await writer.close()
    await engine.shutdown()
    if tracer is not None:
        tracer.shutdown()
        time.sleep(0.5)
        receiver.send_signal(signal.SIGINT)
        receiver.wait(10)
        with open(f"{results_dir}/spans.jsonl") as f:
            print(f"  spans received: {sum(1 for _ in f)}", flush=True)
    return cpu, wall, writer.rows_written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=64_000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3, help="runs; the best is reported")
    p.add_argument("--profile", choices=("cprofile", "pyinstrument"), default=None)
    p.add_argument("--trace", choices=("off", "otlp", "unsampled"), default="off",
                   help="otlp: every request carries a sampled traceparent; spans go by "
                        "OTLP/gRPC to `sts trace receive` in a child process; unsampled: "
                        "tracing on, every traceparent's sampled flag off")
    p.add_argument("--loop", choices=EVENT_LOOPS, default="auto",
                   help="event loop, as the sidecar's server.event_loop (default auto: uvloop "
                        "where installed)")
    p.add_argument("--split", action="store_true",
                   help="also report the CPU time of the SubmitBatch calls alone")
    args = p.parse_args(argv)
    best = None
    for _ in range(args.repeat):
        profiler = cProfile.Profile() if args.profile == "cprofile" else None
        sampler = None
        if args.profile == "pyinstrument":
            from pyinstrument import Profiler
            sampler = Profiler(interval=0.0002, async_mode="disabled")
            sampler.start()
        with tempfile.TemporaryDirectory() as tmp:
            cpu, wall, rows = run_event_loop(_run(args.requests, args.batch, tmp, profiler,
                                                  args.trace, args.split), args.loop)
        if sampler:
            sampler.stop()
            print(sampler.output_text(unicode=False, color=False, show_all=False))
        n = (args.requests + args.batch - 1) // args.batch * args.batch
        if rows != n:
            print(f"expected {n} result rows, got {rows}", file=sys.stderr)
            return 1
        us = cpu / n * 1e6
        print(f"{n} requests, batch {args.batch}: {us:.1f} us CPU/request, "
              f"{wall / n * 1e6:.1f} us wall/request", flush=True)
        best = us if best is None else min(best, us)
        if profiler:
            pstats.Stats(profiler).sort_stats("tottime").print_stats(35)
    print(f"best: {best:.1f} us CPU/request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
