"""The sidecar's ``sts`` subcommands: ``model prepare``, ``sidecar`` and ``sidecar-stats``.

Registered through the ``sts.commands`` entry point; nothing here imports more
than ``argparse`` until a command runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.kinds import ENGINES

if TYPE_CHECKING:
    from sidecar.credentials import ClientSecurity

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
    p.add_argument("--engine", choices=ENGINES.names, help="engine kind")
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
    p.add_argument("--allow-insecure-remote", action="store_true", default=None,
                   help="allow a non-loopback address without TLS or a token (labs only)")
    p.set_defaults(func=_run_sidecar)

    stats = sub.add_parser("sidecar-stats", help="print a sidecar's live figures")
    stats.add_argument("--target", default=None,
                       help="sidecar address (default: server.listen of --config, else "
                            "127.0.0.1:50051)")
    stats.add_argument("--config", type=Path, default=None,
                       help="the sidecar's YAML config: its address and token source "
                            "(server.listen, server.token_file/token_env)")
    stats.add_argument("--json", action="store_true", help="print the raw GetStats answer")
    _add_client_security_flags(stats)
    stats.set_defaults(func=_run_sidecar_stats)


def _add_client_security_flags(p: argparse.ArgumentParser) -> None:
    """Flags naming a client's credentials; the token itself is never a flag."""
    p.add_argument("--tls-ca-file", help="PEM CA of the sidecar's certificate (use TLS)")
    p.add_argument("--tls-cert-file", help="PEM client certificate (mutual TLS)")
    p.add_argument("--tls-key-file", help="PEM client key (mutual TLS)")
    p.add_argument("--tls-server-name", help="name the sidecar's certificate is for")
    p.add_argument("--token-file", help="file holding the bearer token")
    p.add_argument("--token-env", default="STS_SIDECAR_TOKEN",
                   help="environment variable holding the bearer token, used when it is set "
                        "(default STS_SIDECAR_TOKEN)")


def client_security(args: argparse.Namespace) -> "ClientSecurity":
    """The :class:`~sidecar.credentials.ClientSecurity` the client flags describe."""
    import os

    from sidecar.credentials import ClientSecurity
    from sidecar.exceptions import ConfigError

    token_env = args.token_env if args.token_env and (
        os.environ.get(args.token_env) or args.token_env != "STS_SIDECAR_TOKEN") else None
    try:
        return ClientSecurity(tls_ca_file=args.tls_ca_file, tls_cert_file=args.tls_cert_file,
                              tls_key_file=args.tls_key_file,
                              tls_server_name=args.tls_server_name,
                              token_file=args.token_file, token_env=token_env)
    except ValueError as e:
        raise ConfigError(f"{e} (flags)") from None


def _parse_pairs(pairs: list[str], flag: str) -> dict:
    """``KEY=VALUE`` pairs; values are JSON when they parse, else strings."""
    from sidecar.exceptions import ConfigError

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected KEY=VALUE, got {pair!r} ({flag})")
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
    from sidecar.config import SidecarConfig
    from sidecar.event_loop import loop_factory
    from sidecar.event_loop import run as run_event_loop
    from sidecar.exceptions import ConfigError, one_line
    from sidecar.server import serve

    path = args.config or (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
    config = SidecarConfig.from_yaml(path) if path else SidecarConfig()
    flags = {
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
        "server.allow_insecure_remote": args.allow_insecure_remote,
    }
    try:
        config = config.with_overrides(flags)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{one_line(e)} (flags)") from None
    settings = _parse_pairs(args.settings, "--set")
    try:
        config = config.with_overrides(settings)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{one_line(e)} (--set)") from None
    if args.engine_arg:
        config.engine.engine_args.update(_parse_pairs(args.engine_arg, "--engine-arg"))
    try:
        loop_factory(config.server.event_loop)  # e.g. uvloop asked for, not installed
    except ValueError as e:
        raise ConfigError(str(e)) from None
    try:
        # This process is the sidecar's own: its event loop and GC settings are ours.
        run_event_loop(serve(config, gc_tuning=True), config.server.event_loop)
    except KeyboardInterrupt:  # a second Ctrl-C while draining
        return 130
    return 0


def _run_sidecar_stats(args: argparse.Namespace) -> int:
    import os

    import grpc
    from google.protobuf.json_format import MessageToDict

    from sidecar.client import SidecarClient, describe_rpc_error
    from sidecar.exceptions import SidecarUnreachableError
    from sidecar.stats_report import format_stats

    if args.config is not None:
        from sidecar.config import SidecarConfig

        server = SidecarConfig.from_yaml(args.config).server
        args.target = args.target or server.listen
        if not args.token_file and not (args.token_env and os.environ.get(args.token_env)):
            args.token_file, args.token_env = server.token_file, server.token_env
    args.target = args.target or "127.0.0.1:50051"
    with SidecarClient(args.target, security=_client_security_or_exit(args)) as client:
        try:
            stats = client.stats()
        except grpc.RpcError as e:
            raise SidecarUnreachableError(describe_rpc_error(e, args.target)) from None
    print(json.dumps(MessageToDict(stats), indent=2) if args.json else format_stats(stats))
    return 0


def _client_security_or_exit(args: argparse.Namespace) -> "ClientSecurity":
    """The flags' credentials, with the token and PEM files read now (one-line errors)."""
    from sidecar.client import channel_credentials
    from sidecar.exceptions import ConfigError

    security = client_security(args)
    try:
        security.token()
        channel_credentials(security)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return security
