"""L0: the events stream, one reader per source format (as the sidecar has one engine per
kind): :data:`EVENT_SOURCES` maps each of :data:`spark_ext.config.SOURCE_FORMATS` to the
class that reads it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from pyspark.sql import DataFrame, SparkSession

from spark_ext.config import SourceConfig
from spark_ext.uris import is_local_uri


class EventSource(ABC):
    """How the events of one source format are read.

    Args:
        config: The ``source`` section.
    """

    formats: ClassVar[tuple[str, ...]]
    """The ``source.format`` values this class reads."""

    def __init__(self, config: SourceConfig) -> None:
        self.config = config

    @abstractmethod
    def read_stream(self, spark: SparkSession) -> DataFrame:
        """The events as a streaming DataFrame."""

    def local_folder(self) -> str | None:
        """A local folder that must exist before the query starts (``None``: none)."""
        return None

    def warm_up_events(self, spark: SparkSession, folder: str) -> DataFrame | None:
        """A static DataFrame of one all-null event read the way the stream reads its
        events, so the submit plan can be compiled before the first micro-batch;
        ``folder`` is this source's own scratch folder (``None``: no warm-up)."""
        return None


class FileEventSource(EventSource):
    """Event files landing in ``source.path``, read with Spark's file source and the fixed
    ``source.schema`` (a streaming file source never infers it)."""

    formats = ("json", "parquet", "csv")

    def read_stream(self, spark: SparkSession) -> DataFrame:
        src = self.config
        return spark.readStream.schema(src.schema).options(**src.options) \
            .format(src.format).load(src.path)

    def local_folder(self) -> str | None:
        return self.config.path if is_local_uri(self.config.path) else None

    def warm_up_events(self, spark: SparkSession, folder: str) -> DataFrame | None:
        """One all-null event written once into ``folder`` (in the source's format) and
        read back with the source's reader; an existing file there is reused, nothing is
        ever overwritten."""
        src = self.config
        if not _exists(spark, folder):
            schema = spark.createDataFrame([], src.schema).schema
            event = spark.createDataFrame([(None,) * len(schema)], schema)
            event.write.mode("errorifexists").format(src.format).save(folder)
        return spark.read.schema(src.schema).options(**src.options).format(src.format) \
            .load(folder)


class RateEventSource(EventSource):
    """Spark's ``rate`` source (``timestamp``, ``value``) for load tests."""

    formats = ("rate",)

    def read_stream(self, spark: SparkSession) -> DataFrame:
        return spark.readStream.format("rate").options(**self.config.options).load()


#: ``source.format`` -> its reader class.
EVENT_SOURCES: dict[str, type[EventSource]] = {
    fmt: cls for cls in (FileEventSource, RateEventSource) for fmt in cls.formats}


def event_source(config: SourceConfig) -> EventSource:
    """The reader of ``config.format``.

    Example:
        >>> type(event_source(SourceConfig(format="parquet"))).__name__
        'FileEventSource'
    """
    return EVENT_SOURCES[config.format](config)


def _exists(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` exists, on whatever file system Spark reaches it (no JVM gateway
    needed: a listing that fails means it does not)."""
    try:
        spark.read.format("binaryFile").load(path).select("path").limit(1).collect()
    except Exception:  # noqa: BLE001 - Spark raises PATH_NOT_FOUND for a missing path
        return False
    return True
