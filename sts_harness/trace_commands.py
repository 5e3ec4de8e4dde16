"""``sts trace receive`` and ``sts trace show``: look at traces without a collector.

Registered by :func:`sts_harness.commands.register`. Mistakes end with one line on
stderr (``sts: <what> (<where>)``) and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``sts trace receive`` and ``sts trace show`` to the ``sts`` parser."""
    trace = sub.add_parser("trace", help="OpenTelemetry traces: receive and show them")
    trace_sub = trace.add_subparsers(dest="trace_command", required=True)
    receive = trace_sub.add_parser("receive", help="an OTLP/gRPC receiver writing spans "
                                                   "as JSON lines (until Ctrl-C)")
    receive.add_argument("--addr", default="127.0.0.1", help="address to listen on")
    receive.add_argument("--port", type=int, default=4317, help="port (OTLP/gRPC: 4317)")
    receive.add_argument("--out", default="spans.jsonl", help="file the spans are appended to")
    receive.set_defaults(func=_run_receive)
    show = trace_sub.add_parser("show", help="one trace as an indented tree with durations")
    show.add_argument("spans", help="a file written by `sts trace receive`")
    show.add_argument("--trace-id", default=None,
                      help="the trace (default: the one with the most spans)")
    show.set_defaults(func=_run_show)


def _run_receive(args: argparse.Namespace) -> int:
    from sts_harness.trace_receiver import TraceReceiver

    try:
        receiver = TraceReceiver(args.addr, args.port, args.out)
    except OSError as e:
        print(f"sts: {e} (--addr/--port)", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with receiver:
        print(f"sts trace receive: listening on {args.addr}:{receiver.port}, spans appended "
              f"to {args.out}; send with OTEL_EXPORTER_OTLP_ENDPOINT={receiver.endpoint}",
              flush=True)
        stop.wait()
    print(f"sts trace receive: {len(receiver.spans)} spans received.", flush=True)
    return 0


def _run_show(args: argparse.Namespace) -> int:
    from sts_harness.trace_show import pick_trace, read_spans, render_trace

    try:
        spans = read_spans(args.spans)
    except OSError as e:
        print(f"sts: cannot read the spans: {e.strerror or e} ({args.spans})", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"sts: {e} ({args.spans})", file=sys.stderr)
        return 2
    trace_id = pick_trace(spans, args.trace_id)
    if trace_id is None:
        where = f"--trace-id {args.trace_id}" if args.trace_id else args.spans
        print(f"sts: no such trace ({where})", file=sys.stderr)
        return 2
    try:
        print(f"trace {trace_id}")
        print("\n".join(render_trace(spans, trace_id)), flush=True)
    except BrokenPipeError:  # `| head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
