"""A ``foreachBatch`` function's Java errors, told to Spark in two lines.

When a query stops while its ``foreachBatch`` function runs a Spark job, the job is
cancelled and the function's call into the JVM raises py4j's ``Py4JJavaError``, whose
text is the whole Java stack trace (thousands of lines). Spark decides whether that
error means "stopped" by running a regular expression over the text
(``StreamExecution.isInterruptionException``: ``Py4JJavaError: An error occurred while
calling.+(\\r\\n|\\r|\\n): <InterruptedException ...>``), and on a text that long Java's
regex engine recurses until ``java.lang.StackOverflowError`` (measured on Spark 4.2: in
one stop of three), which the stream thread prints. :func:`short_java_errors` re-raises
such an error as :class:`ShortJavaError`: the same first lines (the call, the Java
exception's own line, or the interruption in its cause chain), under the same name, so
Spark reads a stop as a stop and a failure as a failure, without the stack.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class ShortJavaError(Exception):
    """py4j's ``Py4JJavaError`` without the Java stack: ``<the call>: <the Java
    exception's line>``. Named as py4j names its error, so a traceback reads the same
    (Spark matches that name).

    Example:
        >>> e = ShortJavaError("An error occurred while calling o7.save.\\n",
        ...                    "java.lang.InterruptedException")
        >>> str(e)
        'An error occurred while calling o7.save.\\n: java.lang.InterruptedException'
        >>> f"{type(e).__module__}.{type(e).__qualname__}"
        'py4j.protocol.Py4JJavaError'
    """

    def __init__(self, errmsg: str, java_line: str) -> None:
        super().__init__(errmsg, java_line)
        self.errmsg, self.java_line = errmsg, java_line

    def __str__(self) -> str:
        return f"{self.errmsg}: {self.java_line}"


ShortJavaError.__module__ = "py4j.protocol"
ShortJavaError.__qualname__ = ShortJavaError.__name__ = "Py4JJavaError"


#: The Java exceptions Spark reads as "the query was stopped" (its IO_EXCEPTION_NAMES).
INTERRUPTIONS = frozenset({"java.lang.InterruptedException",
                           "java.io.InterruptedIOException",
                           "java.nio.channels.ClosedByInterruptException"})


def _java_line(error: BaseException) -> str:
    """The Java exception's own line (``Class: message``), or, when a cause in its chain
    is an interruption (a stop cancelled the batch), that cause's line: what Spark looks
    for; ``unknown`` when the JVM does not answer."""
    try:
        throwable = error.java_exception  # type: ignore[attr-defined]
        first = str(throwable.toString()).splitlines()[0]
        for _ in range(16):  # the cause chain, as deep as a Spark job's goes
            if throwable is None:
                break
            if throwable.getClass().getName() in INTERRUPTIONS:
                return str(throwable.toString()).splitlines()[0]
            throwable = throwable.getCause()
        return first
    except Exception:  # noqa: BLE001 - a JVM going away answers nothing
        return "unknown"


@contextlib.contextmanager
def short_java_errors() -> Iterator[None]:
    """Re-raise a ``Py4JJavaError`` from the block as :class:`ShortJavaError` (other
    errors pass as they are).

    Example:
        >>> with short_java_errors():
        ...     raise ValueError("not a Java error")
        Traceback (most recent call last):
        ...
        ValueError: not a Java error
    """
    try:
        from py4j.protocol import Py4JJavaError
    except ImportError:  # no py4j (a Spark Connect client): nothing to shorten
        Py4JJavaError = ShortJavaError  # noqa: N806 - never raised by the block
    try:
        yield
    except Py4JJavaError as e:
        if isinstance(e, ShortJavaError):
            raise
        raise ShortJavaError(e.errmsg, _java_line(e)) from None
