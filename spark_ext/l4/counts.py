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

    def add_merge(self, metrics: dict, offered: list[dict]) -> None:
        """Count one MERGE: its metrics, and the rows offered (``answer_source``,
        ``status``, ``n``)."""
        self.answers_written += int(metrics.get("num_inserted_rows") or 0)
        self.backfilled += int(metrics.get("num_updated_rows") or 0)
        for row in offered:
            self.by_source[row["answer_source"]] += row["n"]
            self.by_source_status[(row["answer_source"], row["status"] or "")] += row["n"]
