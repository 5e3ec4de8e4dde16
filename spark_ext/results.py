"""The results stream: the sidecar's Parquet landing directory read with Spark's file source."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from sidecar.result_schema import RESULT_SCHEMA

#: Result id the pipeline's drain step writes to move the results watermark.
HEARTBEAT_ID = "__sts_heartbeat__"

_ARROW_TO_SPARK: dict[pa.DataType, DataType] = {
    pa.string(): StringType(), pa.int32(): IntegerType(), pa.int64(): LongType(),
    pa.float64(): DoubleType(), pa.bool_(): BooleanType(),
}


def spark_schema(schema: pa.Schema) -> StructType:
    """Spark schema of an Arrow schema of flat primitive columns."""
    return StructType([StructField(f.name, _ARROW_TO_SPARK[f.type], True) for f in schema])


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
