"""The pipeline as a ``spark-submit`` job.

    spark-submit --master 'local[2]' spark_ext/job.py --config conf/pipeline.yaml

Runs the three STS queries until they stop or the job is interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="sts-spark streaming job")
    parser.add_argument("--config", default="conf/pipeline.yaml", help="pipeline YAML")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop after this many seconds (default: run until stopped)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from pyspark.sql import SparkSession

    from spark_ext.config import PipelineConfig
    from spark_ext.exceptions import PipelineConfigError, PipelineFailedError
    from spark_ext.pipeline import StsPipeline

    try:
        config = PipelineConfig.from_yaml(args.config)
    except PipelineConfigError as e:
        print(f"sts: {e}", file=sys.stderr)
        return 2
    spark = SparkSession.builder.appName("sts-spark").getOrCreate()
    pipeline = StsPipeline(spark, config)
    pipeline.start()
    try:
        pipeline.await_termination(args.timeout)
    except KeyboardInterrupt:
        pass
    except PipelineFailedError as e:
        print(f"sts job: {e}", file=sys.stderr)
        return 1
    finally:
        pipeline.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
