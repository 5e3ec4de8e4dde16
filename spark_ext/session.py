"""The local SparkSession the demo and the benchmarks run on."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from py4j.java_gateway import JavaGateway
from pyspark import SparkConf, SparkContext
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from spark_ext.exceptions import SparkStartError
from spark_ext.jvm_packages import DEFAULT_FEATURES, JvmFeature, session_conf

logger = logging.getLogger(__name__)


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client session."""
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:  # pragma: no cover - the Connect extras are not installed
        return False
    return isinstance(spark, ConnectSession)


#: JVM options of a local session: the quick (C1) JIT compiler only. The optimising
#: one (C2) spent ~40 % of the Spark core compiling in the first minute of
#: ``sts demo``, where Spark has one core next to the engine; C1's code is a little
#: slower and costs a fraction to compile. Without tiered compilation the JVM reserves
#: only 48 MB for compiled code, which Delta on Spark's MERGE filled within minutes
#: ("CodeCache is full. Compiler has been disabled": everything then ran interpreted),
#: so the cache gets the size tiered compilation has.
LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"

#: The JVM's log profile of a local session: Spark's defaults less the startup notes
#: nobody acts on (:func:`log_profile_option`).
LOG_PROFILE = Path(__file__).with_name("log4j2.properties")

#: What names a log4j2 profile of the user's own on a JVM's command line.
_USER_PROFILE_OPTIONS = ("log4j2.configurationFile", "log4j.configurationFile")


def log_profile_option(java_options: str, env: Mapping[str, str] | None = None) -> str:
    """The JVM option that gives a local session :data:`LOG_PROFILE`, or ``""`` where
    the user has a profile of their own: named in ``java_options``,
    ``$SPARK_SUBMIT_OPTS`` or ``$JAVA_TOOL_OPTIONS``, or a ``log4j2.*`` file in Spark's
    conf folder (``$SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``), which Spark puts on
    the JVM's class path.

    Without a profile Spark prints its default one's notes at every start ("Using
    Spark's default log4j profile", how to change the level) and Hadoop a WARN that it
    runs without its native library.

        >>> log_profile_option("-Dlog4j2.configurationFile=/etc/mine.xml", {})
        ''
        >>> log_profile_option("", {}).startswith("-Dlog4j2.configurationFile=file:")
        True
    """
    env = os.environ if env is None else env
    given = " ".join((java_options, env.get("SPARK_SUBMIT_OPTS", ""),
                      env.get("JAVA_TOOL_OPTIONS", "")))
    if any(name in given for name in _USER_PROFILE_OPTIONS):
        return ""
    from pyspark.find_spark_home import _find_spark_home

    conf_dir = env.get("SPARK_CONF_DIR") or os.path.join(
        env.get("SPARK_HOME") or _find_spark_home(), "conf")
    if any(Path(conf_dir).glob("log4j2.*")):
        return ""
    return f"-Dlog4j2.configurationFile={LOG_PROFILE.as_uri()}"


def local_session(app_name: str, *, cores: int = 2,
                  java_options: str = LOCAL_JAVA_OPTIONS,
                  jvm_features: Iterable[JvmFeature] = DEFAULT_FEATURES) -> SparkSession:
    """A ``local[cores]`` session for the STS queries: few shuffle partitions, no UI,
    Python workers on this interpreter (unless ``PYSPARK_PYTHON`` says otherwise),
    ``java_options`` for the JVM (``spark.driver.extraJavaOptions``; default
    :data:`LOCAL_JAVA_OPTIONS`, ``""`` for the JVM's own defaults; with
    :data:`LOG_PROFILE` unless the user has a log profile, :func:`log_profile_option`)
    and the JVM packages of ``jvm_features`` (default: Spark's Kafka connector, Delta and
    ``file:`` without a process per file; :mod:`spark_ext.jvm_packages`;
    ``$STS_SPARK_PACKAGES`` overrides the coordinates).

    With ``$SPARK_REMOTE`` set (``sc://host:port``: a Spark Connect server, as
    Databricks Connect and serverless notebooks use), the session is a Spark Connect
    client of that server instead, and the other settings are the server's.

    Raises:
        SparkStartError: Java is missing, a JVM package could not be resolved, or the
            JVM exited before it served (or the Connect server did not answer).

    Example (the session of this process, made once):
        >>> spark = local_session("my-job")
        >>> spark.conf.get("spark.sql.shuffle.partitions"), spark.conf.get("spark.ui.enabled")
        ('2', 'false')
    """
    if remote := os.environ.get("SPARK_REMOTE"):
        return _connect_session(remote, app_name)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    options = {"spark.master": f"local[{cores}]", "spark.app.name": app_name,
               **session_conf(jvm_features),
               "spark.sql.shuffle.partitions": str(cores),
               "spark.ui.enabled": "false",
               "spark.driver.extraJavaOptions":
                   " ".join(filter(None, (java_options, log_profile_option(java_options)))),
               "spark.ui.showConsoleProgress": "false"}
    pin_python_workers()
    try:
        if SparkContext._gateway is None:  # no JVM in this process yet: launch it
            SparkContext._ensure_initialized(
                gateway=launch_jvm(SparkConf().setAll(list(options.items()))))
        session = SparkSession.builder.config(map=options).getOrCreate()
    except (PySparkException, OSError) as e:  # the JVM did not come up
        reason = next((line.strip() for line in str(e).splitlines() if line.strip()),
                      type(e).__name__)
        raise SparkStartError(f"Spark did not start: {reason}") from e
    session.sparkContext.setLogLevel("ERROR")
    quiet_jvm_loggers(session)
    quiet_py4j()
    return session


def _connect_session(remote: str, app_name: str) -> SparkSession:
    """A Spark Connect client session on ``remote`` that has answered a query."""
    try:
        session = SparkSession.builder.remote(remote).appName(app_name).getOrCreate()
        session.range(1).collect()
    except Exception as e:  # noqa: BLE001 - gRPC, PySpark or connection errors
        reason = next((line.strip() for line in str(e).splitlines() if line.strip()),
                      type(e).__name__)
        raise SparkStartError(f"Spark Connect at {remote} did not answer: {reason}") from e
    quiet_connect_client()
    return session


def quiet_connect_client() -> None:
    """Keep the Spark Connect client's WARNING for a release that came after its session
    was closed (``ReleaseExecute failed ... SESSION_CLOSED``: nothing is left to release,
    printed at the end of every run that stops its session) off the log."""
    client = logging.getLogger("pyspark.sql.connect.logging")
    if not any(isinstance(f, _ClosedSessionReleaseNoise) for f in client.filters):
        client.addFilter(_ClosedSessionReleaseNoise())


@contextlib.contextmanager
def connect_errors_expected() -> Iterator[None]:
    """Around a probe whose failure is an answer (a table not there yet): the Spark
    Connect client logs every failed call at ERROR with its traceback before it raises;
    this thread's records of it are kept off the log while the block runs (other
    threads' are not; a classic session has nothing to keep off)."""
    client = logging.getLogger("pyspark.sql.connect.logging")
    dropped = _ThreadRecords(threading.get_ident())
    client.addFilter(dropped)
    try:
        yield
    finally:
        client.removeFilter(dropped)


class _ThreadRecords(logging.Filter):
    """Drop the records logged by one thread."""

    def __init__(self, thread: int) -> None:
        super().__init__()
        self.thread = thread

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread


class _ClosedSessionReleaseNoise(logging.Filter):
    """Drop ``ReleaseExecute failed`` records whose session was already closed."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("ReleaseExecute failed" in text and "SESSION_CLOSED" in text)


def launch_jvm(conf: SparkConf) -> JavaGateway:
    """Start the driver's JVM for ``conf`` and connect to it: PySpark's
    ``launch_gateway`` with one change. PySpark starts ``spark-submit`` with a Python
    ``preexec_fn`` (to keep Ctrl-C from the JVM), which makes :mod:`subprocess` fork and
    run Python in the child; in a process whose gRPC client threads are running (a
    sidecar client, as in ``sts demo``), gRPC's fork handlers then run in the child, and
    now and then it dies before it runs Java (measured: 2 of 15 launches while a client
    streamed to a sidecar: ``epoll_wait error: Bad file descriptor``, then
    ``JAVA_GATEWAY_EXITED``). Here the JVM gets its own process group instead
    (``process_group=0``: the terminal's Ctrl-C still does not reach it), no Python runs
    in the child, and CPython launches it with ``vfork()``, which runs no fork handlers.

    Raises:
        PySparkRuntimeError: the JVM exited before it served (``JAVA_GATEWAY_EXITED``).
    """
    from pyspark.errors import PySparkRuntimeError
    from pyspark.find_spark_home import _find_spark_home
    from pyspark.java_gateway import launch_gateway
    from pyspark.serializers import UTF8Deserializer, read_int

    command = [os.path.join(_find_spark_home(), "bin", "spark-submit")]
    for key, value in conf.getAll():
        command += ["--conf", f"{key}={value}"]
    command += shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell"))
    with tempfile.TemporaryDirectory(prefix="sts-jvm-") as folder:
        info = os.path.join(folder, "connection-info")  # the JVM renames it into place
        env = dict(os.environ, SPARK_CONNECT_MODE="0", _PYSPARK_DRIVER_CONN_INFO_PATH=info)
        # stdin: a pipe, so the JVM exits when this process does (as in PySpark)
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, env=env, process_group=0)
        while proc.poll() is None and not os.path.isfile(info):
            time.sleep(0.05)
        if not os.path.isfile(info):
            raise PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})
        with open(info, "rb") as f:
            port, secret = read_int(f), UTF8Deserializer().loads(f)
    # PySpark's own launch_gateway connects to a JVM named by these (no launch of its own)
    saved = {k: os.environ.get(k) for k in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")}
    os.environ["PYSPARK_GATEWAY_PORT"], os.environ["PYSPARK_GATEWAY_SECRET"] = str(port), secret
    try:
        gateway = launch_gateway(conf)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    gateway.proc = proc  # keeps the stdin pipe open for the JVM's life
    return gateway


def task_slots(spark: SparkSession) -> int:
    """How many tasks the session runs at once: Spark's default parallelism (on Spark
    Connect, which has no SparkContext here: ``spark.default.parallelism`` or the
    shuffle partitions, else 2)."""
    try:
        return max(1, spark.sparkContext.defaultParallelism)
    except Exception:  # noqa: BLE001 - Spark Connect: JVM_ATTRIBUTE_NOT_SUPPORTED
        pass
    for key in ("spark.default.parallelism", "spark.sql.shuffle.partitions"):
        try:
            if value := spark.conf.get(key, None):
                return max(1, int(value))
        except (ValueError, Exception):  # noqa: BLE001 - unset or not a number
            continue
    return 2


def pin_python_workers() -> None:
    """Make Spark's Python workers run this interpreter (its venv) instead of the first
    ``python3`` on PATH, unless ``PYSPARK_PYTHON`` is set. Called before a local
    SparkContext starts (PySpark reads the variable then); an existing context is left
    as it is. ``spark.pyspark.python`` alone does not reach local-mode workers (PySpark
    4.3 takes their command from ``PYSPARK_PYTHON``)."""
    if not os.environ.get("PYSPARK_PYTHON"):
        os.environ["PYSPARK_PYTHON"] = sys.executable


#: Spark's JVM loggers whose WARN lines need no action in a streaming job: the state
#: store coordinator's "Snapshot Lag" reports (Spark 4.1+: a ledger bucket of the
#: answers query that had nothing new to snapshot lately looks "behind").
QUIET_JVM_LOGGERS = ("org.apache.spark.sql.execution.streaming.state.StateStoreCoordinator",)


def quiet_jvm_loggers(spark: SparkSession) -> None:
    """Set :data:`QUIET_JVM_LOGGERS` to ERROR in a classic session's JVM (best effort;
    nothing on Spark Connect, whose server logs on its own)."""
    _set_jvm_levels(spark, dict.fromkeys(QUIET_JVM_LOGGERS, "ERROR"))


#: Spark's JVM loggers that report a Real-Time Mode query's stop as a failed write: its
#: long-running task is interrupted, so the task logs "Aborting task" with Kafka's
#: ``InterruptException`` and its stack, and the epoch's write "is aborting" and
#: "aborted". Expected at every stop of such a query, never news.
REALTIME_STOP_LOGGERS = (
    "org.apache.spark.sql.execution.datasources.v2.WriteToDataSourceV2Exec",
    "org.apache.spark.sql.execution.datasources.v2.DataWritingSparkTask",
    "org.apache.spark.util.Utils")


@contextlib.contextmanager
def jvm_loggers_off(spark: SparkSession, names: Iterable[str]) -> Iterator[None]:
    """Turn the JVM loggers ``names`` off while the block runs, then give them their
    levels back (best effort; nothing on Spark Connect)."""
    before = _set_jvm_levels(spark, dict.fromkeys(names, "OFF"))
    try:
        yield
    finally:
        _set_jvm_levels(spark, before)


def _set_jvm_levels(spark: SparkSession,
                    levels: dict[str, str | None]) -> dict[str, str | None]:
    """Set log4j2 levels (by name; ``None``: the logger's parent's again) of loggers in a
    classic session's JVM; the levels they had before, for those it set (``None``
    where one had none of its own). Best effort: on Spark Connect or another logging
    backend nothing is set (and a logger keeps its lines)."""
    jvm = None if is_connect(spark) else getattr(spark.sparkContext, "_jvm", None)
    before: dict[str, str | None] = {}
    if jvm is None or not levels:
        return before
    try:
        log4j = jvm.org.apache.logging.log4j
        config = log4j.LogManager.getContext(False).getConfiguration()
        for name, level in levels.items():
            own = config.getLoggerConfig(name)
            had = own.getExplicitLevel() if own.getName() == name else None
            before[name] = None if had is None else str(had.name())
            log4j.core.config.Configurator.setLevel(
                name, None if level is None else log4j.Level.getLevel(level))
    except Exception:  # noqa: BLE001 - another logging backend: keep its lines
        logger.debug("Could not set the JVM loggers' levels.", exc_info=True)
    return before


def quiet_py4j() -> None:
    """Keep py4j's per-call INFO lines (one per JVM callback, several a second in a
    streaming job) out of an INFO log, unless its level was set explicitly."""
    py4j = logging.getLogger("py4j")
    if py4j.level == logging.NOTSET:
        py4j.setLevel(logging.WARNING)
    proxy = logging.getLogger("py4j.clientserver")
    if not any(isinstance(f, _StoppedQueryNoise) for f in proxy.filters):
        proxy.addFilter(_StoppedQueryNoise())


class _StoppedQueryNoise(logging.Filter):
    """Drop py4j's ERROR with traceback for a ``foreachBatch`` call that a query's stop
    interrupted (the JVM cancels the batch's jobs): expected at every stop, never news."""

    _MARKS = ("InterruptedException", "SPARK_JOB_CANCELLED", "was stopped")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            text = str(record.exc_info[1])
            return not any(mark in text for mark in self._MARKS)
        return True


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
