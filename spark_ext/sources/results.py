"""L0: the sidecar's results as a stream, one reader per result channel (the sidecar's
``results.kind``): :data:`spark_ext.kinds.RESULT_READERS` maps each channel to its reader
(:func:`read_result_files` here, :func:`spark_ext.sources.kafka.read_result_topics`). Every reader
yields the result columns of ``sidecar.contract.RESULT_SCHEMA``."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from spark_ext.config import PipelineConfig
from spark_ext.kinds import RESULT_READERS
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


def read_results(spark: SparkSession, config: PipelineConfig) -> DataFrame:
    """The results stream of ``config.sidecar.result_channel`` (its reader in
    :data:`spark_ext.kinds.RESULT_READERS`)."""
    return RESULT_READERS.load(config.sidecar.result_channel)(spark, config)
