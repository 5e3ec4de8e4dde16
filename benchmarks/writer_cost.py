"""What the driver pays per 1,000 events/s with each writer of the tables: Delta on Spark
(``output.writer: spark``: the executors write, the driver coordinates) against delta-rs
from the driver (``deltalake``: every answer, request and result row is collected to the
driver and written there).

Per writer and offered rate: the whole pipeline (files source, a simulated sidecar with
the seed-scale config, both queries with the ledger) runs for ``--duration`` seconds of
replayed events, and ``/proc`` is sampled every second for the driver's Python process
(CPU seconds, RSS) and for the JVM with its Python workers (in local mode the JVM is the
executors too, so its CPU is the executors' work). Reported per 1,000 events/s: driver
CPU cores, driver RSS growth, executor (JVM + workers) cores; and the answered share.

    python -m benchmarks.writer_cost                         # 200 and 800 events/s, 30 s each
    python -m benchmarks.writer_cost --rates 200 --duration 20 --writers spark
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from benchmarks.cpu_accounting import machine_info, reference_cpu_ms
from sidecar.contract import now_ms
from spark_ext.kinds import WRITERS

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "writer_cost"
SEED_RATE = 200.0


class _Sampler(threading.Thread):
    """CPU seconds and RSS of the driver and of the JVM's process tree, every second."""

    def __init__(self, jvm_pid: int) -> None:
        super().__init__(daemon=True)
        import psutil

        self.driver = psutil.Process()
        self.jvm = psutil.Process(jvm_pid)
        self.samples: list[dict] = []
        self._halt = threading.Event()

    def _tree_cpu(self) -> float:
        total = 0.0
        for p in [self.jvm, *self.jvm.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except Exception:  # noqa: BLE001 - a worker that ended
                continue
        return total

    def sample(self) -> dict:
        t = self.driver.cpu_times()
        return {"t": time.monotonic(), "driver_cpu_s": t.user + t.system,
                "driver_rss_mb": self.driver.memory_info().rss / 2**20,
                "executor_cpu_s": self._tree_cpu()}

    def run(self) -> None:
        while not self._halt.wait(1.0):
            self.samples.append(self.sample())

    def stop(self) -> None:
        self._halt.set()
        self.join()


def _config(work: Path, target: str, results: Path, writer: str):
    from spark_ext import PipelineConfig
    from sts_harness.replay import EVENT_SCHEMA

    from sts_harness.support_app import support_sections

    return PipelineConfig.from_dict(support_sections({
        "source": {"path": str(work / "events"), "schema": EVENT_SCHEMA,
                   "options": {"maxFilesPerTrigger": "1000"}},
        "tagging": {"sla_ms": {"high": 30_000, "normal": 60_000, "low": 90_000},
                    "max_tokens": 16, "max_tokens_column": "max_tokens"},
        "sidecar": {"endpoint": target, "results_dir": str(results), "timeout_s": 30.0},
        "answers": {"grace_ms": 2000},
        "output": {"out_dir": str(work / "tables"), "checkpoint_dir": str(work / "ckpt"),
                   "writer": writer},
    }))


def _events(n: int, rate: float, run: str):
    arrivals = [i / rate for i in range(n)]

    def make(start_ms: int) -> list[dict]:
        return [{"event_id": f"{run}-{i}", "text": f"Where is my order {i}?",
                 "priority": ("high", "normal", "low")[i % 3],
                 "event_ts": start_ms + round(at * 1000), "max_tokens": 8}
                for i, at in enumerate(arrivals)]

    return arrivals, make


def run_one(spark, target: str, results: Path, work: Path, writer: str, rate: float,
            duration_s: float) -> dict:
    """One writer at one rate: the figures of its window."""
    from spark_ext import StsPipeline
    from sts_harness.replay import EventReplayer, FolderSink

    pipeline = StsPipeline(spark, _config(work, target, results, writer))
    pipeline.start()
    sampler = _Sampler(spark.sparkContext._gateway.proc.pid)
    try:
        n = int(rate * duration_s)
        arrivals, make = _events(n, rate, f"{writer}-{rate:g}-{now_ms()}")
        replayer = EventReplayer(FolderSink(work / "events"), arrivals, make)
        start = sampler.sample()
        sampler.start()
        replayer.start()
        replayer.join()
        window = sampler.sample()
        deadline = time.monotonic() + 120
        answered = 0
        while time.monotonic() < deadline:
            pipeline.check()
            answered = pipeline.store.read("answers", ["request_id"]).num_rows
            if answered >= n:
                break
            time.sleep(1.0)
        end = sampler.sample()
    finally:
        sampler.stop()
        pipeline.stop()
    seconds = window["t"] - start["t"]
    per_k = 1000.0 / rate
    driver_cores = (window["driver_cpu_s"] - start["driver_cpu_s"]) / seconds
    executor_cores = (window["executor_cpu_s"] - start["executor_cpu_s"]) / seconds
    rss_max = max([s["driver_rss_mb"] for s in sampler.samples] + [end["driver_rss_mb"]])
    return {
        "writer": pipeline.writer, "rate": rate, "events": n, "answered": answered,
        "answered_share": round(answered / n, 4) if n else None,
        "window_s": round(seconds, 1),
        "drain_s": round(end["t"] - window["t"], 1),
        "driver_cores": round(driver_cores, 3),
        "driver_cores_per_1k_eps": round(driver_cores * per_k, 3),
        "executor_cores": round(executor_cores, 3),
        "executor_cores_per_1k_eps": round(executor_cores * per_k, 3),
        "driver_rss_start_mb": round(start["driver_rss_mb"], 1),
        "driver_rss_max_mb": round(rss_max, 1),
        "driver_rss_growth_mb_per_1k_eps": round((rss_max - start["driver_rss_mb"]) * per_k, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.writer_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default=f"{SEED_RATE:g},{4 * SEED_RATE:g}",
                   help="offered events/s, comma-separated (default: the seed rate and 4x it)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of replay per run")
    p.add_argument("--writers", default=",".join(WRITERS.names),
                   help="comma-separated: deltalake, spark")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    try:
        rates = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        p.error(f"--rates must be comma-separated numbers, got {args.rates!r}")
    if not rates or min(rates) <= 0:
        p.error(f"--rates must be > 0, got {args.rates!r}")
    writers = [w.strip() for w in args.writers.split(",") if w.strip()]
    if unknown := set(writers) - set(WRITERS.names):
        print(f"sts: unknown writers {sorted(unknown)} (benchmarks.writer_cost)", file=sys.stderr)
        return 2

    import tempfile

    from spark_ext.session import local_session
    from sts_harness.process import SidecarProcess

    args.out.mkdir(parents=True, exist_ok=True)
    conf = Path(__file__).resolve().parents[1] / "conf" / "sidecar-seed-sim.yaml"
    doc = {"machine": machine_info(), "reference_cpu_ms_before": reference_cpu_ms(),
           "duration_s": args.duration, "runs": []}
    with tempfile.TemporaryDirectory(prefix="sts-writer-cost-") as tmp:
        tmp_path = Path(tmp)
        with SidecarProcess(tmp_path / "results", ["--config", str(conf)],
                            log_path=tmp_path / "sidecar.log") as sidecar:
            spark = local_session("sts-writer-cost")
            try:
                for rate in rates:
                    for writer in writers:
                        work = tmp_path / f"{writer}-{rate:g}"
                        row = run_one(spark, sidecar.target, tmp_path / "results", work,
                                      writer, rate, args.duration)
                        doc["runs"].append(row)
                        print(json.dumps(row), flush=True)
            finally:
                spark.stop()
    doc["reference_cpu_ms_after"] = reference_cpu_ms()
    (args.out / "writer_cost.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    print(f"{'writer':<10} {'rate':>6} {'answered':>9} {'driver cores/1k':>16} "
          f"{'executor cores/1k':>18} {'driver RSS max MB':>18}")
    for r in doc["runs"]:
        print(f"{r['writer']:<10} {r['rate']:>6g} {r['answered_share']:>9.0%} "
              f"{r['driver_cores_per_1k_eps']:>16.3f} {r['executor_cores_per_1k_eps']:>18.3f} "
              f"{r['driver_rss_max_mb']:>18.0f}")
    print(f"wrote {args.out / 'writer_cost.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
