"""The local SparkSession the demo and the benchmarks run on."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterable, Iterator

from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from spark_ext.exceptions import SparkStartError
from spark_ext.jvm_packages import DEFAULT_FEATURES, JvmFeature, session_conf

#: JVM options of a local session: the quick (C1) JIT compiler only. The optimising
#: one (C2) spent ~40 % of the Spark core compiling in the first minute of
#: ``sts demo``, where Spark has one core next to the engine; C1's code is a little
#: slower and costs a fraction to compile.
LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


def local_session(app_name: str, *, cores: int = 2,
                  java_options: str = LOCAL_JAVA_OPTIONS,
                  jvm_features: Iterable[JvmFeature] = DEFAULT_FEATURES) -> SparkSession:
    """A ``local[cores]`` session for the STS queries: few shuffle partitions, no UI,
    Python workers on this interpreter (unless ``PYSPARK_PYTHON`` says otherwise),
    ``java_options`` for the JVM (``spark.driver.extraJavaOptions``; default
    :data:`LOCAL_JAVA_OPTIONS`, ``""`` for the JVM's own defaults) and the JVM packages
    of ``jvm_features`` (default: Spark's Kafka connector and Delta;
    :mod:`spark_ext.jvm_packages`; ``$STS_SPARK_PACKAGES`` overrides the coordinates).

    Raises:
        SparkStartError: Java is missing, a JVM package could not be resolved, or the
            JVM exited before it served.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    for key, value in session_conf(jvm_features).items():
        builder = builder.config(key, value)
    pin_python_workers()
    try:
        session = (builder
                   .config("spark.sql.shuffle.partitions", str(cores))
                   .config("spark.ui.enabled", "false")
                   .config("spark.driver.extraJavaOptions", java_options)
                   .config("spark.ui.showConsoleProgress", "false")
                   .getOrCreate())
    except (PySparkException, OSError) as e:  # the JVM did not come up
        reason = next((line.strip() for line in str(e).splitlines() if line.strip()),
                      type(e).__name__)
        raise SparkStartError(f"Spark did not start: {reason}") from e
    session.sparkContext.setLogLevel("ERROR")
    quiet_py4j()
    return session


def pin_python_workers() -> None:
    """Make Spark's Python workers run this interpreter (its venv) instead of the first
    ``python3`` on PATH, unless ``PYSPARK_PYTHON`` is set. Called before a local
    SparkContext starts (PySpark reads the variable then); an existing context is left
    as it is. ``spark.pyspark.python`` alone does not reach local-mode workers (PySpark
    4.3 takes their command from ``PYSPARK_PYTHON``)."""
    if not os.environ.get("PYSPARK_PYTHON"):
        os.environ["PYSPARK_PYTHON"] = sys.executable


def quiet_py4j() -> None:
    """Keep py4j's per-call INFO lines (one per JVM callback, several a second in a
    streaming job) out of an INFO log, unless its level was set explicitly."""
    py4j = logging.getLogger("py4j")
    if py4j.level == logging.NOTSET:
        py4j.setLevel(logging.WARNING)


@contextlib.contextmanager
def session_scope(app_name: str, *, cores: int = 2) -> Iterator[SparkSession]:
    """The active session if there is one (left running), else a new
    :func:`local_session` that is stopped on exit. A demo or benchmark run inside a
    notebook or test session must not stop the session it was given."""
    existing = SparkSession.getActiveSession()
    session = existing or local_session(app_name, cores=cores)
    try:
        yield session
    finally:
        if existing is None:
            session.stop()
