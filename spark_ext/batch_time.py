"""The micro-batch's time as a column whose generated code is the same in every batch.

In a streaming query Spark gives ``current_timestamp()`` the micro-batch's time (kept in
the offset log, so a replayed batch gets the same), and its generated Java code writes
that time in as a constant. Every micro-batch's code is then new text: it misses Spark's
code cache and janino compiles it again, for each stage that computes the time. Both
STS queries do (the submit query's ``enqueue_ts`` of events without an event time, the
answers query's ``_now``): at 200 events/s on 2 cores, a quarter of the driver JVM's
CPU samples were janino compiling them (Java Flight Recorder samples).

:func:`batch_time_ms` reads the same time through ``reflect`` (``String.valueOf`` of
it, cast back to a number). Spark evaluates ``reflect`` without generating code for it
and the code around it refers to the expression instead of writing the time in, so it
is the same text every batch and compiled once. A session that refuses ``reflect``
(:func:`reflect_allowed` probes once per session) gets plain ``current_timestamp()``.
"""

from __future__ import annotations

import logging
import weakref

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

logger = logging.getLogger(__name__)

#: The batch's time in epoch ms through ``reflect`` (see the module docstring).
_REFLECTED = ("CAST(reflect('java.lang.String', 'valueOf', unix_millis(current_timestamp()))"
              " AS BIGINT)")

_probed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def reflect_allowed(spark: SparkSession) -> bool:
    """Whether ``spark`` evaluates :data:`_REFLECTED` (probed once per session with a
    one-row query; a refusal is logged once)."""
    try:
        return _probed[spark]
    except (KeyError, TypeError):
        pass
    try:
        ok = spark.range(1).select(F.expr(_REFLECTED).alias("t")).collect()[0]["t"] is not None
    except Exception as e:  # noqa: BLE001 - any refusal: the plain column instead
        logger.info("reflect() is refused here (%s): the micro-batch time is generated "
                    "into each batch's code (compiled once per micro-batch).",
                    str(e).splitlines()[0][:200])
        ok = False
    try:
        _probed[spark] = ok
    except TypeError:  # a session that cannot be weakly referenced: probe each time
        pass
    return ok


def batch_time_ms(spark: SparkSession) -> Column:
    """The micro-batch's time in epoch milliseconds (``bigint``): Spark's
    ``current_timestamp()``, the same for every row of a batch and for a replayed batch,
    without a new compile per micro-batch where ``spark`` allows ``reflect``.

    Usage::

        stream.withColumn("_now", batch_time_ms(stream.sparkSession))
    """
    if not reflect_allowed(spark):
        return F.unix_millis(F.current_timestamp())
    return F.expr(_REFLECTED)
