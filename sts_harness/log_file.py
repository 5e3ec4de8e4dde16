"""A command's Python log in a file of its own, so the console keeps the command's own
lines: ``sts demo``'s progress and summary, ``sts bench``'s table.

The libraries a command drives (the pipeline, the sidecar client, Kafka helpers) log at
INFO what a long-running job wants in its log ("Sidecar check from 2 task(s) ...",
"Submit plan warmed up in 2.3 s."); printed between a command's rows they break them up.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

#: How each line of the file starts.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_to_file(stack: contextlib.ExitStack, log: Path, *also: logging.Logger) -> None:
    """Python's log (INFO and up, tracebacks included) into ``log`` until ``stack``
    closes; the console handlers of the root logger keep WARNING and up meanwhile, and
    the loggers in ``also`` that do not propagate (a command's own tracebacks, say) write
    to the file too. Everything is put back as it was when ``stack`` closes.

    Example:
        >>> import contextlib, io, logging, tempfile
        >>> from pathlib import Path
        >>> console = logging.StreamHandler(io.StringIO())
        >>> root = logging.getLogger()
        >>> root.addHandler(console)
        >>> log = Path(tempfile.mkdtemp()) / "run.log"
        >>> with contextlib.ExitStack() as stack:
        ...     log_to_file(stack, log)
        ...     logging.getLogger("spark_ext.demo").info("Submit plan warmed up.")
        ...     logging.getLogger("spark_ext.demo").warning("Dead letters: 1.")
        >>> root.removeHandler(console)
        >>> console.stream.getvalue()
        'Dead letters: 1.\\n'
        >>> [line.split(": ", 1)[1] for line in log.read_text().splitlines()]
        ['Submit plan warmed up.', 'Dead letters: 1.']
    """
    root = logging.getLogger()
    handler = logging.FileHandler(log, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.setLevel(logging.INFO)
    quieted = [(h, h.level) for h in root.handlers if isinstance(h, logging.StreamHandler)
               and not isinstance(h, logging.FileHandler)]
    for h, _ in quieted:
        h.setLevel(max(h.level, logging.WARNING))
    previous = root.level
    root.setLevel(min(previous, logging.INFO) if previous else logging.INFO)
    root.addHandler(handler)
    for logger in also:
        logger.addHandler(handler)

    def restore() -> None:
        root.removeHandler(handler)
        for logger in also:
            logger.removeHandler(handler)
        handler.close()
        root.setLevel(previous)
        for h, level in quieted:
            h.setLevel(level)

    stack.callback(restore)
