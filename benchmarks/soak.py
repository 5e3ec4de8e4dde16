"""A soak run: the default demo (its config, its rate) for an hour, sampled every minute,
to see that nothing grows: the driver's and the sidecar's RSS and open files, the sizes of
the landing folder, the results folder and the tables, and the answer lag (how long the
last minute's answers took, event to answer).

    python -m benchmarks.soak                               # 60 minutes, real SmolLM2
    python -m benchmarks.soak --minutes 15 --source kafka   # events and results over Kafka
    python -m benchmarks.soak --minutes 10 --engine simulated --out /tmp/soak

Writes ``soak.json`` (one row a minute) and ``soak.png`` (one panel per figure) into
``--out``; flat lines are the goal. The tables are sampled twice: their folders on disk
(live files plus the files compaction replaced, kept ``maintenance.vacuum_retention_hours``
for readers and time travel) and their live files (what the latest version reads).
``--replot`` reads a ``soak.json`` again, fills in what an older run did not sample
(the live tables, read from the tables' Delta logs at each sample's time) and redraws it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.cpu_accounting import machine_info, reference_cpu_ms
from sidecar import ENGINES
from sidecar.contract import now_ms
from spark_ext.kinds import CHANNEL_SIDES, writer_choices

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "soak"


def _folder_mb(path: Path) -> float:
    if not path.exists():
        return 0.0
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20, 2)


def _files(path: Path) -> int:
    return _files_named(path, "*")


def _files_named(path: Path, pattern: str) -> int:
    return sum(1 for p in path.rglob(pattern) if p.is_file()) if path.exists() else 0


#: The tables the demo writes (under ``<out>/tables``).
TABLES = ("answers", "requests", "results")


def live_tables(tables: str, at_ms: int | None = None) -> dict:
    """Files and MB the tables' latest versions read (at ``at_ms``, epoch ms, with time
    travel when given), summed over :data:`TABLES`; tables not yet created count 0."""
    import datetime

    import pyarrow as pa
    from deltalake import DeltaTable

    files = size = 0
    for name in TABLES:
        path = Path(tables) / name
        if not (path / "_delta_log").is_dir():
            continue
        dt = DeltaTable(str(path))
        if at_ms is not None:
            try:
                dt.load_as_version(datetime.datetime.fromtimestamp(at_ms / 1000,
                                                                   datetime.timezone.utc))
            except Exception:  # noqa: BLE001 - the table was created after at_ms
                continue
            if _created_ms(path) > at_ms:  # delta-rs falls back to version 0
                continue
        adds = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
        files += len(adds["path"])
        size += sum(adds["size_bytes"])
    return {"files": files, "mb": round(size / 2**20, 2)}


def _created_ms(table: Path) -> int:
    """When the local Delta table ``table`` was created: its first commit's timestamp."""
    first = table / "_delta_log" / f"{0:020d}.json"
    for line in first.read_text(encoding="utf-8").splitlines():
        action = json.loads(line)
        if "commitInfo" in action:
            return int(action["commitInfo"]["timestamp"])
    return int(first.stat().st_mtime * 1000)


def _table_facts(tables: str, since_ms: int) -> dict:
    """What the sampler's child process reads: the lag and the live tables."""
    answers = Path(tables) / "answers"
    lag = answer_lag(str(answers), since_ms) if (answers / "_delta_log").is_dir() \
        else {"answers": 0, "p50": None, "p99": None}
    return {"lag_ms": lag, "tables_live": live_tables(tables)}


def lag_windows(table: str, minutes: float = 10.0) -> list[dict]:
    """The answers in the Delta table ``table`` per ``minutes`` of event time: how many,
    the fallback share, and P50/P99 of event -> submitted (Spark's share), received ->
    finished (the sidecar's) and event -> answer landed."""
    from deltalake import DeltaTable

    from sidecar import percentiles

    rows = DeltaTable(table).to_pyarrow_dataset().to_table(columns=[
        "enqueue_ts", "submit_ts", "received_ts", "finish_ts", "latency_ms",
        "answer_source"]).to_pylist()
    rows = [r for r in rows if r["enqueue_ts"] is not None]
    if not rows:
        return []
    start, width = min(r["enqueue_ts"] for r in rows), int(minutes * 60_000)
    windows: dict[int, list[dict]] = {}
    for r in rows:
        windows.setdefault((r["enqueue_ts"] - start) // width, []).append(r)

    def hop(mine: list[dict], end: str, begin: str) -> dict:
        return percentiles([r[end] - r[begin] for r in mine
                            if r[end] is not None and r[begin] is not None], (50, 99), digits=0)

    return [{"from_minute": k * minutes, "answers": len(mine),
             "fallback_pct": round(100 * sum(r["answer_source"] == "fallback"
                                             for r in mine) / len(mine), 1),
             "event_to_submitted_ms": hop(mine, "submit_ts", "enqueue_ts"),
             "received_to_finished_ms": hop(mine, "finish_ts", "received_ts"),
             "event_to_answer_ms": percentiles([r["latency_ms"] for r in mine
                                                if r["latency_ms"] is not None],
                                               (50, 99), digits=0)}
            for k, mine in sorted(windows.items())]


def answer_lag(table: str, since_ms: int) -> dict:
    """The number of answers in the Delta table ``table``, the P50/P99 ``latency_ms``
    (event to answer) of those answered since ``since_ms`` and their P50 from event to
    submitted (``submit_p50``, Spark's share of the way)."""
    from deltalake import DeltaTable

    from sidecar import percentiles

    rows = DeltaTable(table).to_pyarrow_dataset().to_table(
        columns=["answered_ts", "latency_ms", "enqueue_ts", "submit_ts"]).to_pylist()
    recent = [r for r in rows if (r["answered_ts"] or 0) >= since_ms]
    to_submit = percentiles([r["submit_ts"] - r["enqueue_ts"] for r in recent
                             if r["submit_ts"] is not None and r["enqueue_ts"] is not None],
                            (50,), digits=0)
    return {"answers": len(rows), **percentiles(
        [r["latency_ms"] for r in recent if r["latency_ms"] is not None], (50, 99), digits=0),
        "submit_p50": to_submit["p50"]}


def _age_ms(timestamp: str) -> float:
    """How long ago a query progress's ISO timestamp was (ms)."""
    import datetime

    at = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return (datetime.datetime.now(datetime.timezone.utc) - at).total_seconds() * 1000


class SoakSampler(threading.Thread):
    """Every ``every_s``: RSS and open files of this process (the driver), of its JVM,
    of the sidecar and of the demo's Kafka broker (when there is one); sizes and file
    counts of the folders under the demo's ``out``; the live tables and the answers' lag."""

    def __init__(self, out: Path, every_s: float = 60.0) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        import psutil

        self.out, self.every_s = out, every_s
        self.me = psutil.Process()
        self.rows: list[dict] = []
        self.start_s = time.monotonic()
        self._halt = threading.Event()
        self.pipeline = None
        """The demo's pipeline once it started (its queries' progress, its counters)."""

    def _child(self, marker: str):
        """The first child process (at any depth) whose command line holds ``marker``."""
        for child in self.me.children(recursive=True):
            try:
                if marker in " ".join(child.cmdline()):
                    return child
            except Exception:  # noqa: BLE001 - a child that ended
                continue
        return None

    @staticmethod
    def _proc(p) -> dict:
        if p is None:
            return {"rss_mb": None, "open_files": None}
        try:
            return {"rss_mb": round(p.memory_info().rss / 2**20, 1), "open_files": p.num_fds()}
        except Exception:  # noqa: BLE001 - it exited
            return {"rss_mb": None, "open_files": None}

    def _table_facts(self, since_ms: int) -> dict:
        """The answers' lag since ``since_ms`` and the live tables, read in a child
        process so that the reads' memory is not counted as the driver's."""
        code = ("import json,sys; from benchmarks.soak import _table_facts; "
                "print(json.dumps(_table_facts(sys.argv[1], int(sys.argv[2]))))")
        done = subprocess.run([sys.executable, "-c", code, str(self.out / "tables"),
                               str(since_ms)], capture_output=True, text=True, timeout=120,
                              cwd=Path(__file__).resolve().parent.parent)
        if done.returncode != 0:  # a commit under way; the next sample reads it
            return {"lag_ms": {"answers": None, "p50": None, "p99": None},
                    "tables_live": {"files": None, "mb": None}}
        return json.loads(done.stdout)

    def _pipeline_facts(self) -> dict:
        """The answers micro-batch's duration (P50 of the last interval's batches with
        input), where their time went (per step, the P50 over the interval's micro-batches
        that ran it: the ledger, each table's write), the Kafka lag, the write conflicts
        retried and the requests still waiting."""
        import statistics

        p = self.pipeline
        if p is None:
            return {"answers_batch_ms_p50": None, "answers_write_ms": {}, "kafka_lag": None,
                    "conflicts_retried": None, "open_requests": None}
        since = self.every_s * 1000
        recent = [x for q in p.queries if q.name == "sts-answers" for x in q.recentProgress
                  if x["numInputRows"] and _age_ms(x["timestamp"]) <= since]
        durations = [x["durationMs"].get("triggerExecution", 0) for x in recent]
        lag = p.kafka_lag()
        return {"answers_batch_ms_p50": statistics.median(durations) if durations else None,
                "answers_write_ms": {step: v["p50"] for step, v in
                                     p.counts.step_percentiles(now_ms() - since).items()},
                "kafka_lag": sum(sum(v.values()) for v in lag.values()) if lag else 0,
                "conflicts_retried": p.counts.conflicts_retried,
                "open_requests": p.open_requests}

    def sample(self) -> dict:
        now = now_ms()
        tables = self.out / "tables"
        row = {"minute": round((time.monotonic() - self.start_s) / 60, 2), "ts_ms": now,
               "driver": self._proc(self.me),
               "driver_jvm": self._proc(self._child("org.apache.spark.deploy.SparkSubmit")),
               "sidecar": self._proc(self._child("sidecar.cli")),
               "broker": self._proc(self._child("kafka.Kafka")),
               "events_mb": _folder_mb(self.out / "events"),
               "event_files": _files(self.out / "events"),
               "events_read_mb": _folder_mb(self.out / "events-read"),
               "events_read_files": _files(self.out / "events-read"),
               "kafka_mb": _folder_mb(self.out / "kafka"),
               "results_mb": _folder_mb(self.out / "results"),
               "result_files": _files(self.out / "results"),
               "tables_mb": _folder_mb(tables),
               "table_data_files": _files_named(tables, "*.parquet"),
               "table_log_files": _files_named(tables, "_delta_log/*"),
               "checkpoints_mb": _folder_mb(self.out / "checkpoints"),
               "checkpoint_files": _files(self.out / "checkpoints"),
               **self._table_facts(now - int(self.every_s * 1000)),
               **self._pipeline_facts()}
        self.rows.append(row)
        print("soak " + json.dumps(row), flush=True)
        return row

    def run(self) -> None:
        """A sample every ``every_s`` after the start (a slow sample does not shift the
        next ones)."""
        due = self.start_s
        while True:
            due += self.every_s
            if self._halt.wait(max(0.0, due - time.monotonic())):
                return
            self.sample()

    def stop(self) -> None:
        self._halt.set()
        self.join()


#: The processes sampled: the driver's Python, the driver's JVM, the sidecar, the demo's
#: Kafka broker (``--source kafka``).
_PROCESSES = ("driver", "driver_jvm", "sidecar", "broker")


def _series(rows: list[dict], keys: dict[str, tuple[str, ...]]) -> dict[str, list]:
    """Label -> the values at ``keys[label]`` (a path into each row), for the labels some
    row has a value for (``--source files`` has no broker, ``kafka`` no events folder)."""
    def value(row: dict, path: tuple[str, ...]):
        for key in path:
            row = row.get(key) if isinstance(row, dict) else None
        return row

    series = {label: [value(r, path) for r in rows] for label, path in keys.items()}
    return {label: values for label, values in series.items() if any(values)}


def plot(rows: list[dict], path: Path) -> Path:
    """One panel per figure over the minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["minute"] for r in rows]
    panels = [
        ("RSS (MB)", _series(rows, {who: (who, "rss_mb") for who in _PROCESSES})),
        ("open files", _series(rows, {who: (who, "open_files") for who in _PROCESSES})),
        ("folders (MB)", _series(rows, {
            "landing": ("events_mb",), "read events": ("events_read_mb",),
            "kafka": ("kafka_mb",), "results": ("results_mb",),
            "tables on disk": ("tables_mb",), "tables live": ("tables_live", "mb"),
            "checkpoints": ("checkpoints_mb",)})),
        ("files", _series(rows, {
            "landing": ("event_files",), "results": ("result_files",),
            "table data on disk": ("table_data_files",),
            "table data live": ("tables_live", "files"), "table log": ("table_log_files",),
            "checkpoints": ("checkpoint_files",)})),
        ("answer lag (ms)", _series(rows, {"p50": ("lag_ms", "p50"),
                                           "p99": ("lag_ms", "p99"),
                                           "to submit p50": ("lag_ms", "submit_p50")})),
    ]
    if any(r.get("answers_batch_ms_p50") is not None for r in rows):  # runs since the ledger
        panels.append(("answers batch (ms)", _series(rows, {
            "P50": ("answers_batch_ms_p50",), "answers write": ("answers_write_ms", "answers"),
            "ledger": ("answers_write_ms", "ledger")})))
        panels.append(("backlog", _series(rows, {"kafka lag (records)": ("kafka_lag",),
                                                 "open requests": ("open_requests",)})))
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.4 * len(panels)), sharex=True)
    for ax, (title, series) in zip(axes, panels):
        for label, values in series.items():
            ax.plot(minutes, values, marker=".", label=label)
        ax.set_ylabel(title)
        ax.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("minutes")
    fig.suptitle("sts demo soak")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def replot(out: Path) -> int:
    """Redraw ``out/soak.json`` into ``out/soak.png``, first filling in the live tables
    of samples without them from the tables under ``out/work/tables`` (time travel to
    each sample's ``ts_ms``; a run without ``ts_ms`` gets it from ``start_ms`` and the
    sample's minute) and the answers per 10 minutes (:func:`lag_windows`)."""
    path = out / "soak.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    tables = out / "work" / "tables"
    for row in doc["samples"]:
        row.setdefault("ts_ms", int(doc["start_ms"] + row["minute"] * 60_000))
        if "tables_live" not in row and tables.is_dir():
            row["tables_live"] = live_tables(str(tables), at_ms=row["ts_ms"])
    if "windows" not in doc and (tables / "answers" / "_delta_log").is_dir():
        doc["windows"] = lag_windows(str(tables / "answers"))
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    print(f"wrote {path} and {plot(doc['samples'], out / 'soak.png')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=60.0, help="minutes of replay")
    p.add_argument("--engine", choices=ENGINES.names, default=ENGINES.default)
    p.add_argument("--rate", type=float, default=3.0, help="events/s (the demo's default)")
    p.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    p.add_argument("--source", choices=CHANNEL_SIDES.names, default=CHANNEL_SIDES.default,
                   help="where events and results travel (the demo's --source)")
    p.add_argument("--writer", choices=writer_choices(), default=None,
                   help="output.writer (default: the demo's)")
    p.add_argument("--no-l1l2", dest="l1l2", action="store_false",
                   help="L1 routing, L2 retrieval and the feature lookup off (every event to "
                        "the model): the write path alone, without L1's MiniLM on the cores")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--replot", action="store_true",
                   help="redraw --out's soak.json (filling in the live tables) and exit")
    args = p.parse_args(argv)
    if args.replot:
        return replot(args.out)

    from sts_harness.demo import DemoOptions, print_summary, run_demo

    args.out.mkdir(parents=True, exist_ok=True)
    demo_out = args.out / "work"  # the demo's own folders (git-ignored)
    sampler = SoakSampler(demo_out.resolve(), every_s=args.every)
    opts = DemoOptions(rate=args.rate, duration=args.minutes * 60, out=str(demo_out),
                       engine=args.engine, source=args.source, overwrite=True,
                       l1l2=args.l1l2, on_start=lambda pipeline: setattr(sampler, "pipeline", pipeline),
                       **({"writer": args.writer} if args.writer else {}))
    doc = {"machine": machine_info(), "reference_cpu_ms_before": reference_cpu_ms(),
           "minutes": args.minutes, "engine": args.engine, "rate": args.rate,
           "source": args.source, "writer": opts.resolved_writer(), "l1l2": args.l1l2,
           "start_ms": now_ms()}
    sampler.start()
    try:
        summary = run_demo(opts)
    finally:
        sampler.sample()
        sampler.stop()
    doc["reference_cpu_ms_after"] = reference_cpu_ms()
    doc["samples"] = sampler.rows
    answers = demo_out / "tables" / "answers"
    doc["windows"] = lag_windows(str(answers)) if (answers / "_delta_log").is_dir() else []
    for w in doc["windows"]:
        print("window " + json.dumps(w))
    doc["summary"] = {k: summary.get(k) for k in ("events", "answers", "answers_by_source",
                                                  "incomplete")}
    (args.out / "soak.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    print_summary(summary)
    print(f"wrote {args.out / 'soak.json'} and {plot(sampler.rows, args.out / 'soak.png')}")
    return 1 if summary.get("incomplete") else 0


if __name__ == "__main__":
    sys.exit(main())
