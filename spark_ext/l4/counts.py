"""What the pipeline's writers did since it started: the counters ``/metrics``, the
progress lines and the demo's summary read. Plain data (no lock: each counter is
changed by one writer thread), so the ``foreachBatch`` functions that carry it can be
pickled to Spark Connect's server, where they count in the server's process."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field


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

    last_batch_ms: dict[str, float] = field(default_factory=dict)
    """Where the last answers micro-batch's time went: the ledger, then each table's
    write (ms)."""

    open_by_bucket: dict[int, int] = field(default_factory=dict)
    """Accepted requests still waiting for their answer, per ledger bucket."""

    @property
    def open_requests(self) -> int:
        """Accepted requests still waiting for their answer (the work still out)."""
        return sum(self.open_by_bucket.values())
