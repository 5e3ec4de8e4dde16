"""Who writes the Delta tables (``output.writer``): a name mapped to a lazily imported
class, the way vLLM registers its KV connectors
(``KVConnectorFactory.register_connector(name, module, class)``). A third writer is one
new module and one :func:`register_writer` call.

Example:
    >>> sorted(WRITER_CLASSES)
    ['deltalake', 'spark']
    >>> writer_class("spark").__name__
    'SparkWriter'
"""

from __future__ import annotations

import importlib
from typing import Any

from spark_ext.exceptions import PipelineConfigError
from spark_ext.l4.writers.base import BatchFrames, TableWriter

__all__ = ["BatchFrames", "TableWriter", "WRITER_CLASSES", "choose_writer", "register_writer",
           "writer_class"]

#: ``output.writer`` -> (module, class), imported on first use.
WRITER_CLASSES: dict[str, tuple[str, str]] = {}


def register_writer(name: str, module: str, class_name: str) -> None:
    """Make ``output.writer: <name>`` the class ``module.class_name``."""
    WRITER_CLASSES[name] = (module, class_name)


register_writer("spark", "spark_ext.l4.writers.spark", "SparkWriter")
register_writer("deltalake", "spark_ext.l4.writers.deltalake", "DeltalakeWriter")


def writer_class(name: str) -> type[TableWriter]:
    """The writer class registered as ``name``.

    Raises:
        PipelineConfigError: no writer has that name.
    """
    try:
        module, class_name = WRITER_CLASSES[name]
    except KeyError:
        raise PipelineConfigError(f"output.writer: no writer {name!r}; known: "
                                  f"{', '.join(sorted(WRITER_CLASSES))}") from None
    return getattr(importlib.import_module(module), class_name)


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
    if name == "auto":
        name = "spark" if writer_class("spark").available(spark) else "deltalake"
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
