"""A soak run: the default demo (its config, its rate) for an hour, sampled every minute,
to see that nothing grows: the driver's and the sidecar's RSS and open files, the sizes of
the landing folder, the results folder and the tables, and the answer lag (how long the
last minute's answers took, event to answer).

    python -m benchmarks.soak                               # 60 minutes, real SmolLM2
    python -m benchmarks.soak --minutes 10 --engine simulated --out /tmp/soak

Writes ``soak.json`` (one row a minute) and ``soak.png`` (one panel per figure) into
``--out``; flat lines are the goal.
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

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "soak"


def _folder_mb(path: Path) -> float:
    if not path.exists():
        return 0.0
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20, 2)


def _files(path: Path) -> int:
    return sum(1 for p in path.rglob("*") if p.is_file()) if path.exists() else 0


class SoakSampler(threading.Thread):
    """Every ``every_s``: RSS and open files of this process (the driver) and of the
    sidecar child, folder sizes under the demo's ``out``, and the answers' lag."""

    def __init__(self, out: Path, every_s: float = 60.0) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        import psutil

        self.out, self.every_s = out, every_s
        self.me = psutil.Process()
        self.rows: list[dict] = []
        self.start_s = time.monotonic()
        self._halt = threading.Event()

    def _sidecar(self):
        for child in self.me.children(recursive=True):
            try:
                if "sidecar.cli" in " ".join(child.cmdline()):
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

    def _lag(self, since_ms: int) -> dict:
        """P50/P99 ``latency_ms`` of the answers landed since ``since_ms``."""
        from deltalake import DeltaTable

        from sidecar import percentiles

        table = self.out / "tables" / "answers"
        if not (table / "_delta_log").is_dir():
            return {"answers": 0, "p50": None, "p99": None}
        try:
            rows = DeltaTable(str(table)).to_pyarrow_dataset().to_table(
                columns=["answered_ts", "latency_ms"]).to_pylist()
        except Exception:  # noqa: BLE001 - a commit under way; the next sample reads it
            return {"answers": None, "p50": None, "p99": None}
        recent = [r["latency_ms"] for r in rows if (r["answered_ts"] or 0) >= since_ms
                  and r["latency_ms"] is not None]
        return {"answers": len(rows), **percentiles(recent, (50, 99), digits=0)}

    def sample(self) -> dict:
        now = now_ms()
        row = {"minute": round((time.monotonic() - self.start_s) / 60, 2),
               "driver": self._proc(self.me), "sidecar": self._proc(self._sidecar()),
               "events_mb": _folder_mb(self.out / "events"),
               "event_files": _files(self.out / "events"),
               "results_mb": _folder_mb(self.out / "results"),
               "result_files": _files(self.out / "results"),
               "tables_mb": _folder_mb(self.out / "tables"),
               "checkpoints_mb": _folder_mb(self.out / "checkpoints"),
               "lag_ms": self._lag(now - int(self.every_s * 1000))}
        self.rows.append(row)
        print("soak " + json.dumps(row), flush=True)
        return row

    def run(self) -> None:
        while not self._halt.wait(self.every_s):
            self.sample()

    def stop(self) -> None:
        self._halt.set()
        self.join()


def plot(rows: list[dict], path: Path) -> Path:
    """One panel per figure over the minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["minute"] for r in rows]
    panels = [
        ("RSS (MB)", {"driver": [r["driver"]["rss_mb"] for r in rows],
                      "sidecar": [r["sidecar"]["rss_mb"] for r in rows]}),
        ("open files", {"driver": [r["driver"]["open_files"] for r in rows],
                        "sidecar": [r["sidecar"]["open_files"] for r in rows]}),
        ("folders (MB)", {"events": [r["events_mb"] for r in rows],
                          "results": [r["results_mb"] for r in rows],
                          "tables": [r["tables_mb"] for r in rows],
                          "checkpoints": [r["checkpoints_mb"] for r in rows]}),
        ("answer lag (ms)", {"p50": [r["lag_ms"]["p50"] for r in rows],
                             "p99": [r["lag_ms"]["p99"] for r in rows]}),
    ]
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=60.0, help="minutes of replay")
    p.add_argument("--engine", choices=("vllm", "simulated"), default="vllm")
    p.add_argument("--rate", type=float, default=3.0, help="events/s (the demo's default)")
    p.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)

    from sts_harness.demo import DemoOptions, print_summary, run_demo

    args.out.mkdir(parents=True, exist_ok=True)
    demo_out = args.out / "demo"
    opts = DemoOptions(rate=args.rate, duration=args.minutes * 60, out=str(demo_out),
                       engine=args.engine, overwrite=True)
    sampler = SoakSampler(demo_out.resolve(), every_s=args.every)
    doc = {"machine": machine_info(), "reference_cpu_ms_before": reference_cpu_ms(),
           "minutes": args.minutes, "engine": args.engine, "rate": args.rate}
    sampler.start()
    try:
        summary = run_demo(opts)
    finally:
        sampler.sample()
        sampler.stop()
    doc["reference_cpu_ms_after"] = reference_cpu_ms()
    doc["samples"] = sampler.rows
    doc["summary"] = {k: summary.get(k) for k in ("events", "answers", "answers_by_source",
                                                  "incomplete")}
    (args.out / "soak.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    print_summary(summary)
    print(f"wrote {args.out / 'soak.json'} and {plot(sampler.rows, args.out / 'soak.png')}")
    return 1 if summary.get("incomplete") else 0


if __name__ == "__main__":
    sys.exit(main())
