"""SIGTERM stops a command as Ctrl-C does: what it started is stopped on the way out.

Python's default SIGTERM ends the process at once, without ``finally`` blocks or context
managers: ``timeout 600 sts demo``, ``kill``, a CI runner or a container stop would leave
the demo's sidecar (a vLLM engine), its Kafka broker or a Spark JVM running. The ``sts``
commands and the ``spark-submit`` job turn SIGTERM into :class:`Terminated`, a
:class:`KeyboardInterrupt`, so the paths that already clean up after Ctrl-C run for both.
A command that handles signals itself (the sidecar's server, while it serves) installs its
own handler over this one.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

#: Exit codes of a command stopped by a signal, as a shell reports them (128 + signal).
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived; raised in the main thread wherever it was."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[bool]:
    """Within the block SIGTERM raises :class:`Terminated` in the main thread, once: a
    second SIGTERM while the first one's cleanup runs is ignored (SIGKILL still ends the
    process). The previous handler is back after the block (``main()`` called from a
    test leaves its process as it was). Yields ``False`` (and changes nothing) outside
    the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return

    def on_sigterm(signum: int, frame: object) -> None:
        # not SIG_IGN: an ignored signal stays ignored in the children exec'd from here
        signal.signal(signal.SIGTERM, lambda *_: None)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield True
    finally:
        if previous is not None:  # None: a handler not set from Python, left as it is
            signal.signal(signal.SIGTERM, previous)


def stopped(e: KeyboardInterrupt) -> tuple[str, int]:
    """What to print for a command stopped by ``e`` and its exit code."""
    if isinstance(e, Terminated):
        return "terminated (SIGTERM)", EXIT_TERMINATED
    return "interrupted", EXIT_INTERRUPTED
