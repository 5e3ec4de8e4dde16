"""A sidecar that goes away with the process it serves (``server.owner``).

The launcher of ``launch: lazy`` starts each GPU's sidecar in its own session, so it
outlives the executor that started it and the next executor on the GPU reuses it. When
the executor is released for good (the pipeline's ``scaling:``, or the cluster's own
autoscaler), nothing would ever stop that sidecar, and it would hold its GPU.
:func:`watch_owner` reads the owner's pid from ``server.owner.file`` (the launcher writes
its executor's; a replacement executor writes its own) every check; once no running
process has been named there for ``server.owner.exit_after_s`` it sets the server's stop
event, and the sidecar drains as on SIGTERM: new requests are refused (``draining``, the
pipeline answers them at once), queued and running ones finish by their deadlines, the
result channel delivers, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from sidecar.atomic_files import write_text_atomically

logger = logging.getLogger(__name__)


def owner_pid(path: str | os.PathLike[str]) -> int | None:
    """The pid written in ``path`` (its first line), or ``None`` (no file, not a pid).

    Example:
        >>> import tempfile
        >>> owner_pid(tempfile.mkdtemp() + "/none")
    """
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def pid_running(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie is not).

    Example:
        >>> pid_running(os.getpid())
        True
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (macOS): the signal said it exists
    return state not in ("Z", "X")


def claim_owner(path: str | os.PathLike[str], pid: int) -> bool:
    """Name ``pid`` the owner in ``path`` unless a running process other than it is
    named there already; ``True`` when ``pid`` is the owner now.

    Example:
        >>> import tempfile
        >>> path = tempfile.mkdtemp() + "/sts-gpu0.owner"
        >>> claim_owner(path, os.getpid()), owner_pid(path) == os.getpid()
        (True, True)
    """
    current = owner_pid(path)
    if current == pid:
        return True
    if current is not None and pid_running(current):
        return False
    write_text_atomically(Path(path), f"{pid}\n")
    return True


async def watch_owner(path: str | os.PathLike[str], exit_after_s: float, stop: asyncio.Event,
                      *, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
    """Set ``stop`` once ``path`` has named no running process for ``exit_after_s``
    (checked every ``interval_s``); return when ``stop`` is set."""
    gone_since: float | None = None
    while not stop.is_set():
        pid = owner_pid(path)
        if pid is not None and pid_running(pid):
            if gone_since is not None:
                logger.info("Owner process %d is running: serving on.", pid)
            gone_since = None
        elif gone_since is None:
            gone_since = clock()
            logger.info("The process this sidecar serves (%s in %s) is gone: draining and "
                        "exiting in %.0f s unless another one takes it over.",
                        f"pid {pid}" if pid else "no pid", path, exit_after_s)
        elif clock() - gone_since >= exit_after_s:
            logger.warning("The process this sidecar serves (%s in %s) has been gone %.0f s: "
                           "draining, then exiting.", f"pid {pid}" if pid else "no pid", path,
                           clock() - gone_since)
            stop.set()
            return
        try:
            async with asyncio.timeout(interval_s):
                await stop.wait()
        except TimeoutError:
            pass
