"""Warm-ups that run in the Python workers the streaming queries' tasks will get.

Spark keeps one pool of Python workers per worker environment. In a classic session a
batch job and a streaming micro-batch share one pool, so a batch job that loads the
embedding model warms the workers the stream uses. On Spark Connect they do not: a
client session's batch job carries the session's artifact UUID in its workers'
environment (``SPARK_JOB_ARTIFACT_UUID``) and gets a pool of its own, while a streaming
query's micro-batches run without it (``default``), in another pool. Measured on a
local Connect server (Spark 4.2): the demo's warm-up loaded MiniLM and Milvus Lite in
workers no micro-batch ever used, and each of the first submit micro-batches waited
12-14 s on a cold worker loading them (the whole replay of a 30 s demo).

:func:`warm_up_workers` runs a warm-up where the stream will: as a batch job in a
classic session, as a one-micro-batch streaming query (``availableNow`` over the rows
written once to a scratch folder) on Spark Connect.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession

from spark_ext import storage
from spark_ext.session import is_connect

logger = logging.getLogger(__name__)

#: How long a warm-up query may run before it is stopped (a cold worker loads the
#: models in tens of seconds on a slow machine).
WARM_UP_TIMEOUT_S = 600.0


def warm_up_workers(spark: SparkSession, rows: DataFrame,
                    build: Callable[[DataFrame], DataFrame], scratch: str, *,
                    timeout_s: float = WARM_UP_TIMEOUT_S) -> None:
    """Run ``build(rows)`` into Spark's ``noop`` sink in the Python worker pool that the
    session's streaming queries use.

    Args:
        spark: the session the pipeline's queries run on.
        rows: a small static DataFrame, one partition per task the warm-up should run.
        build: the operators to warm up (``rows`` or its stream -> the output).
        scratch: a folder only this warm-up uses; on Spark Connect ``rows`` is written
            there once as Parquet (one file per partition) and read back as a stream. An
            existing folder is reused, never overwritten or deleted, so ``rows`` must
            not change while ``scratch`` stays the same (put their schema in its name).
        timeout_s: how long the streaming run may take before it is stopped.

    Raises:
        TimeoutError: the streaming run did not finish within ``timeout_s``.
        Exception: whatever the warm-up's query failed with.
    """
    if not is_connect(spark):
        build(rows).write.format("noop").mode("overwrite").save()
        return
    if not storage.exists(spark, scratch):
        rows.write.mode("error").parquet(scratch)
    # One task per file: Spark packs files into a partition only while their size plus
    # spark.sql.files.openCostInBytes (4 MB) stays under the split size, which a few
    # tiny files never reach together.
    stream = spark.readStream.schema(rows.schema).parquet(scratch)
    query = (build(stream).writeStream.queryName("sts-warm-up").format("noop")
             .trigger(availableNow=True).start())
    try:
        if not query.awaitTermination(timeout_s):
            raise TimeoutError(f"the warm-up query ran past {timeout_s:.0f} s")
    finally:
        query.stop()
    if (error := query.exception()) is not None:
        raise error
