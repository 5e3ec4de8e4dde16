"""A user's own job in its first minute: ``LlmInference.start(warm_up=True)`` against
``warm_up=False``, each run in a fresh process (a cold JVM, cold Python workers, a fresh
simulated sidecar), the two alternating.

The job is the one a user writes from the README: a ``rate`` source shaped into ``id``,
``text`` and a priority (a quarter ``high``, 3 s SLA from the event's own time), answers
collected by the user's own ``foreachBatch``. Reported per run: the share of ``high``
requests answered by the model within their deadline among the events of the first 25 s
and of the whole run, every priority's on-time share, and how long ``start()`` took.

    python -m benchmarks.user_job_warmup --runs 2 --seconds 60 --rate 20 \\
        --out benchmarks/results/user-job-warmup
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: The events whose deadlines the cold queries miss (the issue's observation: ~25 s).
EARLY_S = 25.0


def run_once(warm_up: bool, seconds: float, rate: int, work: Path) -> dict:
    """One job from a cold start; the figures of its answers."""
    from pyspark.sql import functions as F

    from spark_ext import LlmInference, local_session
    from sts_harness import SidecarProcess

    with SidecarProcess(work / "results", ["--engine", "simulated"],
                        log_path=work / "sidecar.log") as sidecar:
        spark = local_session("user-job-warmup")
        llm = LlmInference(spark, key="id", checkpoint_location=str(work / "chk"),
                           sidecar=sidecar.target, results_dir=str(work / "results"),
                           fallback_text="Later.")
        events = (spark.readStream.format("rate").option("rowsPerSecond", rate).load()
                  .select(F.col("value").cast("string").alias("id"),
                          F.concat(F.lit("What is "), F.col("value").cast("string"),
                                   F.lit(" plus one?")).alias("text"),
                          F.when(F.col("value") % 4 == 0, "high")
                          .when(F.col("value") % 4 == 1, "normal").otherwise("low").alias("p"),
                          (F.unix_micros("timestamp") / 1000).cast("long").alias("event_ms")))
        requests = llm.requests(events, template="You answer in one short sentence.\n"
                                "Question: {text}\nAnswer:", priority="p", max_tokens=16,
                                enqueue_ts="event_ms")
        rows: list[dict] = []

        def sink(batch, _batch_id: int) -> None:
            rows.extend(r.asDict() for r in batch.select(
                "request_id", "priority", "enqueue_ts", "deadline_met", "answer_source",
                "write").collect())

        started = time.monotonic()
        queries = llm.start(requests, answers_writer=lambda a: a.writeStream.foreachBatch(sink),
                            warm_up=warm_up)
        start_s = time.monotonic() - started
        time.sleep(seconds)  # the load runs for its duration; no assertion waits on it
        stop_at = time.time() * 1000
        time.sleep(30 + 2 + 5)  # the largest SLA + grace + 5 s: every request answered
        queries.stop()
        spark.stop()
    return _figures([r for r in rows if r["write"] == "append"], stop_at, warm_up, start_s)


def _figures(rows: list[dict], stop_at_ms: float, warm_up: bool, start_s: float) -> dict:
    """On-time shares of the events before ``stop_at_ms``, early and overall."""
    rows = [r for r in rows if r["enqueue_ts"] < stop_at_ms]
    first = min((r["enqueue_ts"] for r in rows), default=0)

    def share(selected: list[dict]) -> float | None:
        good = [r for r in selected if r["deadline_met"] and r["answer_source"] == "llm"]
        return round(len(good) / len(selected), 3) if selected else None

    high = [r for r in rows if r["priority"] == "high"]
    return {"warm_up": warm_up, "start_s": round(start_s, 1), "answers": len(rows),
            "distinct_requests": len({r["request_id"] for r in rows}),
            "high": len(high),
            "high_on_time_first_25s": share([r for r in high
                                             if r["enqueue_ts"] - first < EARLY_S * 1000]),
            "high_on_time": share(high), "all_on_time": share(rows)}


def main(argv: list[str] | None = None) -> int:
    """Alternate cold runs with and without the warm-up; print and write the figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2, help="runs of each mode")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--rate", type=int, default=20, help="events/s")
    p.add_argument("--out", default="./sts-user-job-warmup")
    p.add_argument("--one", choices=["on", "off"], help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:  # a child: one cold run
        with tempfile.TemporaryDirectory(prefix="sts-warmup-") as work:
            result = run_once(args.one == "on", args.seconds, args.rate, Path(work))
        Path(args.json).write_text(json.dumps(result))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for i in range(args.runs):
        for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
            path = out / f"run-{i}-{mode}.json"
            subprocess.run([sys.executable, "-m", "benchmarks.user_job_warmup", "--one", mode,
                            "--seconds", str(args.seconds), "--rate", str(args.rate),
                            "--json", str(path)], check=True,
                           env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
            results.append(json.loads(path.read_text()))
            print(json.dumps(results[-1]), flush=True)
    (out / "summary.json").write_text(json.dumps(
        {"seconds": args.seconds, "rate": args.rate, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
