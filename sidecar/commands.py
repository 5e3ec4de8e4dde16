"""The sidecar's ``sts`` subcommands: ``model prepare``, ``sidecar`` and ``sidecar-stats``.

Registered through the ``sts.commands`` entry point; nothing here imports more
than ``argparse`` until a command runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DEFAULT_CONFIG = Path("conf/sidecar.yaml")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the sidecar's subcommands to the ``sts`` parser."""
    model = sub.add_parser("model", help="model files")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    prep = model_sub.add_parser("prepare", help="convert the packaged SmolLM2 GGUF for vLLM")
    prep.add_argument("--cache-dir", type=Path, default=None,
                      help="cache root (default $STS_CACHE_DIR or ~/.cache/sts-spark)")
    prep.add_argument("--force", action="store_true", help="convert again")
    prep.set_defaults(func=_run_model_prepare)

    p = sub.add_parser("sidecar", help="run the gRPC gateway in front of vLLM")
    p.add_argument("--config", type=Path, default=None,
                   help=f"YAML config (default: {DEFAULT_CONFIG} if it exists)")
    p.add_argument("--listen", help="host:port or unix:///path.sock")
    p.add_argument("--results-dir", help="landing directory for result Parquet files")
    p.add_argument("--engine", choices=["vllm", "simulated"], help="engine kind")
    p.add_argument("--model", help="model folder (default: prepared SmolLM2)")
    p.add_argument("--max-in-flight", type=int, help="most requests inside the engine at once")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    p.add_argument("--metrics-addr", help="address of /metrics (default 127.0.0.1)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=JSON", dest="settings",
                   help="override any config key, e.g. --set scheduler.pools.low.max_queued=500")
    p.add_argument("--sidecar-id", help="identity written into every result")
    p.add_argument("--drain-timeout", type=float, help="seconds to drain on SIGTERM")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=JSON",
                   help="extra vLLM AsyncEngineArgs, e.g. --engine-arg max_num_seqs=4")
    p.add_argument("--log-requests", action="store_true", default=None,
                   help="log every request")
    p.set_defaults(func=_run_sidecar)

    stats = sub.add_parser("sidecar-stats", help="print a sidecar's live figures")
    stats.add_argument("--target", default="127.0.0.1:50051", help="sidecar address")
    stats.add_argument("--json", action="store_true", help="print the raw GetStats answer")
    stats.set_defaults(func=_run_sidecar_stats)


def _parse_pairs(pairs: list[str], flag: str) -> dict:
    """``KEY=VALUE`` pairs; values are JSON when they parse, else strings."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"{flag} expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _run_model_prepare(args: argparse.Namespace) -> int:
    from sidecar.model_prep import prepare_default_model

    print(prepare_default_model(args.cache_dir, force=args.force))
    return 0


def _run_sidecar(args: argparse.Namespace) -> int:
    import asyncio

    from sidecar.config import SidecarConfig
    from sidecar.server import serve

    path = args.config or (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
    config = SidecarConfig.from_yaml(path) if path else SidecarConfig()
    config = config.with_overrides({
        "server.listen": args.listen,
        "server.sidecar_id": args.sidecar_id,
        "server.log_requests": args.log_requests,
        "results.results_dir": args.results_dir,
        "engine.kind": args.engine,
        "engine.model": args.model,
        "scheduler.max_in_flight": args.max_in_flight,
        "scheduler.drain_timeout_s": args.drain_timeout,
        "server.metrics_port": args.metrics_port,
        "server.metrics_addr": args.metrics_addr,
    })
    try:
        config = config.with_overrides(_parse_pairs(args.settings, "--set"))
    except ValueError as e:
        raise SystemExit(f"sts sidecar: {e}") from None
    if args.engine_arg:
        config.engine.engine_args.update(_parse_pairs(args.engine_arg, "--engine-arg"))
    asyncio.run(serve(config))
    return 0


def _run_sidecar_stats(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from sidecar.client import SidecarClient
    from sidecar.stats_report import format_stats

    with SidecarClient(args.target) as client:
        stats = client.stats()
    print(json.dumps(MessageToDict(stats), indent=2) if args.json else format_stats(stats))
    return 0
