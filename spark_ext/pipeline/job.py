"""The pipeline as a ``spark-submit`` job.

    sts sidecar &                                      # or a sidecar per GPU on a cluster
    spark-submit --master 'local[2]' spark_ext/pipeline/job.py --config conf/pipeline.yaml \\
        --until-idle 30 &
    sts events --to sts-job/events --rate 2 --duration 60

Runs the STS queries until they are stopped (Ctrl-C, SIGTERM), ``--timeout`` passes, or,
with ``--until-idle``, events came and then none for that many seconds and every
submitted request has its answer. Prints a progress line every ``--progress`` seconds. Relative paths in
the config are relative to the config file. Exit codes: 0 done, 1 a query or ticker
died (one line on stderr), 2 a bad config or flag.
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
    return parser


def _session(app_name: str):  # -> SparkSession (pyspark is imported lazily)
    """The submitted session; in local mode its Python workers run this interpreter
    (the job's venv) unless ``PYSPARK_PYTHON`` says otherwise."""
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    from spark_ext.session import pin_python_workers, quiet_py4j

    if SparkConf().get("spark.master", "local").startswith("local"):
        pin_python_workers()
    spark = SparkSession.builder.appName(app_name).getOrCreate()
    quiet_py4j()
    return spark


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
    spark = _session("sts-spark")
    pipeline = StsPipeline(spark, config)
    print(f"sts job: events {config.source.path}, results {config.sidecar.results_dir}, "
          f"tables {config.output.out_dir}, sidecar {config.sidecar.endpoint}", flush=True)
    pipeline.start()
    started = last_event = last_print = time.monotonic()
    seen_rows = 0
    reason = "stopped"
    try:
        while True:
            pipeline.check()
            now = time.monotonic()
            rows = pipeline.submitted
            if rows > seen_rows:
                seen_rows, last_event = rows, now
            pending = pipeline.safety_net.unanswered()
            if args.progress and now - last_print >= args.progress:
                last_print = now
                stats = pipeline.store.stats
                print(f"[{now - started:6.1f}s] submitted {rows}, answers "
                      f"{stats.answers_written} {dict(stats.by_source)}, waiting {pending}",
                      flush=True)
            if args.timeout is not None and now - started >= args.timeout:
                reason = f"--timeout {args.timeout:g} s"
                break
            if (args.until_idle is not None and seen_rows and pending == 0
                    and now - last_event >= args.until_idle):
                reason = f"idle for {args.until_idle:g} s, every request answered"
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        reason = "interrupted"
    except PipelineFailedError as e:
        print(f"sts job: {e}", file=sys.stderr)
        return 1
    finally:
        pipeline.stop()
    stats = pipeline.store.stats
    print(f"sts job: {reason}; submitted {pipeline.submitted}, answers "
          f"{stats.answers_written} {dict(stats.by_source)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
