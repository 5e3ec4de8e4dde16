"""The harness's ``sts`` subcommands: ``demo``, ``validate``, ``events``, ``l1``/``kb`` from
:mod:`sts_harness.l1l2_commands` and ``trace`` from :mod:`sts_harness.trace_commands`.
Registered through ``sts.commands``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from collections.abc import Callable

from sidecar import ENGINES
from spark_ext.kinds import CHANNEL_SIDES, writer_choices

#: What a command prints when the extras it needs are not installed (the demo runs L1/L2
#: and draws plots).
SPARK_EXTRA_HINT = "install the Spark side with: pip install 'sts-spark[spark,l1l2,demo]'"


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``sts demo``, ``sts l1``, ``sts kb`` and ``sts trace`` to the ``sts`` parser."""
    from sts_harness import l1l2_commands, trace_commands

    l1l2_commands.register(sub)
    trace_commands.register(sub)
    for add in (_add_demo, _add_validate, _add_events, _add_s3_server, _add_connect_server):
        add(sub)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="run the whole system end to end on this machine")
    demo.add_argument("--rate", type=positive(float), default=None,
                      help="events per second (default: --overload x the model requests/s "
                           "the engine's warm-up measured, with --max-tokens cut so a high "
                           "answer fits 35 %% of its SLA at the full batch; 3 with "
                           "--engine simulated)")
    demo.add_argument("--overload", type=positive(float), default=None,
                      help="without --rate: offered model requests over the engine's "
                           "measured capacity (default 1.5)")
    demo.add_argument("--duration", type=positive(float), default=40.0,
                      help="seconds of replay")
    demo.add_argument("--out", default=None,
                      help="output folder; an existing one must be empty or an earlier "
                           "demo's (default: ./sts-demo, ./sts-demo-kafka with --source "
                           "kafka: each route its own)")
    demo.add_argument("--overwrite", action="store_true",
                      help="replace an earlier demo's output in --out")
    demo.add_argument("--engine", choices=ENGINES.names, default=ENGINES.default,
                      help="the sidecar's engine (simulated: a timing model, for a quick look)")
    demo.add_argument("--max-tokens", type=positive(int), default=48,
                      help="max_tokens of each request (at most, without --rate)")
    demo.add_argument("--l1l2", action=argparse.BooleanOptionalAction, default=True,
                      help="L1 routing (MiniLM + classifier), L2 retrieval (Milvus Lite) and "
                           "the feature lookup (on by default; --no-l1l2: every event to "
                           "the LLM)")
    demo.add_argument("--rollout", choices=["full", "canary", "shadow", "offline"],
                      default="full", help="rollout.mode of the pipeline (docs/rollout.md)")
    demo.add_argument("--canary-share", type=float, default=0.1,
                      help="share of events the model answers with --rollout canary")
    demo.add_argument("--source", choices=CHANNEL_SIDES.names, default=CHANNEL_SIDES.default,
                      help="events and results through files or Kafka topics")
    demo.add_argument("--bootstrap-servers", default=None, metavar="HOST:PORT",
                      help="with --source kafka: your cluster (default: a local broker "
                           "the demo starts for itself)")
    demo.add_argument("--writer", choices=writer_choices(), default=None,
                      help="output.writer: deltalake (delta-rs on the driver), spark (Delta "
                           "on Spark, what Databricks and Spark Connect run) or auto "
                           "(default: spark with SPARK_REMOTE set, else deltalake)")
    demo.add_argument("--warm-up", type=int, default=None, metavar="N",
                      help="tickets sent through the whole pipeline, and answered, before "
                           "the replay, so its first events do not pay for the cold start; "
                           "their rows (event ids warmup-...) count in no figure; 0: none "
                           "(default: 6)")
    demo.set_defaults(func=_run_demo)


def _add_validate(sub: argparse._SubParsersAction) -> None:
    validate = sub.add_parser("validate", help="rollout offline: L1-L4 over past events, "
                                               "model vs rule answers, a report table")
    validate.add_argument("--input", default=None,
                          help="Delta table, Parquet or JSON lines of past events "
                               "(default: the shipped sample tickets)")
    validate.add_argument("--out", default="./sts-validate",
                          help="output folder; an existing one must be empty or an earlier "
                               "sts validate's")
    validate.add_argument("--overwrite", action="store_true",
                          help="replace an earlier sts validate's output in --out")
    validate.add_argument("--config", default=None, help="pipeline YAML (tagging, template, "
                          "validation, routing, sidecar)")
    validate.add_argument("--engine", choices=ENGINES.names, default=ENGINES.default,
                          help="engine of the sidecar it starts")
    validate.add_argument("--endpoint", default=None,
                          help="use this running sidecar instead of starting one")
    validate.add_argument("--results-dir", default=None,
                          help="the result folder of --endpoint's sidecar")
    validate.add_argument("--key-columns", default=None,
                          help="comma-separated key columns of the events")
    validate.add_argument("--limit", type=int, default=None, help="only the first N events")
    validate.add_argument("--wave", type=int, default=16, help="requests in flight at once")
    validate.add_argument("--max-tokens", type=int, default=None,
                          help="tagging.max_tokens of the requests")
    validate.set_defaults(func=_run_validate)


def _add_events(sub: argparse._SubParsersAction) -> None:
    events = sub.add_parser("events", help="stream the sample tickets into a folder "
                                           "(the input of a spark-submit job)")
    events.add_argument("--to", required=True,
                        help="landing folder the job reads (source.path of its config)")
    events.add_argument("--rate", type=positive(float), default=2.0, help="events per second")
    events.add_argument("--duration", type=positive(float), default=60.0, help="seconds of replay")
    events.set_defaults(func=_run_events)


def _add_s3_server(sub: argparse._SubParsersAction) -> None:
    s3 = sub.add_parser(
        "s3-server", help="a local S3-compatible server (moto, in memory) with one bucket, "
                          "and the settings that point both writers at it; Ctrl-C stops it")
    s3.add_argument("--port", type=positive(int), default=9000, help="its port on 127.0.0.1")
    s3.add_argument("--bucket", default="sts", help="the bucket it creates")
    s3.add_argument("--prefix", default="sts", help="the key prefix of the printed locations")
    s3.set_defaults(func=_run_s3_server)


def _add_connect_server(sub: argparse._SubParsersAction) -> None:
    connect = sub.add_parser(
        "connect-server", help="a local Spark Connect server with the jars and settings the "
                               "pipeline needs (what Databricks serverless runs); Ctrl-C stops it")
    connect.add_argument("--port", type=positive(int), default=15002,
                         help="its gRPC port on 127.0.0.1 (SPARK_REMOTE=sc://127.0.0.1:PORT)")
    connect.add_argument("--work-dir", default="./sts-connect",
                         help="its log, warehouse and metastore")
    connect.add_argument("--with-s3", action="store_true",
                         help="also hadoop-aws, for s3a:// tables and checkpoints")
    connect.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                         help="a Spark setting of the server "
                              "(e.g. spark.hadoop.fs.s3a.endpoint=...)")
    connect.add_argument("--detach", action="store_true",
                         help="return once it serves, leaving it running (its pid in "
                              "--work-dir); stop it with --stop")
    connect.add_argument("--stop", action="store_true",
                         help="stop the server a --detach started in --work-dir")
    connect.set_defaults(func=_run_connect_server)


def positive(kind: type) -> "Callable[[str], float]":
    """An argparse ``type`` that takes numbers above zero only; argparse names the flag
    in its error (``argument --rate: must be > 0 (got -1)``).

    Example:
        >>> positive(float)("2.5"), positive(int)("3")
        (2.5, 3)
    """
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0 (got {text})")
        return value

    parse.__name__ = kind.__name__
    return parse


def _run_events(args: argparse.Namespace) -> int:
    """Replay the shipped tickets in real time; each run's events are new (unique ids)."""
    from pathlib import Path

    from sts_harness.demo import load_samples, sample_replayer

    if not (args.rate > 0 and args.duration > 0):
        print(f"sts events: --rate ({args.rate}) and --duration ({args.duration}) must be > 0",
              file=sys.stderr)
        return 2
    folder = Path(args.to).expanduser()
    if folder.exists() and not folder.is_dir():
        print(f"sts events: --to {folder} is a file, not a folder", file=sys.stderr)
        return 2
    replayer = sample_replayer(folder, args.rate, args.duration, load_samples(), unique_ids=True)
    print(f"sts events: {int(args.rate * args.duration)} sample tickets into {folder.resolve()} "
          f"at {args.rate:g}/s", flush=True)
    replayer.start()
    try:
        while replayer.is_alive():
            replayer.join(5.0)
            print(f"sts events: {replayer.offered} written", flush=True)
    except KeyboardInterrupt:
        replayer.stop()
        replayer.join()
        print(f"sts events: stopped after {replayer.offered}", flush=True)
    return 0


#: Settings that list class path entries: a value given adds to the one set already.
CLASS_PATH_CONFS = ("spark.driver.extraClassPath", "spark.executor.extraClassPath")


def set_conf(conf: dict[str, str], key: str, value: str) -> None:
    """``conf[key] = value``, except that a class path entry is added in front of the one
    already set (``localfs``'s jar must stay on it: Hadoop loads ``file:``'s class from it).

    Example:
        >>> conf = {"spark.driver.extraClassPath": "/ivy/localfs.jar"}
        >>> set_conf(conf, "spark.driver.extraClassPath", "/mine.jar")
        >>> set_conf(conf, "spark.sql.shuffle.partitions", "4")
        >>> conf["spark.driver.extraClassPath"].split(os.pathsep)
        ['/mine.jar', '/ivy/localfs.jar']
        >>> conf["spark.sql.shuffle.partitions"]
        '4'
    """
    if key in CLASS_PATH_CONFS and conf.get(key):
        value = os.pathsep.join([value, conf[key]])
    conf[key] = value


def _run_connect_server(args: argparse.Namespace) -> int:
    """Start the server, print how to reach it, keep it up until Ctrl-C."""
    from spark_ext.jvm_packages import session_conf
    from sts_harness.connect_server import ConnectServerError, SparkConnectServer

    work = Path(args.work_dir).expanduser().resolve()
    pid_file = work / "connect-server.pid"
    if args.stop:
        return _stop_detached(pid_file)
    conf = session_conf(["kafka", "delta", "localfs", *(["s3"] if args.with_s3 else [])])
    for item in args.conf:
        key, eq, value = item.partition("=")
        if not eq:
            return _fail(f"--conf {item!r} must be KEY=VALUE", "connect-server", 2)
        set_conf(conf, key, value)
    print(f"Starting a Spark Connect server on 127.0.0.1:{args.port} (Delta, Kafka"
          f"{', hadoop-aws' if args.with_s3 else ''}); log: {work / 'connect-server.log'} "
          "(the first start resolves the jars, up to a minute) ...", flush=True)
    server = SparkConnectServer(work, conf=conf, port=args.port)
    try:
        server.start()
    except ConnectServerError as e:
        return _fail(e, "connect-server", 1)
    if args.detach:
        assert server.proc is not None
        pid_file.write_text(str(server.proc.pid), encoding="utf-8")
        print(f"Serving (pid {server.proc.pid}): export SPARK_REMOTE={server.remote}; "
              f"stop it with: sts connect-server --stop --work-dir {args.work_dir}", flush=True)
        return 0
    print(f"Serving. In another shell:\n  export SPARK_REMOTE={server.remote}\n"
          "  sts demo --writer spark          # or your notebook, or StsPipeline(...)\n"
          "Ctrl-C stops the server.", flush=True)
    def exited() -> int | None:
        if server.proc is not None and server.proc.poll() is not None:
            return _fail(f"the server exited with code {server.proc.returncode}; log: "
                         f"{server.log_path}", "connect-server", 1)
        return None

    return _serve_until_stopped(server, "Spark Connect server", exited)


def _run_s3_server(args: argparse.Namespace) -> int:
    """Start moto's S3 with a bucket, print the settings for it, serve until Ctrl-C."""
    from sts_harness.s3_server import S3Server, S3ServerError, settings_text

    server = S3Server(args.bucket, port=args.port)
    try:
        server.start()
    except S3ServerError as e:
        return _fail(e, "s3-server", 1)
    print(f"S3 test server (moto; objects in memory, gone when it stops) on {server.endpoint}, "
          f"bucket {args.bucket}.\n{settings_text(server, args.prefix)}\nCtrl-C stops it.",
          flush=True)
    return _serve_until_stopped(server, "S3 test server", lambda: None)


def _serve_until_stopped(server, what: str, exited: Callable[[], int | None]) -> int:
    """Keep ``server`` up until Ctrl-C or SIGTERM (exit 0, "<what> stopped.") or until
    ``exited()`` returns an exit code (it died); stop it either way."""
    import signal
    import time

    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        while not stop["now"]:
            if (code := exited()) is not None:
                return code
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    print(f"{what} stopped.", flush=True)
    return 0


def _stop_detached(pid_file: Path) -> int:
    """SIGTERM to the process group of the server a ``--detach`` started, SIGKILL after
    30 s."""
    import os
    import signal
    import time

    try:
        pid = int(pid_file.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return _fail(f"no server started with --detach in {pid_file.parent}", "connect-server", 2)
    try:
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            os.killpg(pid, 0)
            time.sleep(0.5)
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    pid_file.unlink(missing_ok=True)
    print(f"Spark Connect server {pid} stopped.", flush=True)
    return 0


def _fail(e: BaseException | str, command: str, code: int) -> int:
    """Print the one-line error ``sts: <what> (sts <command>)``; return ``code``."""
    from sidecar import one_line

    print(f"sts: {one_line(e)} (sts {command})", file=sys.stderr)
    return code


def _run_validate(args: argparse.Namespace) -> int:
    try:
        import pyspark  # noqa: F401

        from sts_harness.validate import ValidateOptions, print_summary, run_validate
    except ImportError as e:
        print(f"sts: needs module {e.name!r}; {SPARK_EXTRA_HINT} (sts validate)",
              file=sys.stderr)
        return 2
    from spark_ext.exceptions import InputFileError, PipelineConfigError, SparkStartError

    keys = [k.strip() for k in args.key_columns.split(",") if k.strip()] \
        if args.key_columns else None
    try:
        opts = ValidateOptions(input=args.input, out=args.out, config=args.config,
                               engine=args.engine, endpoint=args.endpoint,
                               results_dir=args.results_dir, key_columns=keys,
                               limit=args.limit, wave=args.wave, max_tokens=args.max_tokens,
                               overwrite=args.overwrite)
        summary = run_validate(opts)
    except (InputFileError, PipelineConfigError, FileExistsError, NotADirectoryError,
            ValueError) as e:
        return _fail(e, "validate", 2)
    except SparkStartError as e:
        return _fail(e, "validate", 1)
    print_summary(summary)
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    try:
        import pyspark  # noqa: F401

        from sts_harness.demo import DemoOptions, default_out, print_summary, run_demo
    except ImportError as e:
        print(f"sts: needs module {e.name!r}; {SPARK_EXTRA_HINT} (sts demo)", file=sys.stderr)
        return 2
    try:
        from sts_harness.demo_sizing import DEFAULT_FACTOR

        opts = DemoOptions(rate=args.rate, overload=args.overload or DEFAULT_FACTOR,
                           duration=args.duration,
                           out=args.out or default_out(args.source),
                           engine=args.engine, max_tokens=args.max_tokens,
                           overwrite=args.overwrite, l1l2=args.l1l2,
                           rollout=args.rollout, canary_share=args.canary_share,
                           source=args.source, bootstrap_servers=args.bootstrap_servers,
                           writer=args.writer, owns_process=True,
                           **({} if args.warm_up is None else {"warm_up": args.warm_up}))
    except ValueError as e:
        return _fail(e, "demo", 2)
    from sts_harness.demo import DemoFailedError

    try:
        summary = run_demo(opts)
    except (FileExistsError, NotADirectoryError) as e:
        return _fail(e, "demo", 2)
    except DemoFailedError as e:  # a start-up step: its traceback is in the demo's log
        print("\n=== sts demo summary ===\nINCOMPLETE: nothing was replayed; "
              f"{e}", flush=True)
        return _fail(e, "demo", 1)
    print_summary(summary)
    if summary.get("incomplete"):
        print(f"sts demo: {summary['incomplete']}", file=sys.stderr)
        return 1
    return 0
