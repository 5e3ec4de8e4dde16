"""Spark's streaming source runner ends quietly when the JVM closes its socket.

The runner here is PySpark's own (``python -m
pyspark.sql.streaming.python_streaming_source_runner``) serving sts-spark's real data
sources; the test plays the JVM's side of its socket: the start-up handshake, then the
socket closed as a stopping query closes it (without the SIGTERM that usually ends the
process first, the order the end of ``sts demo --source kafka`` once met).
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.serializers import read_int, write_int, write_with_length
from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from spark_ext.sources.clock import ClockDataSource, ClockStreamReader
from spark_ext.sources.runner_exit import RUNNER_MODULE, is_socket_end, quiet_runner_shutdown
from tests.utils import REPO


#: The clock's rows (``spark_ext.sources.clock.SCHEMA``) as the JVM sends them.
CLOCK_SCHEMA = StructType([StructField("bucket", IntegerType()),
                           StructField("tick_ms", LongType())])


class UnquietClock(ClockDataSource):
    """The clock without the quiet end: the control that the scene below is the one
    that prints a traceback."""

    def simpleStreamReader(self, schema: object) -> ClockStreamReader:
        return ClockStreamReader(dict(self.options))


def _utf8(text: str, out) -> None:  # type: ignore[no-untyped-def]
    write_with_length(text.encode("utf-8"), out)


def _runner_ends_after_socket_closed(tmp_path: Path, source: object) -> str:
    """Start the runner on ``source``, shake hands, close the socket; its stderr."""
    path = str(tmp_path / "jvm.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    env = {**os.environ, "PYTHON_WORKER_FACTORY_SOCK_PATH": path,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTHON_WORKER_FACTORY_SECRET", None)
    proc = subprocess.Popen([sys.executable, "-m", RUNNER_MODULE], env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        server.settimeout(60)
        conn, _ = server.accept()
        with conn, conn.makefile("rwb") as jvm:
            assert read_int(jvm) == proc.pid
            _utf8("%d.%d" % sys.version_info[:2], jvm)
            _utf8(str(tmp_path), jvm)   # Spark files' folder
            write_int(0, jvm)           # no Python includes
            write_with_length(pickle.dumps(source), jvm)
            _utf8(CLOCK_SCHEMA.json(), jvm)
            write_int(10_000, jvm)      # Arrow batch size
            jvm.flush()
            assert read_int(jvm) == 0   # the reader is built
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        server.close()
    return err


def test_the_runner_of_an_sts_source_ends_without_a_traceback(tmp_path: Path) -> None:
    err = _runner_ends_after_socket_closed(
        tmp_path, ClockDataSource({"hintPath": str(tmp_path / "hint.json")}))
    assert "Traceback" not in err, err


def test_without_the_quiet_end_the_runner_prints_the_broken_pipe(tmp_path: Path) -> None:
    err = _runner_ends_after_socket_closed(
        tmp_path, UnquietClock({"hintPath": str(tmp_path / "hint.json")}))
    assert "Traceback" in err and "BrokenPipeError" in err, err


@pytest.mark.parametrize("exc, quiet", [
    (EOFError(), True),
    (BrokenPipeError(), True),
    (ConnectionResetError(), True),
    (ValueError("bad offset"), False),
    (KeyError("tick"), False),
])
def test_what_counts_as_the_socket_going_away(exc: BaseException, quiet: bool) -> None:
    assert is_socket_end(exc) is quiet


def test_a_flush_failing_while_handling_the_end_of_stream_counts() -> None:
    try:
        try:
            raise EOFError
        except EOFError:
            raise OSError("flush failed")  # noqa: B904 - the chain is the point
    except OSError as e:
        assert is_socket_end(e)


def test_outside_the_runner_the_hook_is_left_alone() -> None:
    before = sys.excepthook
    assert quiet_runner_shutdown() is False
    assert sys.excepthook is before
