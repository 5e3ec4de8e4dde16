"""L0: the sidecar's results as a stream, one reader per result channel (the sidecar's
``results.kind``): :data:`RESULT_READERS` maps each channel to its reader. Every reader
yields the result columns of ``sidecar.contract.RESULT_SCHEMA``."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession

from spark_ext.config import PipelineConfig
from spark_ext.sources.kafka import read_result_topics
from spark_ext.sources.result_files import SOURCE_NAME, register_results_source


def read_result_files(spark: SparkSession, config: PipelineConfig) -> DataFrame:
    """The ``files`` channel: the sidecars' Parquet landing folder
    (``sidecar.results_dir``) through the ``sts_results`` source
    (:mod:`spark_ext.sources.result_files`), read files kept
    ``maintenance.results_retention_s``."""
    register_results_source(spark)
    return (spark.readStream.format(SOURCE_NAME)
            .option("path", config.sidecar.results_dir)
            .option("retentionSeconds", str(config.maintenance.results_retention_s))
            .load())


#: Result channel -> the reader of its stream.
RESULT_READERS: dict[str, Callable[[SparkSession, PipelineConfig], DataFrame]] = {
    "files": read_result_files,
    "kafka": read_result_topics,
}


def read_results(spark: SparkSession, config: PipelineConfig) -> DataFrame:
    """The results stream of ``config.sidecar.result_channel``."""
    return RESULT_READERS[config.sidecar.result_channel](spark, config)
