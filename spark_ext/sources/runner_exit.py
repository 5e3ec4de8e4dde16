"""A quiet end for the Python process that serves a streaming source to Spark.

Spark runs a simple streaming reader (:class:`pyspark.sql.datasource.SimpleDataSourceStreamReader`)
in a process of its own, ``python -m pyspark.sql.streaming.python_streaming_source_runner``,
that loops reading calls from the JVM's socket. When the query stops, the JVM sends that
process SIGTERM and closes the socket. Usually SIGTERM ends it silently; when the closed
socket is seen first, the runner's loop gets ``EOFError``, its handler's ``flush()`` of the
closed socket raises ``BrokenPipeError``, and Python prints that traceback to the
terminal of whoever started Spark, cut off where SIGTERM lands (seen at the end of
``sts demo --source kafka``). Nothing failed: the query had stopped.

:func:`quiet_runner_shutdown`, called where the reader is built (so only in that
process), makes an uncaught end-of-socket error there exit without a traceback; any
other uncaught error keeps Python's usual report.
"""

from __future__ import annotations

import sys
from types import TracebackType

#: The module Spark runs a simple streaming reader in.
RUNNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"


def is_socket_end(exc: BaseException) -> bool:
    """Whether ``exc`` (or the error it was raised while handling) is the JVM's side of
    the socket going away: end of stream, broken pipe, connection reset.

    Example:
        >>> is_socket_end(BrokenPipeError()), is_socket_end(ValueError("bad offset"))
        (True, False)
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (EOFError, ConnectionError)):
            return True
        seen = seen.__context__
    return False


def _quiet_hook(previous):  # type: ignore[no-untyped-def]
    def hook(exc_type: type[BaseException], exc: BaseException,
             tb: TracebackType | None) -> None:
        if not is_socket_end(exc):
            previous(exc_type, exc, tb)

    hook.sts_quiet_runner_shutdown = True  # type: ignore[attr-defined]
    return hook


def running_in_runner() -> bool:
    """Whether this process is Spark's streaming source runner."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == RUNNER_MODULE


def quiet_runner_shutdown() -> bool:
    """In Spark's streaming source runner only, let an uncaught end-of-socket error end
    the process without a traceback (idempotent). Returns whether the hook is in place."""
    if not running_in_runner():
        return False
    if not getattr(sys.excepthook, "sts_quiet_runner_shutdown", False):
        sys.excepthook = _quiet_hook(sys.excepthook)
    return True
