"""L0: events from files landing in a folder, and Spark's ``rate`` source."""

from __future__ import annotations

from typing import ClassVar

from pyspark.sql import DataFrame, SparkSession

from spark_ext import storage
from spark_ext.sources.base import EventSource
from spark_ext.uris import is_local_uri


class FileEventSource(EventSource):
    """Event files landing in ``source.path``, read with Spark's file source and the fixed
    ``source.schema`` (a streaming file source never infers it), at most
    ``maxFilesPerTrigger`` (default 50) files a micro-batch."""

    DEFAULT_OPTIONS: ClassVar[dict[str, str]] = {"maxFilesPerTrigger": "50"}

    def read_stream(self, spark: SparkSession) -> DataFrame:
        src = self.config
        return spark.readStream.schema(src.schema) \
            .options(**{**self.DEFAULT_OPTIONS, **src.options}) \
            .format(src.format).load(src.path)

    def local_folder(self) -> str | None:
        return self.config.path if is_local_uri(self.config.path) else None

    def warm_up_events(self, spark: SparkSession, folder: str) -> DataFrame | None:
        """One all-null event written once into ``folder`` (in the source's format) and
        read back with the source's reader; an existing file there is reused, nothing is
        ever overwritten."""
        src = self.config
        if not storage.exists(spark, folder):
            schema = spark.createDataFrame([], src.schema).schema
            event = spark.createDataFrame([(None,) * len(schema)], schema)
            event.write.mode("error").format(src.format).save(folder)
        return spark.read.schema(src.schema).options(**src.options).format(src.format) \
            .load(folder)


class RateEventSource(EventSource):
    """Spark's ``rate`` source (``timestamp``, ``value``) for load tests."""

    def read_stream(self, spark: SparkSession) -> DataFrame:
        return spark.readStream.format("rate").options(**self.config.options).load()
