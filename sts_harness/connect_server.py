"""A real local Spark Connect server for the tests and for ``sts connect-server``: pip
PySpark's own server, in its own JVM, on a loopback port.

pip PySpark 4.2.0 ships the server (``jars/spark-connect_2.13-4.2.0.jar``) but not
``sbin/start-connect-server.sh``; that script only runs ``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer``, which is what this module runs
(no application jar is needed: the class is on Spark's classpath). The server's Python
workers (``foreachBatch`` functions, UDFs, Python data sources) run this interpreter
(``PYSPARK_PYTHON``) with this process's ``PYTHONPATH``, so code the tests import can be
imported there too.

    conf = {**session_conf(["kafka", "delta", "localfs"]), "spark.sql.shuffle.partitions": "2"}
    with SparkConnectServer(tmp / "connect", conf=conf) as server:
        spark = server.client()            # a Spark Connect SparkSession
        spark.range(3).collect()

A Connect client and a classic session can share one Python process only with care:
``SparkSession.builder.remote(...)`` refuses (``SESSION_ALREADY_EXIST``) once a classic
SparkContext exists, and it sets ``SPARK_CONNECT_MODE_ENABLED`` in ``os.environ``, which
turns ``pyspark.sql.functions`` into their Connect versions for the rest of the process.
:meth:`SparkConnectServer.client` builds the client from
``pyspark.sql.connect.session.SparkSession`` directly and leaves ``os.environ`` alone;
code that builds columns (``F.col``) for a Connect client must run while that variable is
set (the ``spark_connect`` test fixture sets it for the test's duration).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_ext.session import LOCAL_JAVA_OPTIONS

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

#: The server's main class (what ``sbin/start-connect-server.sh`` would run).
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: A local session's JVM options (``spark_ext.session.LOCAL_JAVA_OPTIONS``): the quick (C1)
#: JIT only (the optimising compiler costs a core for the first minute on a 2-core
#: machine), with the code cache tiered compilation would have. Without that size the
#: server's JIT filled its 48 MB within 3 minutes of the demo ("CodeCache is full.
#: Compiler has been disabled") and ran interpreted from then on (with the size, the
#: demo's answers micro-batch on Connect 1.5-1.6x faster).
JAVA_OPTIONS = LOCAL_JAVA_OPTIONS
#: Settings every test server gets (``conf`` overrides them).
BASE_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
}
#: Spark's log: warnings and errors, plus the server's own start line.
_LOG4J2 = """rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.connect.name = org.apache.spark.sql.connect.service.SparkConnectServer
logger.connect.level = info
"""


class ConnectServerError(RuntimeError):
    """The Spark Connect server exited or did not serve in time; the message is one line
    with the end of its log. Unrecoverable for this server."""


#: What the server logs when its gRPC port is taken (it does not exit).
_BIND_FAILED = "Failed to bind to address"


def _port_open(port: int) -> bool:
    """Whether something accepts TCP connections on ``127.0.0.1:port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> Path:
    """The installed PySpark's folder (its ``bin/`` and ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).parent


def connect_client(remote: str) -> "ConnectSession":
    """A new Spark Connect session on ``remote`` (``sc://host:port``), built without
    touching ``os.environ`` (see the module's docstring). Stop it with ``.stop()``."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return ConnectSession.builder.remote(remote).create()


class SparkConnectServer:
    """``spark-submit --class SparkConnectServer`` on 127.0.0.1, as a context manager.

    Args:
        work_dir: Its folder: ``connect-server.log``, ``log4j2.properties`` and the
            server's working directory (``spark-warehouse/``, ``metastore_db/``).
        conf: Spark settings on top of :data:`BASE_CONF` (e.g. ``spark.jars.packages``
            and Delta's extension and catalog from ``spark_ext.jvm_packages.session_conf``).
        master: The server's master (``local[2]``: 2 task slots).
        port: The gRPC port (default: a free one).
        java_options: The driver JVM's options (``--driver-java-options``).
        driver_memory: ``--driver-memory``.
        env: Extra environment variables for the server (and its Python workers).
        start_timeout_s: How long ``start()`` waits for ``spark.range(1).collect()`` to
            run through the server (the first start resolves ``spark.jars.packages``).
        stop_timeout_s: How long ``stop()`` waits after SIGTERM before SIGKILL.
    """

    def __init__(self, work_dir: Path, *, conf: Mapping[str, str] | None = None,
                 master: str = "local[2]", port: int | None = None,
                 java_options: str = JAVA_OPTIONS, driver_memory: str = "2g",
                 env: Mapping[str, str] | None = None, start_timeout_s: float = 240.0,
                 stop_timeout_s: float = 30.0) -> None:
        self.work_dir = Path(work_dir)
        self.conf = {**BASE_CONF, **(conf or {})}
        self.master = master
        self.port = port or free_port()
        self.java_options = java_options
        self.driver_memory = driver_memory
        self.env = dict(env or {})
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self._log_start = 0

    @property
    def remote(self) -> str:
        """The Spark Connect URL, ``sc://127.0.0.1:<port>``."""
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "connect-server.log"

    def command(self) -> list[str]:
        """The ``spark-submit`` command line that starts the server."""
        conf = {**self.conf, "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": str(self.port)}
        cmd = [str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS,
               "--name", "sts-connect-server", "--master", self.master,
               "--driver-memory", self.driver_memory,
               "--driver-java-options",
               f"{self.java_options} -Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}"]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        return cmd

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                   PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        # The server must never think it is itself a Connect client.
        for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
            env.pop(name, None)
        env.update(self.env)
        return env

    def start(self) -> "SparkConnectServer":
        """Start the server and wait until a client runs ``spark.range(1).collect()``.

        Raises:
            ConnectServerError: it exited, or did not serve within ``start_timeout_s``.
        """
        if _port_open(self.port):
            raise ConnectServerError(
                f"port {self.port} on 127.0.0.1 is already in use (another Spark Connect "
                "server? stop it, or choose another port)")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "log4j2.properties").write_text(_LOG4J2, encoding="utf-8")
        self._log = open(self.log_path, "ab")
        self._log_start = self._log.tell()
        self.proc = subprocess.Popen(self.command(), cwd=self.work_dir, env=self._environment(),
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, process_group=0)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last_error = "the port never opened"
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ConnectServerError(f"the Spark Connect server exited with "
                                         f"{self.proc.returncode}: {self.tail_log()} "
                                         f"({self.log_path})")
            if _BIND_FAILED in self._new_log():  # the JVM logs it and lives on
                raise ConnectServerError(f"the Spark Connect server could not bind port "
                                         f"{self.port} ({self.log_path})")
            # The client retries a closed port for a long while: check it first.
            if not _port_open(self.port):
                time.sleep(0.5)
                continue
            try:
                client = connect_client(self.remote)
                try:
                    if client.range(1).collect()[0][0] == 0:
                        return
                finally:
                    client.stop()
            except Exception as e:  # noqa: BLE001 - not serving yet
                last_error = " ".join(str(e).split())[:200]
                time.sleep(0.5)
        raise ConnectServerError(f"the Spark Connect server did not serve in "
                                 f"{self.start_timeout_s:.0f} s ({last_error}): "
                                 f"{self.tail_log()} ({self.log_path})")

    def client(self) -> "ConnectSession":
        """A new Spark Connect session on this server (see :func:`connect_client`)."""
        return connect_client(self.remote)

    def _new_log(self) -> str:
        """What this start wrote to the log so far."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def tail_log(self, lines: int = 5) -> str:
        """The last ``lines`` lines of the server's log, joined with `` | ``."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the server's process group (Spark stops its context and its Python
        workers); SIGKILL to the group after ``stop_timeout_s``. Idempotent."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                pass
        if proc is not None:
            # Python workers outlive a killed JVM for a moment; they are in its group.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "SparkConnectServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
