"""When result files become visible: a thread that polls a result folder.

The sidecar's Parquet result channel publishes each file under a hidden name
and renames it when complete; :class:`ResultFileWatcher` notes the wall-clock
time (epoch ms, :func:`sidecar.contract.now_ms`) at which each new visible
``*.parquet`` file first appears, so a benchmark can tell how long a result
took to reach readers.

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> watcher = ResultFileWatcher(folder)
    >>> watcher.start()
    >>> _ = (folder / "part-0.parquet").write_bytes(b"")
    >>> watcher.stop()
    >>> list(watcher.seen_ms)
    ['part-0.parquet']
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from sidecar.contract import now_ms


class ResultFileWatcher(threading.Thread):
    """Notes when each new result file appears in ``directory`` (polls every ``period_s``).

    Files already there when it is created are ignored. Hidden names (the
    writers' temporary files) never count.

    Attributes:
        seen_ms: File name -> epoch ms when it was first seen.
    """

    def __init__(self, directory: Path, period_s: float = 0.001) -> None:
        super().__init__(name="result-file-watcher", daemon=True)
        self.directory = Path(directory)
        self.period_s = period_s
        self.known = set(self._names())
        self.seen_ms: dict[str, int] = {}
        self.stopped = threading.Event()

    def _names(self) -> list[str]:
        try:
            return [e.name for e in os.scandir(self.directory)
                    if e.name.endswith(".parquet") and not e.name.startswith(".")]
        except FileNotFoundError:
            return []

    def scan(self) -> None:
        """Record the files that appeared since the last scan."""
        now = now_ms()
        for name in self._names():
            if name not in self.known and name not in self.seen_ms:
                self.seen_ms[name] = now

    def run(self) -> None:
        while not self.stopped.is_set():
            self.scan()
            time.sleep(self.period_s)

    def stop(self) -> None:
        """Stop polling, wait for the thread, and scan once more."""
        self.stopped.set()
        self.join()
        self.scan()
