"""Memory of the sidecar's de-duplication window at its default size (a figure, not a test).

Fills a :class:`sidecar.DedupeWindow` the way the scheduler does (every id
remembered once, 1 in 10 refused) with ids shaped like the Spark side's (32 hex
characters of a SHA-256), in a fresh process, and reports the growth of the
resident set size and the time per id.

Run::

    python -m benchmarks.dedupe_memory --ids 1000000
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import time


def rss_mb() -> float:
    """Resident set size of this process, MiB (Linux ``/proc``)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(ids: int, capacity: int) -> dict:
    """Fill a window of ``capacity`` with ``ids`` ids; RSS growth and time per id."""
    from sidecar import Ack, DedupeWindow
    from sidecar.contract import Priority, RefusalReason

    gc.collect()
    before = rss_mb()
    window = DedupeWindow(capacity)
    started = time.perf_counter()
    for i in range(ids):  # each id is made here: the window is what keeps it alive
        rid = hashlib.sha256(i.to_bytes(8, "little")).hexdigest()[:32]
        ack = (Ack(rid, False, RefusalReason.QUEUE_FULL, "pool normal is full", received_ts=i,
                   fallback_text="fallback") if i % 10 == 0
               else Ack(rid, True, received_ts=i))
        # the request's fingerprint (a 16-bit hash of its prompt): one int per id
        window.remember(ack, Priority.NORMAL, fingerprint=int(rid[:4], 16))
    elapsed = time.perf_counter() - started
    gc.collect()
    return {"ids": ids, "capacity": capacity, "window_len": len(window),
            "rss_growth_mb": round(rss_mb() - before, 1),
            "us_per_id": round(elapsed / ids * 1e6, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--capacity", type=int, default=1_000_000,
                        help="window size (default: the config default, 1M)")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.ids, args.capacity)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
