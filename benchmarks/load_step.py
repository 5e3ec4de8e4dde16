"""Elastic capacity on a load step (issue 32): the pipeline on a real multi-executor
Spark with one fake GPU per executor and a lazily started simulated sidecar per GPU.

Three runs on the same generated events, one after the other, each in its own process
(a ``local-cluster`` session cannot share one)::

    python -m benchmarks.load_step --out benchmarks/results/load-step
    python -m benchmarks.load_step --runs elastic --base-min 1 --step-min 1 --after-min 1 \\
        --up-window 20 --down-window 40 --cooldown 30 --check-interval 10   # a quick look

- ``elastic``: ``scaling.enabled`` between ``min_gpus`` 1 and ``max_gpus`` 4: the cluster
  starts four workers and the run releases three before the events flow, so the
  controller starts at one GPU and asks Spark for more (``requestTotalExecutors``) and
  gives them back (decommissioning: the released executor's sidecar drains, then exits);
- ``static-1`` and ``static-4``: one and four GPU executors for the whole run (the scale
  signal is still computed and reported).

The traffic: the seed profile's lengths and priorities, ``--base-rate`` events/s for
``--base-min`` minutes, ``--factor`` times that for ``--step-min``, the base rate again for
``--after-min``. Each run reports, per phase and priority, the share of events answered by
the model within their SLA; the GPU-seconds (executors registered, integrated over the
replay: each executor holds one GPU); every scale action with its time and phase; and the
time from the step to added capacity serving (the first answer of a sidecar that was not
serving before the step). ``load_step.json`` holds the three runs side by side.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import logging
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.generate import GeneratedRequest, events_for_spark, generate
from sts_capacity.profiles import load_profile
from sidecar import percentiles
from sidecar.contract import PRIORITY_NAMES
from spark_ext.kinds import writer_choices

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
SIDECAR_CONFIG = REPO / "conf" / "sidecar-gpu-sim.yaml"
#: Run name -> (executors the cluster starts with, scaling on).
RUNS: dict[str, tuple[int, bool]] = {"elastic": (4, True), "static-1": (1, False),
                                     "static-4": (4, False)}
#: Deadlines per priority (ms): the demo's. The seed's 3 s for ``high`` would measure
#: the Spark hops on 2 shared cores (~1.5 s), not the capacity this benchmark is about.
SLA_MS = {"high": 8000, "normal": 15000, "low": 30000}


@dataclass(frozen=True)
class Schedule:
    """The load step: base rate, ``factor`` times it, the base rate again."""

    base_rate: float
    factor: float
    base_s: float
    step_s: float
    after_s: float

    def phases(self) -> list[tuple[str, float, float, float]]:
        """``(name, start_s, end_s, rate)`` of each phase.

        Example:
            >>> Schedule(10, 4, 600, 180, 300).phases()[1]
            ('step', 600, 780, 40)
        """
        step_end = self.base_s + self.step_s
        return [("base", 0, self.base_s, self.base_rate),
                ("step", self.base_s, step_end, self.base_rate * self.factor),
                ("after", step_end, step_end + self.after_s, self.base_rate)]

    @property
    def duration_s(self) -> float:
        return self.base_s + self.step_s + self.after_s

    def phase_of(self, t: float) -> str:
        """The phase at ``t`` seconds after the start."""
        return next((name for name, start, end, _ in self.phases() if start <= t < end),
                    "after")


def step_requests(schedule: Schedule, seed: int = 0) -> list[GeneratedRequest]:
    """The seed profile's requests over the schedule, numbered in arrival order.

    Example:
        >>> reqs = step_requests(Schedule(2, 4, 10, 5, 5))
        >>> [r.index for r in reqs[:3]], len(reqs) > 40
        ([0, 1, 2], True)
    """
    profile = dataclasses.replace(load_profile("seed-200qps"), sla_ms=dict(SLA_MS))
    out: list[GeneratedRequest] = []
    for i, (_, start, end, rate) in enumerate(schedule.phases()):
        for r in generate(profile.with_rate(rate), duration_s=end - start, seed=seed + i):
            out.append(dataclasses.replace(r, arrival_s=start + r.arrival_s))
    out.sort(key=lambda r: r.arrival_s)
    return [dataclasses.replace(r, index=i) for i, r in enumerate(out)]


#: Loggers whose lines the run keeps: the controller's actions, the new executors' warm-up.
SCALE_LOGGERS = ("spark_ext.pipeline.scaling", "spark_ext.pipeline.executor_warmup")


class _ScaleLog(logging.Handler):
    """Keeps the scaling controller's actions (its ``Scaling up/down`` lines) and the
    warm-ups of new executors (``Warm-up: ...``)."""

    def __init__(self, start: float) -> None:
        super().__init__(logging.INFO)
        self.start = start
        self.actions: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(("Scaling ", "Warm-up")):
            self.actions.append({"t_s": round(record.created - self.start, 1),
                                 "message": message})


def _pipeline_config(work: Path, args: argparse.Namespace, elastic: bool):
    from spark_ext.config import PipelineConfig

    run = work / "run"
    from sts_harness.support_app import support_sections

    return PipelineConfig.from_dict(support_sections({
        "source": {"path": str(work / "events"), "schema": _event_schema(),
                   "options": {"maxFilesPerTrigger": "1000"}},
        "tagging": {"sla_ms": dict(SLA_MS), "max_tokens": args.max_tokens,
                    "max_tokens_column": "max_tokens"},
        "sidecar": {"endpoint": "unix:///nonexistent/sts-no-gpu.sock",
                    "gpu_endpoint": f"unix://{run}/sts-gpu{{gpu}}.sock", "launch": "lazy",
                    "launch_args": ["--engine", "simulated", "--config", str(SIDECAR_CONFIG)],
                    "run_dir": str(run), "results_dir": str(work / "results"),
                    "start_timeout_s": 60.0, "timeout_s": 30.0},
        "answers": {"grace_ms": 1000},
        "scaling": {"enabled": elastic, "min_gpus": 1, "max_gpus": 4,
                    "up_window_s": args.up_window, "down_window_s": args.down_window,
                    "cooldown_s": args.cooldown, "warm_up": not args.no_warm_up},
        "output": {"out_dir": str(work / "tables"), "checkpoint_dir": str(work / "checkpoints"),
                   "triggers": {"submit": 0.5, "answers": 0.5}, "writer": args.writer,
                   "metrics_port": 0},
    }))


def _event_schema() -> str:
    from sts_harness.replay import EVENT_SCHEMA

    return EVENT_SCHEMA


def _desired(pipeline, measure: str = "desired_gpus_exact") -> float | None:
    """The pipeline's scale signal at its last check (``sts_spark_scale``)."""
    if pipeline.metrics is None:
        return None
    return pipeline.metrics.registry.get_sample_value("sts_spark_scale", {"measure": measure})


#: The file that marks a run's work folder as this benchmark's (emptied at the next run).
_MARKER = ".sts-load-step"


def run_one(name: str, args: argparse.Namespace, work: Path) -> dict:
    """One run in this process: the cluster, the pipeline, the replay, the figures."""
    from benchmarks.schemes import warm_up_scheme
    from sts_harness.warm_up import is_warm_up
    from spark_ext.pipeline import sts_pipeline
    from spark_ext.pipeline.scaling import ScaleDecision, SparkExecutors
    from spark_ext.submit.sidecar_launcher import stop_sidecars
    from sts_harness.gpu_cluster import executors, gpu_cluster_session, until_executors
    from sts_harness.replay import EventReplayer

    workers, elastic = RUNS[name]
    schedule = Schedule(args.base_rate, args.factor, args.base_min * 60, args.step_min * 60,
                        args.after_min * 60)
    if work.exists():  # a folder of an earlier run (its marker), never anything else
        if not (work / _MARKER).exists():
            raise SystemExit(f"{work} exists and was not made by a load-step run: "
                             "choose another --work-dir")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / _MARKER).touch()
    sts_pipeline.SCALE_CHECK_INTERVAL_S = args.check_interval
    conf = spark_conf(args.spark_conf)
    if not args.no_executor_ready:  # new executors held until their sidecar serves
        from spark_ext.submit.executor_ready import with_plugin

        conf = with_plugin(conf)
    spark = gpu_cluster_session(work, workers=workers, cores=2, memory_mb=1024,
                                task_gpu_amount=0.5, app_name=f"sts-load-step-{name}",
                                conf=conf)
    pipeline = None
    try:
        until_executors(spark, workers, timeout_s=180)
        if elastic:  # the controller starts at min_gpus
            SparkExecutors(spark).apply(ScaleDecision("down", 1, "start at min_gpus"), workers)
            until_executors(spark, 1, timeout_s=180)
        config = _pipeline_config(work, args, elastic)
        pipeline = sts_pipeline.StsPipeline(spark, config)
        pipeline.start()
        warm_up_scheme(work / "events", lambda: pipeline.store.stats.answers_written)
        warm = pipeline.store.stats.answers_written
        requests = step_requests(schedule, seed=args.seed)
        replayer = EventReplayer(work / "events", [r.arrival_s for r in requests],
                                 lambda start_ms: events_for_spark(requests, start_ms))
        scale_log = _ScaleLog(time.time())
        for logger_name in SCALE_LOGGERS:
            logging.getLogger(logger_name).addHandler(scale_log)
        samples: list[dict] = []
        replayer.start()
        started, next_print = time.monotonic(), 0.0
        scale_log.start = time.time()
        while (t := time.monotonic() - started) < schedule.duration_s:
            pipeline.check()
            samples.append({"t_s": round(t, 1), "executors": executors(spark),
                            "desired_gpus_exact": _desired(pipeline),
                            "offered": replayer.offered,
                            "answered": pipeline.store.stats.answers_written - warm})
            if t >= next_print:
                next_print += 30
                s = samples[-1]
                print(f"  [{name} {t:5.0f}s {schedule.phase_of(t)}] executors "
                      f"{s['executors']}, desired {s['desired_gpus_exact']}, offered {s['offered']}, "
                      f"answered {s['answered']}", flush=True)
            time.sleep(1.0)
        replayer.join()
        drain_end = time.monotonic() + (max(SLA_MS.values()) + 1000) / 1000 + 15
        while (pipeline.store.stats.answers_written - warm < replayer.offered
               and time.monotonic() < drain_end):
            pipeline.check()
            time.sleep(0.5)
        rows = [r for r in pipeline.store.read("answers", ANSWER_COLUMNS).to_pylist()
                if not is_warm_up(r)]
        return summarize(name, schedule, replayer.start_ms, replayer.offered, rows,
                         serving_since(work / "run"), samples, scale_log.actions) \
            | {"spark_conf": spark_conf(args.spark_conf),
               "executor_ready": not args.no_executor_ready}
    finally:
        if pipeline is not None:
            pipeline.stop()
        spark.stop()
        stop_sidecars(work / "run")


#: The answers' columns a run's figures come from.
ANSWER_COLUMNS = ["event_id", "priority", "answer_source", "deadline_met", "enqueue_ts",
                  "received_ts", "answered_ts"]
#: A sidecar's log line once it serves (``sidecar.server``), with its time.
_SERVING = re.compile(r"^(\S+ \S+) INFO sidecar\.server: Sidecar \S+ serving ", re.M)


def serving_since(run_dir: Path) -> list[int]:
    """Epoch ms of every time a sidecar in ``run_dir`` began to serve (their logs)."""
    out = []
    for log in run_dir.glob("sts-gpu*.log"):
        for stamp in _SERVING.findall(log.read_text(errors="replace")):
            at = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
            out.append(int(at.replace(tzinfo=datetime.timezone.utc).timestamp() * 1000))
    return sorted(out)


def summarize(name: str, schedule: Schedule, start_ms: int, offered: int, rows: list[dict],
              serving_ms: list[int], samples: list[dict], actions: list[dict]) -> dict:
    """One run's figures (see the module docstring); ``serving_ms``: when each sidecar
    began to serve (:func:`serving_since`)."""
    step_start_ms = start_ms + schedule.base_s * 1000
    added = [ts for ts in serving_ms if ts > step_start_ms]
    window_end_ms = added[0] if added else step_start_ms
    by: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    outside = []
    for r in rows:
        t = (r["enqueue_ts"] - start_ms) / 1000
        by[(schedule.phase_of(t), r["priority"])].append(r)
        if r["priority"] == "high" and not step_start_ms <= r["enqueue_ts"] < window_end_ms:
            outside.append(r)

    def share(rs: list[dict]) -> float | None:
        good = sum(r["answer_source"] == "llm" and bool(r["deadline_met"]) for r in rs)
        return round(good / len(rs), 4) if rs else None

    def to_sidecar(rs: list[dict]) -> dict:
        """Event -> sidecar received (ms): P50 and the most, per phase."""
        waits = [r["received_ts"] - r["enqueue_ts"] for r in rs if r["received_ts"]]
        return {"p50": percentiles(waits)["p50"], "max": max(waits, default=None)}

    # Executors registered, integrated over the replay (each holds one GPU).
    ends = [s["t_s"] for s in samples[1:]] + [schedule.duration_s]
    gpu_s = round(sum(s["executors"] * (end - s["t_s"]) for s, end in zip(samples, ends)))
    for a in actions:
        a["phase"] = schedule.phase_of(a["t_s"])
    return {
        "run": name, "schedule": dataclasses.asdict(schedule), "start_ms": start_ms,
        "offered": offered, "answered": len(rows),
        "distinct_events": len({r["event_id"] for r in rows}),
        "answers_by_source": dict(collections.Counter(r["answer_source"] for r in rows)),
        "llm_within_sla": {f"{phase}/{p}": share(by[(phase, p)])
                           for phase, *_ in schedule.phases() for p in PRIORITY_NAMES},
        "llm_within_sla_all": {p: share([r for r in rows if r["priority"] == p])
                               for p in PRIORITY_NAMES},
        "high_outside_first_scale_up": share(outside),
        "step_to_added_capacity_s": round((added[0] - step_start_ms) / 1000, 1)
        if added else None,
        "event_to_sidecar_ms": {phase: to_sidecar([r for (ph, _), rs in by.items()
                                                   if ph == phase for r in rs])
                                for phase, *_ in schedule.phases()},
        "gpu_seconds": gpu_s, "scale_actions": actions,
        "actions_in_base_phase": sum(a["phase"] == "base" for a in actions),
        "samples": samples,
    }


def summarize_again(name: str, work: Path, saved: dict) -> dict:
    """A run's figures again from what it left (its answers table, its sidecars' logs and
    its saved samples), e.g. after a change to :func:`summarize`."""
    from deltalake import DeltaTable

    rows = [r for r in DeltaTable(str(work / "tables" / "answers"))
            .to_pyarrow_table(columns=ANSWER_COLUMNS).to_pylist()
            if r["event_id"].startswith("gen")]
    start_ms = int(rows[0]["event_id"][3:].split("-")[0])  # events_for_spark's id prefix
    samples = [{("desired_gpus_exact" if k == "desired_gpus" else k): v for k, v in s.items()}
               for s in saved["samples"]]
    return summarize(name, Schedule(**saved["schedule"]), start_ms, saved["offered"], rows,
                     serving_since(work / "run"), samples,
                     [{"t_s": a["t_s"], "message": a["message"]} for a in saved["scale_actions"]])


def _table(runs: list[dict]) -> str:
    """The runs side by side (Markdown)."""
    static1 = next((r["gpu_seconds"] for r in runs if r["run"] == "static-1"), None)
    lines = ["| run | high LLM within SLA: all / outside the first scale-up | normal | low "
             "| GPU-seconds (vs static-1) | scale actions (s after start) "
             "| step -> added capacity serving | event -> sidecar in the step, P50 / max |",
             "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in runs:
        a = r["llm_within_sla_all"]
        ratio = f" ({r['gpu_seconds'] / static1:.2f}x)" if static1 else ""
        acts = "; ".join(f"{x['t_s']:.0f} {x['message'].split(' (')[0].removeprefix('Scaling ')}"
                         for x in r["scale_actions"]) or "none"
        step = r["event_to_sidecar_ms"]["step"]
        lines.append(f"| {r['run']} | {a['high']} / {r['high_outside_first_scale_up']} | "
                     f"{a['normal']} | {a['low']} | {r['gpu_seconds']}{ratio} | {acts} | "
                     f"{r['step_to_added_capacity_s']} s | {step['p50']:.0f} / {step['max']} ms |")
    return "\n".join(lines)


def spark_conf(pairs: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings as Spark settings.

    Example:
        >>> spark_conf(["spark.speculation=true", "spark.speculation.multiplier=2"])
        {'spark.speculation': 'true', 'spark.speculation.multiplier': '2'}

    Raises:
        SystemExit: a pair without ``=``.
    """
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--spark-conf wants KEY=VALUE, not {pair!r}")
        conf[key.strip()] = value.strip()
    return conf


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.load_step", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="elastic,static-1,static-4",
                   help=f"comma-separated, of {sorted(RUNS)}")
    p.add_argument("--base-rate", type=float, default=9.0,
                   help="events/s (default 9: ~0.8 of one simulated GPU at the signal's "
                        "target utilisation)")
    p.add_argument("--factor", type=float, default=4.0)
    p.add_argument("--base-min", type=float, default=10.0)
    p.add_argument("--step-min", type=float, default=3.0)
    p.add_argument("--after-min", type=float, default=6.0)
    p.add_argument("--up-window", type=float, default=60.0, help="scaling.up_window_s")
    p.add_argument("--down-window", type=float, default=180.0, help="scaling.down_window_s")
    p.add_argument("--cooldown", type=float, default=120.0, help="scaling.cooldown_s")
    p.add_argument("--no-warm-up", action="store_true",
                   help="scaling.warm_up: false (new executors warmed by the stream's tasks)")
    p.add_argument("--no-executor-ready", action="store_true",
                   help="without the executor-ready plugin (spark_ext.submit.executor_ready): "
                        "a new executor takes the stream's tasks before its sidecar serves")
    p.add_argument("--check-interval", type=float, default=30.0,
                   help="seconds between scale checks (the pipeline's 30 s)")
    p.add_argument("--max-tokens", type=int, default=300,
                   help="tagging.max_tokens, the cap on each request's sampled length "
                        "(default 300: the seed profile's 1 %% of very long outputs would "
                        "not finish within 8 s even alone on an idle GPU)")
    p.add_argument("--writer", default="deltalake", choices=writer_choices(),
                   help="output.writer (default deltalake: the driver writes, which leaves "
                        "the two cores to the executors)")
    p.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for every run's session (repeatable), e.g. "
                        "spark.speculation=true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/load-step"))
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/sts-load-step"),
                   help="the runs' tables, checkpoints and logs (one folder per run, "
                        "emptied when the next run starts; a folder this benchmark did "
                        "not make is refused, never emptied)")
    p.add_argument("--summarize-again", action="store_true",
                   help="rebuild each run's figures from --work-dir and --out, run nothing")
    p.add_argument("--one", help=argparse.SUPPRESS)  # a child process: this run only
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    out = args.out.resolve()
    if args.one:
        for logger_name in SCALE_LOGGERS:
            logging.getLogger(logger_name).setLevel(logging.INFO)
        result = run_one(args.one, args, args.work_dir.resolve() / args.one)
        (out / f"{args.one}.json").write_text(json.dumps(result, indent=1))
        return 0
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    if unknown := [n for n in names if n not in RUNS]:
        print(f"unknown run(s) {unknown}; choose from {sorted(RUNS)}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    child_args = [a for a in (argv if argv is not None else sys.argv[1:])]
    runs = []
    for name in names:
        if args.summarize_again:
            saved = json.loads((out / f"{name}.json").read_text())
            runs.append(summarize_again(name, args.work_dir.resolve() / name, saved))
            (out / f"{name}.json").write_text(json.dumps(runs[-1], indent=1))
            continue
        print(f"load step: {name}", flush=True)
        rc = subprocess.call([sys.executable, "-m", "benchmarks.load_step", *child_args,
                              "--out", str(out), "--one", name], cwd=REPO)
        if rc != 0:
            print(f"load step: run {name} failed (exit {rc})", file=sys.stderr)
            return 1
        runs.append(json.loads((out / f"{name}.json").read_text()))
    (out / "load_step.json").write_text(json.dumps(
        {"runs": [{k: v for k, v in r.items() if k != "samples"} for r in runs]}, indent=1))
    print(_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
