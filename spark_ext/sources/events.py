"""L0: the events stream, one reader per source format (as the sidecar has one engine per
kind): :data:`spark_ext.kinds.EVENT_SOURCES` maps each ``source.format`` to the class
that reads it, :func:`event_source` builds one."""

from __future__ import annotations

from spark_ext.config import PipelineConfig
from spark_ext.kinds import EVENT_SOURCES
from spark_ext.sources.base import EventSource


def event_source(config: PipelineConfig) -> EventSource:
    """The reader of ``config.source.format``.

    Example:
        >>> type(event_source(PipelineConfig.from_dict({"source": {"format": "csv"}}))).__name__
        'FileEventSource'
    """
    return EVENT_SOURCES.load(config.source.format)(config)
