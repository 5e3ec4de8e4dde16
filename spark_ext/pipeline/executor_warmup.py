"""New GPU executors warmed before the stream's tasks land there (issue 32's stall at
scale-up).

A micro-batch waits for its slowest task. The first stream task on a new executor pays
for its Python worker's start and imports and for starting its GPU's sidecar (seconds
on a cluster; ~11 s on two shared cores, measured on a load step), so the whole stream
stood still at every scale-up. After a scale-up decision :class:`ExecutorWarmup` watches
the executors register and, while a registered executor has not answered yet, runs the
sidecar check (:func:`spark_ext.submit.submission.check_sidecars`) with one task per
task slot: Spark offers a new executor's slots to the tasks waiting when it comes up,
FIFO, so the check's tasks take them, start the Python workers the stream's tasks reuse
(``spark.python.worker.reuse``, the same Arrow UDF workers) and the GPU's lazily started
sidecar (the task waits until it serves), while the stream runs on the warm executors.
Tasks that land on a warm executor answer in milliseconds. Each row names its executor
(``host:pid`` of its JVM), so the watch ends once every executor it expects answered, or
after ``timeout_s`` (an executor the cluster manager never started).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

#: How often the registered executors are counted while new ones are awaited.
WARMUP_POLL_S = 0.05
#: Least time between two checks while an executor has not answered: each check puts a
#: task on every free slot, so checks back to back would starve the stream (measured:
#: a 24 s stall where the stream alone waited 19 s).
WARMUP_RETRY_S = 1.0
#: How long a warm-up waits for the executors asked for (a cluster manager that cannot
#: start them: the watch ends and nothing else changes).
WARMUP_TIMEOUT_S = 300.0


@dataclass
class WarmupReport:
    """What one warm-up did."""

    target: int
    """Executors expected after the scale-up."""
    warmed: list[str] = field(default_factory=list)
    """Executors (``host:pid``) that answered a warm-up task and were not known before."""
    jobs: int = 0
    """Check jobs run."""
    seconds: float = 0.0
    """From the decision to the last new executor answering (or the timeout)."""
    timed_out: bool = False


class ExecutorWarmup:
    """Warms the executors a scale-up adds, one watch at a time.

    Args:
        registered: Executors about to take tasks now (``SparkExecutors.starting``).
        check: Runs the sidecar check, one task per task slot registered now, and
            returns its rows (each with ``executor``).
        stopping: Set when the pipeline stops; a watch under way ends.
        poll_s, retry_s, timeout_s: See :data:`WARMUP_POLL_S`, :data:`WARMUP_RETRY_S`,
            :data:`WARMUP_TIMEOUT_S`.
    """

    def __init__(self, registered: Callable[[], int], check: Callable[[], list[dict]],
                 *, stopping: threading.Event | None = None,
                 poll_s: float = WARMUP_POLL_S, retry_s: float = WARMUP_RETRY_S,
                 timeout_s: float = WARMUP_TIMEOUT_S) -> None:
        self.registered = registered
        self.check = check
        self.stopping = stopping or threading.Event()
        self.poll_s = poll_s
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        self.last: WarmupReport | None = None
        self._thread: threading.Thread | None = None

    def start(self, target: int, known: set[str]) -> bool:
        """Watch in the background for ``target`` executors; ``known``: the executors
        (``host:pid``) that were there before. ``False`` while a watch is under way."""
        if self._thread is not None and self._thread.is_alive():
            return False
        self._thread = threading.Thread(target=self.run, args=(target, known),
                                        name="sts-warmup", daemon=True)
        self._thread.start()
        return True

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the watch under way, if any."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def run(self, target: int, known: set[str]) -> WarmupReport:
        """Until ``target`` executors are registered and each one not in ``known`` has
        answered a warm-up task (or the timeout, or the pipeline stops)."""
        started = time.monotonic()
        report = WarmupReport(target)
        seen = set(known)
        last_check = -float("inf")
        while not self.stopping.is_set():
            if time.monotonic() - started > self.timeout_s:
                report.timed_out = True
                logger.warning("Warm-up: %d of %d executors answered after %.0f s; the "
                               "stream's first tasks warm the rest.", len(seen), target,
                               self.timeout_s)
                break
            registered = self.registered()
            if registered > len(seen) and time.monotonic() - last_check >= self.retry_s:
                last_check = time.monotonic()
                try:
                    rows = self.check()
                except Exception as e:  # an executor lost while starting: try again
                    logger.debug("Warm-up check failed: %s", str(e).splitlines()[0])
                    rows = []
                report.jobs += 1
                new = {r["executor"] for r in rows if r.get("executor")} - seen
                seen |= new
                report.warmed.extend(sorted(new))
            if len(seen) >= target and registered >= target:
                break
            self.stopping.wait(self.poll_s)
        report.seconds = round(time.monotonic() - started, 1)
        self.last = report
        if report.warmed:
            logger.info("Warm-up: %d new executor(s) warm, sidecars serving, %.1f s after the "
                        "scale-up (%d check jobs).", len(report.warmed), report.seconds,
                        report.jobs)
        return report
