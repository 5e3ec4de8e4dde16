"""Does one micro-batch's answer write stay flat as the ``answers`` table grows?

Grows a real Delta ``answers`` table (written by the ``deltalake`` writer,
:class:`spark_ext.l4.writers.deltalake.DeltalakeWriter`, partitioned by enqueue hour)
to each size of a ladder, as a stream at 200 events/s would (rows spread over the hours
they would have arrived in), runs the pipeline's maintenance (compaction of the recent
partitions, vacuum), then times what the answers query does per micro-batch: a 200-row
idempotent append (with its app-transaction check) and a backfill MERGE of 20 late
results. Prints a table, writes ``delta_growth.json`` and a plot.

    python -m benchmarks.delta_growth                       # 10k, 100k, 1M rows
    python -m benchmarks.delta_growth --sizes 10000,50000 --batches 10 --out /tmp/dg
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.cli_args import positive_ints
from sidecar import write_text_atomically
from sidecar.contract import now_ms
from spark_ext.config import OutputConfig
from spark_ext.l4.answer_store import AnswerStore
from spark_ext.l4.answers import build_answers
from spark_ext.l4.writers.deltalake import DeltalakeWriter

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "delta_growth"
RATE_PER_S = 200
BATCH_ROWS = 200
BACKFILL_ROWS = 20
_CHUNK = 100_000


def _rows(start: int, n: int, until_ms: int, *, source: str = "llm") -> list[dict]:
    """``n`` answer rows for ids ``start..``, arrived at 200/s up to ``until_ms``."""
    out = []
    for i in range(start, start + n):
        enqueue = until_ms - (start + n - i) * 1000 // RATE_PER_S
        out.append({"request_id": f"r{i:09d}", "trace_id": f"t{i}", "priority": "normal",
                    "answer": "Thanks, your order ships today." if source == "llm" else "F",
                    "answer_source": source, "status": "ok" if source == "llm" else "timeout",
                    "reason": None, "fallback_text": None if source == "llm" else "F",
                    "enqueue_ts": enqueue, "submit_ts": enqueue + 3, "received_ts": enqueue + 4,
                    "finish_ts": enqueue + 900, "deadline_ts": enqueue + 10_000,
                    "event_id": f"e{i}"})
    return out


def _grow(store: AnswerStore, have: int, want: int, at_ms: int) -> int:
    """Bulk-append rows until the table holds ``want`` (times are what 200/s gives)."""
    while have < want:
        n = min(_CHUNK, want - have)
        table = build_answers(_rows(have, n, at_ms), store.key_columns, at_ms)
        store.append("answers", table, app_id="bulk", version=have)
        have += n
    return have


def measure(size: int, batches: int, workdir: Path, writer: DeltalakeWriter,
            have: int) -> dict:
    """Grow to ``size`` rows, then time ``batches`` micro-batch writes at that size."""
    store = writer.store
    now = now_ms()
    start = time.perf_counter()
    have = _grow(store, have, size, now)
    # What the pipeline's maintenance ticker does every few minutes: compact the recent
    # partitions (the small files of earlier micro-batches) and vacuum.
    store.maintain(vacuum_retention_hours=0, now_ms=now)
    grow_s = time.perf_counter() - start
    appends, backfills = [], []
    next_id = 10_000_000_000 + size * 10
    for b in range(batches):
        fallback = _rows(next_id, BATCH_ROWS, now_ms(), source="fallback")
        next_id += BATCH_ROWS
        t0 = time.perf_counter()
        writer.append("answers", build_answers(fallback, store.key_columns, now_ms()),
                      app_id=f"answers-{size}", version=b)
        appends.append((time.perf_counter() - t0) * 1000)
        late = build_answers([dict(r, answer="late answer", answer_source="backfill",
                                   status="ok") for r in fallback[:BACKFILL_ROWS]],
                             store.key_columns, now_ms())
        t0 = time.perf_counter()
        writer.merge_answers("answers", late, backfill=True)
        backfills.append((time.perf_counter() - t0) * 1000)
    rows = size + batches * BATCH_ROWS
    return {"rows": rows, "grow_s": round(grow_s, 1),
            "append_ms_p50": round(statistics.median(appends), 1),
            "append_ms_max": round(max(appends), 1),
            "backfill_ms_p50": round(statistics.median(backfills), 1),
            "backfill_ms_max": round(max(backfills), 1), "files": len(
                store._table("answers").file_uris())}, rows


def _plot(points: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    rows = [p["rows"] for p in points]
    ax.plot(rows, [p["append_ms_p50"] for p in points], "o-", label="200-row append (P50)")
    ax.plot(rows, [p["backfill_ms_p50"] for p in points], "s-", label="20-id backfill (P50)")
    ax.set_xscale("log")
    ax.set_xlabel("rows in answers")
    ax.set_ylabel("ms per micro-batch")
    ax.set_ylim(bottom=0)
    ax.set_title("Answer write cost vs table size")
    ax.legend()
    fig.tight_layout()
    path = out / "delta_growth.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(sizes: list[int], batches: int, out: Path) -> dict:
    """Measure every size (one growing table); write JSON and a plot into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    points = []
    with tempfile.TemporaryDirectory(prefix="sts-delta-growth-") as tmp:
        writer = DeltalakeWriter(OutputConfig(out_dir=str(Path(tmp) / "tables"),
                                               writer="deltalake"), ("event_id",))
        have = 0
        print(f"{'rows':>10}{'grow s':>9}{'append p50':>12}{'max':>8}{'backfill p50':>14}"
              f"{'max':>8}{'files':>7}", flush=True)
        for size in sorted(sizes):
            point, have = measure(size, batches, Path(tmp), writer, have)
            points.append(point)
            print(f"{point['rows']:>10}{point['grow_s']:>9}{point['append_ms_p50']:>12}"
                  f"{point['append_ms_max']:>8}{point['backfill_ms_p50']:>14}"
                  f"{point['backfill_ms_max']:>8}{point['files']:>7}", flush=True)
    first, last = points[0], points[-1]
    doc = {"batch_rows": BATCH_ROWS, "backfill_rows": BACKFILL_ROWS, "points": points,
           "append_ratio_largest_vs_smallest": round(
               last["append_ms_p50"] / first["append_ms_p50"], 2),
           "backfill_ratio_largest_vs_smallest": round(
               last["backfill_ms_p50"] / first["backfill_ms_p50"], 2)}
    doc["plot"] = str(_plot(points, out))
    write_text_atomically(out / "delta_growth.json", json.dumps(doc, indent=1))
    print(f"append at {last['rows']} rows = {doc['append_ratio_largest_vs_smallest']}x its "
          f"time at {first['rows']}; backfill {doc['backfill_ratio_largest_vs_smallest']}x. "
          f"Wrote {out / 'delta_growth.json'}", flush=True)
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.delta_growth", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000,1000000",
                   help="comma-separated table sizes (rows)")
    p.add_argument("--batches", type=int, default=20, help="micro-batches timed per size")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for JSON and plot")
    args = p.parse_args(argv)
    sizes = positive_ints(p, "--sizes", args.sizes)
    if args.batches < 1:
        p.error("--batches must be >= 1")
    run(sizes, args.batches, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
