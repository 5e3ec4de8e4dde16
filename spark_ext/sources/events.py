"""L0: the events stream, one reader per source format (as the sidecar has one engine per
kind): :data:`EVENT_SOURCES` maps each of :data:`spark_ext.config.SOURCE_FORMATS` to the
class that reads it, :func:`event_source` builds one."""

from __future__ import annotations

from spark_ext.config import PipelineConfig
from spark_ext.sources.base import EventSource
from spark_ext.sources.files import FileEventSource, RateEventSource
from spark_ext.sources.kafka import KafkaEventSource

#: ``source.format`` -> its reader class.
EVENT_SOURCES: dict[str, type[EventSource]] = {
    fmt: cls for cls in (FileEventSource, RateEventSource, KafkaEventSource)
    for fmt in cls.formats}


def event_source(config: PipelineConfig) -> EventSource:
    """The reader of ``config.source.format``.

    Example:
        >>> type(event_source(PipelineConfig.from_dict({"source": {"format": "csv"}}))).__name__
        'FileEventSource'
    """
    return EVENT_SOURCES[config.source.format](config)
