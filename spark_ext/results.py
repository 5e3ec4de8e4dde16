"""The results stream: the sidecar's Parquet landing directory read with Spark's file source."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sidecar.contract import RESULT_SCHEMA
from spark_ext.schemas import spark_schema

#: Result id the pipeline's drain step writes to move the results watermark.
HEARTBEAT_ID = "__sts_heartbeat__"

RESULT_SPARK_SCHEMA = spark_schema(RESULT_SCHEMA)


def read_results(spark: SparkSession, results_dir: str, *, max_files_per_trigger: int = 200
                 ) -> DataFrame:
    """Stream the sidecar's results with a fixed schema (never inferred).

    Adds ``result_time`` (timestamp of ``finish_ts``), the event-time column of
    the join. Hidden temporary files (``.part-*``) are ignored by Spark.
    """
    return (spark.readStream.schema(RESULT_SPARK_SCHEMA)
            .option("maxFilesPerTrigger", max_files_per_trigger)
            .parquet(results_dir)
            .withColumn("result_time", F.timestamp_millis("finish_ts")))
