"""Who writes the Delta tables (``output.writer``): a name mapped to a lazily imported
class in :data:`spark_ext.kinds.WRITERS` (the registry every kind of the project uses,
the way vLLM registers its KV connectors: ``register_connector(name, module, class)``).
A third writer is one new module and one ``WRITERS.register`` line.

Example:
    >>> writer_class("spark").__name__
    'SparkWriter'
"""

from __future__ import annotations

from typing import Any

from spark_ext.exceptions import PipelineConfigError
from spark_ext.kinds import AUTO_WRITER, WRITERS
from spark_ext.l4.writers.base import BatchFrames, TableWriter

__all__ = ["BatchFrames", "TableWriter", "choose_writer", "writer_class"]


def writer_class(name: str) -> type[TableWriter]:
    """The writer class registered as ``name``.

    Raises:
        PipelineConfigError: no writer has that name.
    """
    return WRITERS.load(name)


def choose_writer(spark: Any, output: Any, key_columns: tuple[str, ...]) -> TableWriter:
    """The writer of ``output.writer`` for ``spark``; ``auto`` takes Delta on Spark where
    its classes load (Databricks, Spark Connect, a session with delta-spark), else
    delta-rs.

    Raises:
        PipelineConfigError: the writer cannot run in this session (``spark`` without
            Delta's classes; ``deltalake`` on Spark Connect, where its driver state
            cannot travel).
    """
    from pyspark.sql.utils import is_remote

    name = output.writer
    if name == AUTO_WRITER:  # the first registered writer that can run here
        name = next((n for n in WRITERS.names if writer_class(n).available(spark)),
                    WRITERS.names[-1])
    cls = writer_class(name)
    if is_remote() and not cls.runs_on_connect:
        raise PipelineConfigError(f"output.writer: {name} cannot run on Spark Connect (its "
                                  "writes keep state in the driver): use spark")
    if not cls.available(spark):
        raise PipelineConfigError(
            f"output.writer: {name} cannot run here: start the session with delta-spark "
            "(spark.jars.packages io.delta:delta-spark_2.13, spark.sql.extensions "
            "io.delta.sql.DeltaSparkSessionExtension) or use output.writer: deltalake")
    return cls(output, key_columns)
