"""L0: the interface of an events source (a class per ``source.format``, registered in
:data:`spark_ext.kinds.EVENT_SOURCES`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pyspark.sql import DataFrame, SparkSession

from spark_ext.config import PipelineConfig


class EventSource(ABC):
    """How the events of one source format are read.

    Args:
        config: The pipeline's config (its ``source`` section, and the ``kafka`` one).
            An event must have the fields of
            :meth:`~spark_ext.config.PipelineConfig.required_event_fields`; a source
            that can tell sets records without them aside as dead letters.
    """

    def __init__(self, config: PipelineConfig) -> None:
        self.config = config.source
        self.pipeline_config = config
        self.required = config.required_event_fields()

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

    @property
    def has_dead_letters(self) -> bool:
        """Whether rows may carry a dead-letter reason
        (:data:`spark_ext.sources.kafka.DEAD_LETTER_COLUMN`)."""
        return False
