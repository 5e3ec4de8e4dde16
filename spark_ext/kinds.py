"""The Spark side's kinds, registered the way the sidecar registers its own
(:class:`sidecar.KindRegistry`: a name mapped to a lazily imported class or function):
event sources (``source.format``), the Spark side of the result channels
(``sidecar.result_channel``) and table writers (``output.writer``). The config checks, the ``--writer`` flags, the
factories and the docs read these; each name is spelled once, here, and adding one is
one module plus one ``register`` line (``docs/extending.md``).

A leaf of the base layer: it imports no source, channel or writer, so :mod:`spark_ext.config`
checks names without loading Spark's sources or Delta.

Example:
    >>> EVENT_SOURCES.names
    ('json', 'parquet', 'csv', 'rate', 'kafka')
    >>> WRITERS.names, CHANNEL_SIDES.names
    (('spark', 'deltalake'), ('files', 'kafka'))
"""

from __future__ import annotations

from typing import Any

from sidecar import KindRegistry
from spark_ext.exceptions import PipelineConfigError

#: ``source.format`` -> its :class:`~spark_ext.sources.base.EventSource` class: file
#: formats of a landing folder, Spark's ``rate`` source for load tests, a Kafka topic.
EVENT_SOURCES: KindRegistry[Any] = KindRegistry("event source", "source.format",
                                                PipelineConfigError)
for _fmt in ("json", "parquet", "csv"):
    EVENT_SOURCES.register(_fmt, "spark_ext.sources.files", "FileEventSource")
EVENT_SOURCES.register("rate", "spark_ext.sources.files", "RateEventSource")
EVENT_SOURCES.register("kafka", "spark_ext.sources.kafka", "KafkaEventSource")

#: ``sidecar.result_channel`` (a name of :data:`sidecar.kinds.RESULT_CHANNELS`) -> the
#: pipeline's side of that channel, a :class:`~spark_ext.l4.channels.base.ChannelSide`
#: (its results and acks read, its acks written, what it needs at start).
CHANNEL_SIDES: KindRegistry[Any] = KindRegistry("result channel", "sidecar.result_channel",
                                                PipelineConfigError)
CHANNEL_SIDES.register("files", "spark_ext.l4.channels.files", "FilesChannel")
CHANNEL_SIDES.register("kafka", "spark_ext.l4.channels.kafka", "KafkaChannel")

#: ``output.writer`` -> its :class:`~spark_ext.l4.writers.base.TableWriter` class
#: (``auto`` is not one: it picks the first that can run, in this order).
WRITERS: KindRegistry[Any] = KindRegistry("writer", "output.writer", PipelineConfigError)
WRITERS.register("spark", "spark_ext.l4.writers.spark", "SparkWriter")
WRITERS.register("deltalake", "spark_ext.l4.writers.deltalake", "DeltalakeWriter")

#: ``output.writer`` besides the writers' names: the first that can run here.
AUTO_WRITER = "auto"


def writer_choices() -> tuple[str, ...]:
    """What ``output.writer`` and every ``--writer`` flag accept: ``auto`` and each
    registered writer."""
    return (AUTO_WRITER, *WRITERS.names)
