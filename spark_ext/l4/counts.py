"""What the pipeline's writers did since it started: the counters ``/metrics``, the
progress lines and the demo's summary read. Plain data (no lock: each counter is
changed by one writer thread), so the ``foreachBatch`` functions that carry it can be
pickled to Spark Connect's server, where they count in the server's process."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field


#: Answers micro-batches whose steps :class:`PipelineCounts` keeps one by one (an hour at
#: one a second; ~2 MB).
RECENT_BATCHES = 3600

#: The steps of an answers micro-batch in the order they run
#: (:class:`~spark_ext.l4.answers_batch.AnswersBatch`); ``total`` is their sum.
STEP_ORDER = ("ledger", "answers", "answers_merge", "shadow_answers", "shadow_answers_merge",
              "requests", "results", "dead_letters", "review_queue", "release", "total")


@dataclass
class PipelineCounts:
    """Counters of one pipeline since it started."""

    submitted: int = 0
    """Requests submitted to the sidecar (ack rows of the submit micro-batches)."""

    dead_letters: int = 0
    """Source records that were not events (the ``dead_letters`` table)."""

    validation_failures: collections.Counter = field(default_factory=collections.Counter)
    """Answers replaced by the fallback, per validation rule."""

    answers_written: int = 0
    """Answer rows inserted (writer ``spark``: Delta's MERGE counts)."""

    backfilled: int = 0
    """Fallback answers upgraded with the model's later answer."""

    by_source: collections.Counter = field(default_factory=collections.Counter)
    """Answer rows offered to the table, by ``answer_source``."""

    by_source_status: collections.Counter = field(default_factory=collections.Counter)
    """... by ``(answer_source, status)``."""

    no_result_fallbacks: int = 0
    """Accepted requests answered with the fallback because no result came by their
    deadline plus the grace (the sidecar was down, a result was lost)."""

    unreadable_results: int = 0
    """Result records that did not parse (skipped; their requests get the fallback)."""

    conflicts_retried: int = 0
    """Delta write conflicts retried (another writer committed first)."""

    step_seconds: collections.Counter = field(default_factory=collections.Counter)
    """Seconds spent per step of the answers micro-batches (:meth:`add_batch`)."""

    step_batches: collections.Counter = field(default_factory=collections.Counter)
    """Answers micro-batches that ran each step."""

    recent_batches: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=RECENT_BATCHES))
    """The last :data:`RECENT_BATCHES` answers micro-batches: ``(epoch ms at their end,
    their steps in ms)``, for percentiles over a window (``sts bench``)."""

    open_by_bucket: dict[int, int] = field(default_factory=dict)
    """Accepted requests still waiting for their answer, per ledger bucket."""

    def add_batch(self, laps_ms: dict[str, float], *, ended_ms: int) -> None:
        """Count one answers micro-batch whose steps took ``laps_ms`` (step -> ms, with
        ``total``), ended at ``ended_ms``.

        Example:
            >>> c = PipelineCounts()
            >>> c.add_batch({"ledger": 300.0, "answers": 200.0, "total": 500.0}, ended_ms=1)
            >>> c.add_batch({"ledger": 500.0, "results": 250.0, "total": 750.0}, ended_ms=2)
            >>> c.step_batches["ledger"], c.step_batches["results"], c.step_seconds["total"]
            (2, 1, 1.25)
            >>> c.recent_batches[-1]
            (2, {'ledger': 500.0, 'results': 250.0, 'total': 750.0})
        """
        for step, ms in laps_ms.items():
            self.step_seconds[step] += ms / 1000.0
            self.step_batches[step] += 1
        self.recent_batches.append((ended_ms, laps_ms))

    def step_percentiles(self, since_ms: int = 0) -> dict[str, dict]:
        """Per step of the answers micro-batches that ended at or after ``since_ms``
        (of the last :data:`RECENT_BATCHES`): ``{"n": micro-batches that ran it, "p50",
        "p90"}`` in ms, in :data:`STEP_ORDER`; ``{}`` for none.

        Example:
            >>> c = PipelineCounts()
            >>> for t, laps in enumerate([{"ledger": 300.0, "total": 300.0},
            ...                           {"ledger": 500.0, "results": 250.0, "total": 750.0},
            ...                           {"ledger": 400.0, "total": 400.0}]):
            ...     c.add_batch(laps, ended_ms=t)
            >>> c.step_percentiles(since_ms=1)["ledger"]
            {'n': 2, 'p50': 450.0, 'p90': 490.0}
            >>> list(c.step_percentiles())
            ['ledger', 'results', 'total']
        """
        from sidecar import percentiles

        by_step: dict[str, list[float]] = {}
        for ended, laps in list(self.recent_batches):
            if ended >= since_ms:
                for step, ms in laps.items():
                    by_step.setdefault(step, []).append(ms)

        def order(step: str) -> int:
            return STEP_ORDER.index(step) if step in STEP_ORDER else STEP_ORDER.index("release")

        return {step: {"n": len(by_step[step]), **percentiles(by_step[step], (50, 90))}
                for step in sorted(by_step, key=order)}

    @property
    def open_requests(self) -> int:
        """Accepted requests still waiting for their answer (the work still out)."""
        return sum(self.open_by_bucket.values())
