"""The pipeline as a ``spark-submit`` job.

    sts sidecar &                                      # or a sidecar per GPU on a cluster
    spark-submit --master 'local[2]' spark_ext/pipeline/job.py --config conf/pipeline.yaml \\
        --until-idle 30 &
    sts events --to sts-job/events --rate 2 --duration 60

Runs the STS queries until they are stopped (Ctrl-C, SIGTERM), ``--timeout`` passes, or,
with ``--until-idle``, events came and then none for that many seconds, the answers
query has read the acks of the last events, and every submitted request has its answer.
Prints a progress line every ``--progress`` seconds;
Python's log and every traceback go to ``--log`` (default ``sts-job.log``), Spark's log is
at ``--spark-log-level`` (default WARN). Relative paths in the config are relative to
the config file. Exit codes: 0 done, 1 a part failed (Spark did not start, a query
could not start or died: one line on stderr naming it and the log), 2 a bad config or
flag.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spark_ext/pipeline/job.py",
                                     description="sts-spark streaming job")
    parser.add_argument("--config", default="conf/pipeline.yaml", help="pipeline YAML")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop after this many seconds (default: run until stopped)")
    parser.add_argument("--until-idle", type=float, default=None, metavar="SECONDS",
                        help="after the first event: stop once no event came for SECONDS "
                             "and every request submitted has its answer")
    parser.add_argument("--progress", type=float, default=5.0, metavar="SECONDS",
                        help="seconds between progress lines (0: none)")
    parser.add_argument("--log", default=None, metavar="FILE",
                        help="Python's log and the tracebacks of failures (default: job.log "
                             "next to the config's local checkpoint folder, else ./sts-job.log)")
    parser.add_argument("--spark-log-level", default="WARN", metavar="LEVEL",
                        help="Spark's log level (INFO shows every task)")
    return parser


def _fail(part: str, e: BaseException, log: str, code: int = 1) -> int:
    """Log ``e`` with its traceback; print one line: what failed, why, where the log is."""
    from spark_ext.pipeline.sts_pipeline import one_line_reason

    logging.getLogger("sts.job").error("%s failed.", part, exc_info=e)
    print(f"sts job: {part} failed: {one_line_reason(e)} (log: {log})", file=sys.stderr,
          flush=True)
    return code


def _session(app_name: str, log_level: str):  # -> SparkSession (pyspark imported lazily)
    """The submitted session; in local mode its Python workers run this interpreter
    (the job's venv) unless ``PYSPARK_PYTHON`` says otherwise. Unless the submit sets
    them: Spark logs at ``log_level`` from the SparkContext's start on
    (``spark.log.level``: ``setLogLevel`` after the start would let its ~50 INFO lines
    through first), and a submit that brings delta-spark's jar gets Delta's SQL
    extension, catalog and few log partitions (``spark_ext.jvm_packages.DELTA_SESSION_CONF``),
    so ``--packages "$(python -m spark_ext.jvm_packages)"`` alone makes the ``spark``
    writer work."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    from spark_ext.jvm_packages import DELTA_SESSION_CONF
    from spark_ext.session import pin_python_workers, quiet_jvm_loggers, quiet_py4j

    SparkContext._ensure_initialized()  # spark-submit's JVM: its conf is readable now
    conf = SparkConf()
    if conf.get("spark.master", "local").startswith("local"):
        pin_python_workers()
    builder = SparkSession.builder.appName(app_name)
    defaults = {"spark.log.level": log_level}
    if _submitted_with_delta(conf):  # Delta's jar without its settings: add them
        defaults.update(DELTA_SESSION_CONF)
    for key, value in defaults.items():
        if not conf.contains(key):
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    quiet_jvm_loggers(spark)
    quiet_py4j()
    return spark


def _submitted_with_delta(conf) -> bool:
    """Whether the submit brought delta-spark's jar (``--packages`` or ``--jars``).

    Example:
        >>> from pyspark import SparkConf
        >>> conf = SparkConf(loadDefaults=False)
        >>> _submitted_with_delta(conf.set("spark.jars.packages", "io.delta:delta-spark_2.13:4.4.0"))
        True
    """
    jars = f"{conf.get('spark.jars.packages', '')},{conf.get('spark.jars', '')}"
    return "delta-spark" in jars


def _default_log(config) -> str:
    """``job.log`` beside the checkpoint folder when it is local, else ``./sts-job.log``."""
    from spark_ext.uris import is_local_uri, local_path

    if config is not None and is_local_uri(config.output.checkpoint_dir):
        folder = local_path(config.output.checkpoint_dir).parent
        folder.mkdir(parents=True, exist_ok=True)
        return str(folder / "job.log")
    return "sts-job.log"


def main(argv: list[str] | None = None) -> int:
    """Run the job; SIGTERM stops it as Ctrl-C does (:mod:`sidecar.interrupts`): the
    queries stopped, the last line printed, exit code 0 once they ran, else 130/143."""
    from sidecar.interrupts import sigterm_as_interrupt, stopped

    try:
        with sigterm_as_interrupt():
            return _main(argv)
    except KeyboardInterrupt as e:  # before the queries ran
        what, code = stopped(e)
        print(f"sts job: {what} before the queries ran", file=sys.stderr)
        return code


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    for name, value in (("--timeout", args.timeout), ("--until-idle", args.until_idle)):
        if value is not None and not value > 0:
            print(f"sts: {name} must be > 0 seconds (got {value}) (spark_ext/pipeline/job.py)",
                  file=sys.stderr)
            return 2

    from spark_ext.config import PipelineConfig
    from spark_ext.exceptions import PipelineConfigError, PipelineFailedError
    from spark_ext.pipeline.sts_pipeline import StsPipeline

    try:
        config = PipelineConfig.from_yaml(args.config)
    except PipelineConfigError as e:  # one line that names the file
        print(f"sts: {e}", file=sys.stderr)
        return 2
    args.log = args.log or _default_log(config)
    logging.basicConfig(filename=args.log, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        spark = _session("sts-spark", args.spark_log_level)
    except Exception as e:  # noqa: BLE001 - reported in one line, the traceback logged
        return _fail("Spark", e, args.log)
    try:
        pipeline = StsPipeline(spark, config)
    except PipelineConfigError as e:
        return _fail("the pipeline's configuration", e, args.log, code=2)
    source = (config.source.options.get("subscribe") or config.source.options.get(
        "subscribePattern") or "kafka") if config.source.format == "kafka" \
        else config.source.path
    print(f"sts job: events {source}, results {pipeline.channel.source()}, tables {config.output.out_dir} "
          f"(writer {pipeline.writer}), sidecar {config.sidecar.endpoint}; log {args.log}",
          flush=True)
    try:
        pipeline.start()
    except KeyboardInterrupt:
        pipeline.stop()
        raise
    except PipelineConfigError as e:
        pipeline.stop()
        return _fail("starting the pipeline", e, args.log, code=2)
    except Exception as e:  # noqa: BLE001 - a query the planner refused, a broker down, ...
        pipeline.stop()
        return _fail("starting the pipeline", e, args.log)
    return _run(pipeline, args, PipelineFailedError)


def _run(pipeline, args, failed: type[Exception]) -> int:
    """Progress lines until done; returns the exit code."""
    from sidecar.interrupts import stopped

    started = last_event = last_print = time.monotonic()
    seen_rows = 0
    reason = "stopped"
    try:
        while True:
            pipeline.check()
            now = time.monotonic()
            rows = pipeline.events_read()
            if rows > seen_rows:
                seen_rows, last_event = rows, now
            pending = pipeline.open_requests
            if args.progress and now - last_print >= args.progress:
                last_print = now
                stats = pipeline.store.stats
                print(f"[{now - started:6.1f}s] events {rows}, answers "
                      f"{stats.answers_written} {dict(stats.by_source)}, waiting {pending}",
                      flush=True)
            if args.timeout is not None and now - started >= args.timeout:
                reason = f"--timeout {args.timeout:g} s"
                break
            if (args.until_idle is not None and seen_rows and pending == 0
                    and now - last_event >= args.until_idle
                    and pipeline.answers_caught_up()):
                reason = f"idle for {args.until_idle:g} s, every request answered"
                break
            time.sleep(0.5)
    except KeyboardInterrupt as e:
        reason = stopped(e)[0]
    except failed as e:
        logging.getLogger("sts.job").error("The pipeline failed: %s", e)
        print(f"sts job: {e} (log: {args.log})", file=sys.stderr)
        return 1
    finally:
        pipeline.stop()
    stats = pipeline.store.stats
    print(f"sts job: {reason}; events {pipeline.events_read()}, answers "
          f"{stats.answers_written} {dict(stats.by_source)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
