"""``sts demo``: the whole system on one machine, end to end.

Prepares the model, starts a sidecar (real vLLM, SmolLM2) as a child process,
starts Spark in local mode, replays the shipped support tickets into a landing
directory at ``rate`` events/s for ``duration`` seconds, runs the pipeline, and
prints a summary. Both processes are shut down cleanly, also on Ctrl-C.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime
import itertools
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TypeVar

from sidecar import percentiles
from sidecar.contract import PRIORITY_NAMES
from spark_ext.kinds import CHANNEL_SIDES
from sts_harness.demo_sizing import DEFAULT_FACTOR, DemoSizing, LivePace, sizing_from_stats
from sts_harness.hops import format_hops, hop_latencies
from sts_harness.log_file import log_to_file
from sts_harness.readable import add_readable_times, readable_by_deadline
from sts_harness.replay import EventReplayer, FolderSink, KafkaTopicSink
from sts_harness.warm_up import (RECORD_TABLES_WARMED, is_warm_up, send_warm_up, wait_answered,
                                  wait_first_writes, warm_up_events)


T = TypeVar("T")


class DemoFailedError(RuntimeError):
    """A part of the demo (the sidecar, a query) died while it ran."""


#: Marks a folder as written by ``sts demo``: only such a folder is ever replaced.
MARKER = ".sts-demo"
#: What the demo writes inside ``--out`` (all that ``--overwrite`` removes).
_OUTPUTS = ("events", "events-read", "results", "acks", "tables", "checkpoints", "plots",
            "summary.json", "sidecar.log", "demo.log", "l1l2", "kafka", "sidecar-token")

logger = logging.getLogger(__name__)


def default_out(source: str) -> str:
    """The demo's output folder when ``--out`` is not given: one per route, so the
    README's commands run one after the other without ``--overwrite``.

    Example:
        >>> default_out("files"), default_out("kafka")
        ('./sts-demo', './sts-demo-kafka')
    """
    return "./sts-demo" if source == "files" else f"./sts-demo-{source}"
#: Events/s of a demo that cannot size itself by the engine (the simulated engine, no
#: calibration) and was given no ``--rate``.
UNSIZED_RATE = 3.0
#: The demo's events topic (``--source kafka``).
DEMO_TOPIC = "sts-demo-events"
#: Tickets the demo sends through the whole pipeline, and waits for, before its replay.
DEMO_WARM_UP_EVENTS = 6


@dataclass
class DemoOptions:
    """Knobs of ``sts demo``."""

    rate: float | None = None
    """Events per second replayed; ``None``: :attr:`overload` x the engine's capacity as
    its warm-up measured it, with :attr:`max_tokens` cut to what the engine can answer
    in 35 % of ``high``'s SLA (:mod:`sts_harness.demo_sizing`)."""

    overload: float = DEFAULT_FACTOR
    """Without :attr:`rate`: offered model requests over the engine's measured capacity."""

    duration: float = 40.0
    """Seconds of replay."""

    out: str = "./sts-demo"
    """Root of everything the demo writes (tables under ``out/tables``)."""

    engine: str = "vllm"
    """Sidecar engine (``vllm``, or ``simulated`` for a quick look)."""

    max_tokens: int = 48
    """``max_tokens`` of each request (at most that, when the demo sizes itself)."""

    sla_ms: tuple[int, int, int] = (8000, 15000, 30000)
    """SLA of high, normal and low requests."""

    drain_timeout_s: float = 90.0
    """After the replay, how long to wait for the last answers."""

    overwrite: bool = False
    """Replace the output of an earlier demo in ``out`` (never a folder the demo did not make)."""

    l1l2: bool = True
    """Run L1 routing, L2 retrieval and the feature lookup (router, knowledge base and
    feature table built into ``out/l1l2``, see :mod:`sts_harness.l1l2_demo`)."""

    rollout: str = "full"
    """The pipeline's ``rollout.mode`` (``full``, ``canary``, ``shadow``, ``offline``)."""

    canary_share: float = 0.1
    """``rollout.canary_share``: the model's share of events in ``canary`` mode."""

    source: str = "files"
    """Where events and results travel: ``files`` (a landing folder, the sidecar's
    Parquet results folder) or ``kafka`` (events on a topic, results on the
    ``llm.result.{priority}`` topics)."""

    bootstrap_servers: str | None = None
    """With ``source = kafka``: the cluster to use (``None``: a local broker the demo
    starts in ``out/kafka`` and stops at the end)."""

    writer: str | None = None
    """The pipeline's ``output.writer`` (``deltalake``, ``spark`` or ``auto``). ``None``:
    ``spark`` on Spark Connect (the only writer there), else ``deltalake``: the demo gives
    Spark one core beside the model, where a Delta on Spark commit costs a second or
    more per table and micro-batch."""

    def resolved_writer(self) -> str:
        """:attr:`writer`, or the default for the session this process would start."""
        if self.writer:
            return self.writer
        return "spark" if os.environ.get("SPARK_REMOTE") else "deltalake"

    warm_up: int = DEMO_WARM_UP_EVENTS
    """Tickets sent through the whole pipeline before the replay, each answered before it
    begins (:mod:`sts_harness.warm_up`: the first events would pay for the pipeline's cold
    start); their rows are in the tables (event ids ``warmup-...``) and in no figure.
    0: none."""

    on_start: Callable[[object], None] | None = None
    """Called with the pipeline once it started (the soak samples it)."""

    owns_process: bool = False
    """The demo owns this process (``sts demo``): a Spark it starts with the real engine on
    the CPU runs at :data:`SPARK_NICENESS` for the process's life (PySpark keeps its JVM
    until the process exits). A caller that goes on using Spark (a test, a notebook)
    leaves it ``False``."""

    def __post_init__(self) -> None:
        if self.source not in CHANNEL_SIDES:  # the route: a result channel's name
            raise ValueError(f"--source {self.source!r} must be one of "
                             f"{', '.join(CHANNEL_SIDES.names)}")
        if self.bootstrap_servers and self.source != "kafka":
            raise ValueError("--bootstrap-servers needs --source kafka")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"{self.rate=} must be > 0 events/s")
        if not self.overload > 0:
            raise ValueError(f"{self.overload=} must be > 0")
        if not self.duration > 0:
            raise ValueError(f"{self.duration=} must be > 0 seconds")
        if self.max_tokens < 1:
            raise ValueError(f"{self.max_tokens=} must be >= 1")
        if self.warm_up < 0:
            raise ValueError(f"{self.warm_up=} must be >= 0")
        from spark_ext.config import RolloutConfig

        RolloutConfig(mode=self.rollout, canary_share=self.canary_share)  # checks both


def load_samples() -> list[dict]:
    """The shipped support tickets (300 rows: ticket_id, text, priority)."""
    text = resources.files("sts_harness").joinpath("samples/support_tickets.jsonl").read_text(
        encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def sample_replayer(sink: Path | FolderSink | KafkaTopicSink, rate: float, duration: float,
                    samples: list[dict], *, unique_ids: bool = False,
                    pace: Callable[[], float] | None = None) -> EventReplayer:
    """Replay ``samples`` (cycled) into ``sink`` (a landing folder or a Kafka topic) at
    ``rate`` events/s for ``duration`` s (with ``pace``, at that share of ``rate``: see
    :class:`~sts_harness.demo_sizing.LivePace`).

    Event ids are ``<ticket>-<n>``; with ``unique_ids`` the run's start (epoch ms) is part
    of them too, so a second run is new events, not replays of the first (request ids
    are derived from the event id)."""
    n = max(1, int(rate * duration))
    arrivals = [i / rate for i in range(n)]

    def make_events(start_ms: int) -> list[dict]:
        cycle = itertools.cycle(samples)
        run = f"{start_ms}-" if unique_ids else ""
        return [{"event_id": f"{s['ticket_id']}-{run}{i:06d}", "text": s["text"],
                 "priority": s["priority"], "event_ts": start_ms + round(at * 1000),
                 "customer_id": s.get("customer_id")}
                for i, (at, s) in enumerate(zip(arrivals, cycle))]

    return EventReplayer(sink, arrivals, make_events, pace=pace,
                         until_s=duration if pace is not None else None)


def spark_cpus(engine: str) -> set[int] | None:
    """The CPUs the demo's Spark runs on: all but CPU 0 when the real engine runs on the
    CPU of a machine with more than one (``None``: leave the affinity as it is)."""
    if engine != "vllm" or not hasattr(os, "sched_getaffinity"):
        return None
    mine = os.sched_getaffinity(0)
    rest = mine - {0}
    if 0 not in mine or not rest:
        return None
    try:
        import torch

        if torch.cuda.is_available():
            return None  # decoding runs on the GPU: nothing to keep apart
    except ImportError:
        pass
    return rest


def prepare_out(out: Path, *, overwrite: bool, command: str = "sts demo",
                marker: str = MARKER, outputs: tuple[str, ...] = _OUTPUTS) -> None:
    """Make ``out`` ready for a demo run without ever deleting what the demo did not write
    (``command``, ``marker`` and ``outputs``: the same for another command's folder).

    An empty or missing folder is used as is; a folder an earlier demo wrote (it holds
    :data:`MARKER`) is cleared of the demo's outputs when ``overwrite`` is set.

    Raises:
        FileExistsError: ``out`` holds files and no marker, or an earlier demo's output
            without ``overwrite``.
        NotADirectoryError: ``out`` is a file.
    """
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / marker).exists():
            raise FileExistsError(f"--out {out} is not empty and was not written by {command}; "
                                  "choose an empty or new folder")
        if not overwrite:
            raise FileExistsError(f"--out {out} holds an earlier {command.split()[-1]}'s "
                                  "output; pass --overwrite to replace it")
        import shutil

        for name in outputs:
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / marker).write_text(f"written by {command}\n", encoding="utf-8")


#: Answer sources, in the order the summary shows them.
SOURCES = ("llm", "fallback", "backfill", "rule", "kb")

#: Sources of events that L1/L2 answered without the model.
_ANSWERED_BY_L1L2 = ("rule", "kb")


def summarize(answers: list[dict], *, events: int, wall_s: float, stats: dict,
              fast_path: dict | None = None) -> dict:
    """The demo's summary figures from the answers table rows; each figure has one meaning.

    ``llm_within_sla``: per priority, the share of events answered by the model by their
    deadline (decided by it: ``deadline_met``), and (``to_llm``, ``share_of_to_llm``)
    that share among the events L1/L2 left to the model (not answered by a ``rule`` or
    from the knowledge base): with L1/L2 on, the first share is capped by routing, the
    second is the scheduler's; where the rows carry ``readable_ts``
    (:mod:`sts_harness.readable`), ``llm_readable_on_time``: those whose row could be
    read by the deadline.
    ``fallbacks_by_reason``: why the events still answered by the fallback got
    it (a fallback that a late model answer replaced counts as ``backfill``, not here).
    ``retrieval``: L1/L2's routes and hit rates (:meth:`FastPathStats.summary`), with
    ``without_llm``, the share of answers that needed no LLM (``rule`` + ``kb``), and
    ``with_kb_ids``, per source the answers that name the articles they used.
    """
    by_source = collections.Counter(a["answer_source"] for a in answers)
    fallbacks = collections.Counter(a.get("reason") or a["status"] for a in answers
                                    if a["answer_source"] == "fallback")
    latency: dict[str, dict[str, float | None]] = {}
    readable_known = any(a.get("readable_ts") is not None for a in answers)
    llm_within_sla: dict[str, dict[str, float | int | None]] = {}
    for p in PRIORITY_NAMES:
        mine = [a for a in answers if a["priority"] == p]
        lat = [a["latency_ms"] for a in mine
               if a["answer_source"] != "backfill" and a["latency_ms"] is not None]
        latency[p] = percentiles(lat, (50, 95, 99), digits=None) | {"n": len(lat)}
        on_time = sum(1 for a in mine if a["answer_source"] == "llm" and a["deadline_met"])
        to_llm = sum(1 for a in mine if a["answer_source"] not in _ANSWERED_BY_L1L2)
        llm_within_sla[p] = {"events": len(mine), "llm_on_time": on_time,
                             "share": on_time / len(mine) if mine else None,
                             "to_llm": to_llm,
                             "share_of_to_llm": on_time / to_llm if to_llm else None}
        if readable_known:
            llm_within_sla[p]["llm_readable_on_time"] = sum(
                1 for a in mine if a["answer_source"] == "llm" and readable_by_deadline(a))
    hit_rate = stats.get("prefixCacheHitRate")
    retrieval = None
    if fast_path is not None:
        with_ids = collections.Counter(a["answer_source"] for a in answers
                                       if a.get("kb_ids") is not None)
        without_llm = by_source.get("rule", 0) + by_source.get("kb", 0)
        retrieval = fast_path | {
            "without_llm": round(without_llm / len(answers), 4) if answers else None,
            "with_kb_ids": {s: f"{with_ids.get(s, 0)}/{by_source[s]}"
                            for s in SOURCES if by_source.get(s)}}
    return {
        "events": events,
        "answers": len(answers),
        "answers_by_source": {s: by_source.get(s, 0) for s in SOURCES}
        | {s: n for s, n in by_source.items() if s not in SOURCES},
        "retrieval": retrieval,
        "fallbacks_by_reason": dict(fallbacks),
        "llm_within_sla": llm_within_sla,
        "latency_ms_by_priority": latency,
        "hops_ms": hop_latencies(answers),
        "llm_answers_per_s": by_source.get("llm", 0) / wall_s if wall_s else None,
        "engine": stats.get("engine"),
        "engine_output_tokens_per_s": stats.get("outputTokensPerS"),
        # absent (None) when the engine reports no prefix-cache lookups at all
        "prefix_cache_hit_rate": hit_rate if stats.get("promptTokensTotal") else None,
    }


def batch_durations(queries: list, since_s: float | None = None
                    ) -> dict[str, dict[str, float | None]]:
    """Per query: P50/P99 (ms) and count of its recent micro-batches that had input
    (Spark keeps the last 100 progress updates of a query), only those that began at or
    after ``since_s`` (epoch seconds; the replay's start) when given: a query's first
    batch, run while the pipeline starts (Python workers, models, plans), is not one
    the events waited for.

    Example:
        >>> from types import SimpleNamespace as P
        >>> q = P(name="sts-answers", recentProgress=[
        ...     P(timestamp="2026-12-04T18:00:00.000Z", numInputRows=3,
        ...       durationMs={"triggerExecution": 47000}),
        ...     P(timestamp="2026-12-04T18:01:00.500Z", numInputRows=5,
        ...       durationMs={"triggerExecution": 900})])
        >>> batch_durations([q])["sts-answers"]["n"]
        2
        >>> batch_durations([q], since_s=1796407260.0)["sts-answers"]
        {'p50': 900.0, 'p99': 900.0, 'n': 1}
    """
    out = {}
    for q in queries:
        ms = [p.durationMs.get("triggerExecution") for p in q.recentProgress
              if p.numInputRows and p.durationMs.get("triggerExecution") is not None
              and (since_s is None or _epoch_s(p.timestamp) >= since_s)]
        out[q.name] = percentiles(ms, (50, 99), digits=0) | {"n": len(ms)}
    return out


def _epoch_s(iso: str) -> float:
    """A progress update's ``timestamp`` (ISO 8601, UTC) in epoch seconds."""
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


#: Where a failed step's traceback goes: the demo's log file only, never the console.
_TRACES = logging.getLogger("sts_harness.demo.traces")
_TRACES.propagate = False


def log_demo_to_file(stack: contextlib.ExitStack, log: Path) -> None:
    """Python's log (INFO and up) and the tracebacks of failed steps into ``log`` until
    ``stack`` closes; the console keeps warnings and the demo's own lines
    (:func:`sts_harness.log_file.log_to_file`)."""
    log_to_file(stack, log, _TRACES)


@contextlib.contextmanager
def demo_step(what: str, log: Path, *, expect: str = "", every_s: float = 15.0):
    """One start-up step of the demo: a line when it begins (with what to expect), a line
    every ``every_s`` while it runs, one when it is done; if it fails, the traceback goes
    to ``log`` and :class:`DemoFailedError` says in one line which step, why, and where
    the log is."""
    import threading

    print(f"{what} ...{f' ({expect})' if expect else ''}", flush=True)
    started = time.monotonic()
    done = threading.Event()

    def tell() -> None:
        while not done.wait(every_s):
            print(f"  ... {what}: {time.monotonic() - started:.0f} s", flush=True)

    threading.Thread(target=tell, name="sts-demo-progress", daemon=True).start()
    try:
        yield
    except (KeyboardInterrupt, DemoFailedError):
        raise
    except Exception as e:
        from spark_ext.pipeline.sts_pipeline import one_line_reason

        _TRACES.error("sts demo: %s failed.", what, exc_info=True)
        from sidecar import SidecarError
        from spark_ext.exceptions import StsSparkError
        from sts_harness.kafka_broker import KafkaBrokerError

        # our own errors say what failed; anything else gets the step's name
        text = (str(e).splitlines()[0] if isinstance(e, (StsSparkError, SidecarError,
                                                           KafkaBrokerError)) and str(e)
                else f"{what} failed: {one_line_reason(e)}")
        raise DemoFailedError(f"{text} (log: {log})") from e
    finally:
        done.set()
    print(f"{what}: done in {time.monotonic() - started:.0f} s", flush=True)


def run_demo(opts: DemoOptions) -> dict:
    """Run the demo and return its summary (also written to ``out/summary.json``).

    Raises:
        DemoFailedError: a start-up step failed (one line: the step, why, the log).
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from sidecar import prepare_default_model
    from sts_harness.process import start_local_sidecar

    out = Path(opts.out).expanduser().resolve()
    prepare_out(out, overwrite=opts.overwrite)
    stack = contextlib.ExitStack()  # closed in reverse: pipeline, Spark, sidecar, broker
    log = out / "demo.log"
    log_demo_to_file(stack, log)
    _announce(opts, out, log)
    try:
        if opts.engine == "vllm":
            with demo_step("Preparing the model", log,
                           expect="the first run converts the packaged SmolLM2, ~20 s"):
                print(f"Model: {prepare_default_model()}", flush=True)
        bootstrap = None
        if opts.source == "kafka":
            with demo_step("Starting Kafka", log, expect="a local broker, ~10 s"):
                bootstrap = _kafka_cluster(stack, opts, out)
        with demo_step("Starting the sidecar", log,
                       expect=("vLLM on CPU: engine start and warm-up, 30-90 s"
                               if opts.engine == "vllm" else "a few seconds")):
            sidecar, token_file = start_local_sidecar(
                stack, out, opts.engine, "demo-sidecar", demo_sidecar_args(opts, bootstrap))
        print(f"Sidecar serving on {sidecar.target}", flush=True)
        opts, sizing = sized(opts, sidecar.client)

        from spark_ext import StsPipeline

        spark = _demo_session(stack, opts, log)
        with demo_step("Building the pipeline", log,
                       expect="L1 router, L2 knowledge base, feature table" if opts.l1l2
                       else ""):
            config = demo_config(opts, out, sidecar.target, token_file, bootstrap=bootstrap)
            pipeline = StsPipeline(spark, config)
            stack.callback(pipeline.stop)
            if bootstrap:  # the demo's own topic: made here, the pipeline reads it at start
                from spark_ext.sources.kafka import ensure_topics

                ensure_topics({"bootstrap.servers": bootstrap}, [DEMO_TOPIC])
        sink = (KafkaTopicSink(bootstrap, DEMO_TOPIC) if bootstrap
                else FolderSink(out / "events"))
        pace = LivePace(sizing, sidecar.client.stats) if sizing is not None else None
        replayer = sample_replayer(sink, opts.rate, opts.duration, load_samples(), pace=pace)
        with demo_step("Starting the queries", log,
                       expect=("MiniLM and Milvus load in the Spark workers, the plans are "
                               "compiled, 30-90 s") if opts.l1l2 else "15-30 s"):
            pipeline.start()
        if opts.on_start is not None:
            opts.on_start(pipeline)
        if opts.warm_up:
            with demo_step("Warming up the pipeline", log,
                           expect=f"{opts.warm_up} tickets through every step, answered "
                                  "before the replay"):
                warm_up_pipeline(pipeline, sink, warm_up_samples(load_samples(), opts.warm_up),
                                 timeout_s=max(opts.sla_ms[:2]) / 1000 + 60)
        start, replay_began_s = time.monotonic(), time.time()
        replayer.start()
        failure = _run_until_answered(opts, out, sidecar, pipeline, replayer, start)
        wall_s = time.monotonic() - start
        if failure is None:
            pipeline.process_all_available()
        summary = _demo_summary(opts, out, sidecar, pipeline, replayer, wall_s,
                                replay_began_s)
        summary["sizing"] = sizing_summary(sizing, summary, opts.duration, pace)
        summary["incomplete"] = failure
        (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
        return summary
    finally:
        stack.close()  # Spark is stopped only if the demo started it


def _announce(opts: DemoOptions, out: Path, log: Path) -> None:
    """The demo's first line: rate, duration, engine, route, writer, output and log."""
    rate = (f"{opts.rate:g} events/s" if opts.rate is not None
            else f"{opts.overload:g}x the engine's measured capacity" if opts.engine == "vllm"
            else f"{UNSIZED_RATE:g} events/s")
    print(f"sts demo: {rate} for {opts.duration:g} s, {opts.engine} engine, "
          f"{opts.source} route, writer {opts.resolved_writer()}; output {out}; log {log}",
          flush=True)


def _demo_session(stack: contextlib.ExitStack, opts: DemoOptions, log: Path):
    """The demo's Spark session (local, or Spark Connect with ``SPARK_REMOTE``), stopped
    with ``stack`` when the demo started it; on the vLLM engine's CPUs at a lower
    priority (:data:`SPARK_NICENESS`) when the demo owns its process."""
    from spark_ext.session import session_scope

    niceness = SPARK_NICENESS if _pin_spark_cpus(stack, opts.engine) \
        and opts.owns_process else 0
    if niceness:
        print(f"Spark at nice +{niceness}: the engine's scheduler comes first on its CPUs",
              flush=True)
    remote = os.environ.get("SPARK_REMOTE")
    with demo_step(f"Connecting to Spark Connect at {remote}" if remote
                   else "Starting Spark (local[2])", log,
                   expect="a few seconds" if remote else "10-20 s"):
        return in_thread_at_niceness(
            lambda: stack.enter_context(session_scope("sts-demo")), niceness)


def sized(opts: DemoOptions, client) -> tuple[DemoOptions, DemoSizing | None]:
    """``opts`` with the rate and ``max_tokens`` the real engine's calibration gives
    (printed), unless ``--rate`` was given. The simulated engine's speed is a setting,
    not a machine's: it gets :data:`UNSIZED_RATE`, as does an engine that measured no
    calibration (said so)."""
    if opts.rate is not None:
        return opts, None
    sizing = None
    if opts.engine == "vllm":
        sizing = sizing_from_stats(client.stats(), max_tokens=opts.max_tokens,
                                   high_sla_ms=opts.sla_ms[0], factor=opts.overload,
                                   l1l2=opts.l1l2)
    if sizing is None:
        why = ("the simulated engine" if opts.engine != "vllm"
               else "the sidecar measured no calibration (warmup.calibrate off)")
        print(f"Rate: {UNSIZED_RATE:g} events/s ({why}; --rate to change)", flush=True)
        return dataclasses.replace(opts, rate=UNSIZED_RATE), None
    print(sizing.describe(), flush=True)
    return dataclasses.replace(opts, rate=sizing.rate, max_tokens=sizing.max_tokens), sizing


def sizing_summary(sizing: DemoSizing | None, summary: dict, duration_s: float,
                   pace: LivePace | None = None) -> dict | None:
    """The sizing's figures and the overload the run got: the events left to the model
    per second of replay over the calibrated capacity, and (with ``pace``) over the
    capacity the engine delivered beside Spark (the calibrated one x the mean pace)."""
    if sizing is None:
        return None
    to_llm = sum(v.get("to_llm") or 0 for v in summary["llm_within_sla"].values())
    offered = to_llm / duration_s
    paced = pace.summary() if pace is not None else {}
    delivered = sizing.capacity_rps * (paced.get("pace_mean") or 1.0)
    return sizing.as_dict() | paced | {
        "model_requests_per_s": round(offered, 3),
        "offered_factor": round(offered / sizing.capacity_rps, 2),
        "offered_factor_delivered": round(offered / delivered, 2)}


def _kafka_cluster(stack: contextlib.ExitStack, opts: DemoOptions, out: Path) -> str:
    """The bootstrap servers of ``--bootstrap-servers``, else of a local broker started
    on ``stack`` (its log and data in ``out/kafka``), clearly labelled as local."""
    if opts.bootstrap_servers:
        print(f"Kafka cluster {opts.bootstrap_servers}: events on topic {DEMO_TOPIC}, "
              "results on llm.result.{high,normal,low}", flush=True)
        return opts.bootstrap_servers
    from sts_harness.kafka_broker import KafkaBroker

    broker = stack.enter_context(KafkaBroker(out / "kafka"))
    print(f"Kafka broker (local, started for this demo) on {broker.bootstrap_servers}; "
          f"log: {broker.log_path}", flush=True)
    return broker.bootstrap_servers


def demo_sidecar_args(opts: DemoOptions, bootstrap: str | None) -> list[str]:
    """The demo's flags for its sidecar, beyond those of
    :func:`~sts_harness.process.start_local_sidecar`."""
    # whole 32-token KV blocks are what prefix caching shares (vLLM's CPU default of 128
    # shares none of a short prompt)
    return ((["--engine-arg", "block_size=32"] if opts.engine == "vllm" else [])
            + ["--set", f"scheduler.delivery_ms={DEMO_DELIVERY_MS}", "--set",
               f"scheduler.load_shedding.under_pressure={json.dumps(DEMO_SHED_UNDER_PRESSURE)}"]
            + (kafka_results_args(bootstrap) if bootstrap else []))


def kafka_results_args(bootstrap_servers: str) -> list[str]:
    """``sts sidecar`` flags for the ``kafka`` result channel on that cluster."""
    return ["--set", "results.kind=kafka",
            "--set", f"results.kafka.bootstrap_servers={json.dumps(bootstrap_servers)}"]


def _pin_spark_cpus(stack: contextlib.ExitStack, engine: str) -> bool:
    """vLLM's CPU backend binds its decode thread to core 0; Spark (the JVM and its
    Python workers start from this thread) gets the others, as a GPU node's executors
    do not share the GPU's compute with Spark. Undone when ``stack`` closes. ``True``
    when pinned: a Spark the demo starts in its own process then also yields those CPUs
    to the engine's scheduler (:data:`SPARK_NICENESS`)."""
    if (cpus := spark_cpus(engine)) is None:
        return False
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    stack.callback(os.sched_setaffinity, 0, previous)
    print(f"Spark on CPUs {sorted(cpus)}; the engine keeps CPU 0", flush=True)
    return True


#: The nice value Spark's JVM (and the Python workers it starts) runs at when the real
#: engine shares this machine's CPUs. vLLM's CPU backend keeps a CPU besides the decode
#: thread's for its scheduler process (``reserved_cpus`` in its log), which starts every
#: decode step: on a machine of two CPUs that is the CPU Spark runs on, and a step the
#: scheduler waits for the CPU is a slower token for every sequence.
SPARK_NICENESS = 10

#: ``scheduler.delivery_ms`` of the demo's sidecar: a model's result becomes an answer
#: row 0.9-1.2 s later at the P90 here (the results folder, the answers micro-batch,
#: delta-rs's commit; Spark on one CPU), so a ``high`` answer finished in its SLA's last
#: second landed after it. The sidecar aims each request's batch to finish this early
#: (with it, `high` 94-100 % within SLA against 90-96 % without, in a busy hour).
DEMO_DELIVERY_MS = 1500

#: ``scheduler.load_shedding.under_pressure`` of the demo's sidecar: ``low`` is shed at
#: once while ``normal`` (or ``high``) loses requests to waiting. On an engine slower than
#: the traffic, ``low``'s 30 s deadline lets it wait out what ``normal``'s cannot, and
#: without this ``low`` ended with the larger share of model answers in some runs; with it
#: the order ``high`` >= ``normal`` >= ``low`` held in every run (8 of 8; 3 of 4 without).
DEMO_SHED_UNDER_PRESSURE = ["low"]


def in_thread_at_niceness(start: Callable[[], T], niceness: int) -> T:
    """``start()`` in a thread whose nice value is raised by ``niceness`` (on Linux a
    thread's own: what it launches, such as Spark's JVM, inherits it; the caller's
    thread keeps its own), returning its result or raising its exception."""
    if niceness == 0:
        return start()

    def run() -> T:
        os.nice(niceness)
        return start()

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sts-spark-start") as ex:
        return ex.submit(run).result()


def demo_config(opts: DemoOptions, out: Path, target: str, token_file: Path, *,
                bootstrap: str | None = None):
    """The demo's :class:`~spark_ext.config.PipelineConfig`: events, results, tables and
    checkpoints under ``out`` (events and results on Kafka with ``bootstrap``), the
    sidecar at ``target``, L1/L2 unless ``--no-l1l2``."""
    from spark_ext import PipelineConfig

    high, normal, low = opts.sla_ms
    fast_path: dict = {}
    # Read files move to events-read/ (Spark's cleanSource): the landing folder, which
    # Spark lists every micro-batch, stays small however long the demo runs.
    source: dict = {"path": str(out / "events"), "options": {
        "cleanSource": "archive", "sourceArchiveDir": str(out / "events-read")}}
    kafka: dict = {}
    if bootstrap:
        source = {"format": "kafka", "options": {"subscribe": DEMO_TOPIC,
                                                 "startingOffsets": "earliest"}}
        kafka = {"kafka": {"bootstrap_servers": bootstrap}}
    if opts.l1l2:
        from sts_harness.l1l2_demo import DEMO_SCHEMA, prepare_fast_path

        fast_path = prepare_fast_path(out)
        source["schema"] = DEMO_SCHEMA
    from sts_harness.support_app import support_sections

    return PipelineConfig.from_dict(support_sections({
        **fast_path,
        **kafka,
        "source": source,
        "tagging": {"sla_ms": {"high": high, "normal": normal, "low": low},
                    "max_tokens": opts.max_tokens},
        "sidecar": {"endpoint": target, "results_dir": str(out / "results"),
                    "result_channel": "kafka" if bootstrap else "files",
                    "token_file": str(token_file)},
        "output": {"out_dir": str(out / "tables"),
                   "checkpoint_dir": str(out / "checkpoints"), "writer": opts.resolved_writer()},
        "rollout": {"mode": opts.rollout, "canary_share": opts.canary_share},
    }))


def warm_up_samples(samples: list[dict], n: int) -> list[dict]:
    """The warm-up's tickets: the last ``n`` shipped ones of ``high`` or ``normal``
    priority (deadlines of seconds; a default run's replay does not reach the end of the
    list), without their ticket id.

    Example:
        >>> tickets = [{"ticket_id": f"T{i}", "text": str(i), "priority": p}
        ...            for i, p in enumerate(["high", "low", "normal", "low"])]
        >>> warm_up_samples(tickets, 2)
        [{'text': '2', 'priority': 'normal'}, {'text': '0', 'priority': 'high'}]
    """
    picked = [s for s in reversed(samples) if s["priority"] in ("high", "normal")][:n]
    return [{k: v for k, v in s.items() if k != "ticket_id"} for s in picked]


def _answered(pipeline, *, remote: bool) -> tuple[int, collections.Counter]:
    """Answers written so far, and by source (on Spark Connect, where the counters live
    in the server, read from the table)."""
    if remote:
        rows = pipeline.store.read("answers", ["answer_source"])
        sources = rows.column("answer_source").to_pylist() if rows.num_rows else []
        return len(sources), collections.Counter(sources)
    return pipeline.store.stats.answers_written, collections.Counter(pipeline.store.stats.by_source)


def warm_up_pipeline(pipeline, sink: Callable[[int, int, list[dict]], None],
                     samples: list[dict], *, timeout_s: float) -> None:
    """Send ``samples`` through ``sink`` as warm-up events (:mod:`sts_harness.warm_up`)
    and wait until the pipeline answered each; with Delta on Spark also until the record
    tables had their first append (the one that compacts). L1/L2's counts of them are
    then forgotten, so the summary counts the replay alone.

    Raises:
        TimeoutError: not answered (or written) within ``timeout_s``.
    """
    from pyspark.sql.utils import is_remote

    from sidecar.contract import now_ms

    remote = is_remote()
    before, _ = _answered(pipeline, remote=remote)
    events = warm_up_events(samples, now_ms())
    send_warm_up(lambda batch: sink(batch[0]["event_ts"], 0, batch), events)
    wait_answered(lambda: _answered(pipeline, remote=remote)[0] - before, len(events),
                  timeout_s=timeout_s, check=pipeline.check)
    if pipeline.tables.writes_with_spark:
        rows = pipeline.store.read("answers", ["event_id", "answer_source"]).to_pylist()
        model = any(r["answer_source"] == "llm" for r in rows if is_warm_up(r))
        wait_first_writes(pipeline, RECORD_TABLES_WARMED if model else ("requests",),
                          timeout_s=timeout_s)
    pipeline.fast_path_stats.clear()


def _run_until_answered(opts: DemoOptions, out: Path, sidecar, pipeline, replayer,
                        start: float) -> str | None:
    """Replay the events, then wait until every event is answered (at most its deadline
    plus the grace: the safety net runs on processing time) and the sidecar has
    finished its late work, printing progress. Returns why it stopped early, if it did."""
    import grpc

    from spark_ext import PipelineFailedError

    from pyspark.sql.utils import is_remote

    client = sidecar.client
    assert client is not None
    remote = is_remote()
    warm, warm_sources = _answered(pipeline, remote=remote)  # the warm-up's, not counted

    def progress(phase: str) -> int:
        pipeline.check()
        if sidecar.proc is not None and sidecar.proc.poll() is not None:
            raise DemoFailedError(f"the sidecar exited with code {sidecar.proc.returncode}; "
                                  f"log: {out / 'sidecar.log'}")
        answered, sources = _answered(pipeline, remote=remote)
        answered, counts = answered - warm, dict(sources - warm_sources)
        st = client.stats()
        busy = sum(p.queued + p.in_flight for p in st.pools)
        print(f"[{time.monotonic() - start:5.1f}s] {phase}: events {replayer.offered}, "
              f"answers {answered} {counts}, sidecar busy {busy}, "
              f"{st.output_tokens_per_s:.0f} tok/s", flush=True)
        return answered

    try:
        while replayer.is_alive():
            time.sleep(3)
            progress("replaying")
        grace_ms = pipeline.config.answers.grace_ms
        last_due = time.monotonic() + (max(opts.sla_ms) + grace_ms) / 1000 + 5
        while time.monotonic() < last_due:
            if progress("answering") >= replayer.offered:
                break
            time.sleep(2)
        drain_deadline = time.monotonic() + opts.drain_timeout_s
        while time.monotonic() < drain_deadline:
            if sum(p.queued + p.in_flight for p in client.stats().pools) == 0:
                break
            time.sleep(2)
            progress("late results")
    except grpc.RpcError as e:
        failure = f"the sidecar stopped answering ({e.code().name}); log: {out / 'sidecar.log'}"
    except (DemoFailedError, PipelineFailedError) as e:
        failure = str(e).splitlines()[0]
    else:
        return None
    replayer.stop()
    print(f"sts demo: {failure}", flush=True)
    return failure


def fast_path_from_answers(answers: list[dict]) -> dict:
    """L1/L2's figures (:meth:`FastPathStats.summary`) from the answers rows, for a run
    whose counts stayed elsewhere (on Spark Connect the answers batch counts them in the
    server's Python process): the route from ``answer_source`` (``kb``, ``rule``, else
    ``llm``), the hits from ``kb_ids``; no mean score (the answers do not keep it).

    Example:
        >>> fast_path_from_answers([{"answer_source": "kb", "kb_ids": ["f1"]},
        ...                         {"answer_source": "llm", "kb_ids": []}])["routes"]
        {'kb': 1, 'llm': 1}
    """
    import pyarrow as pa

    from spark_ext.l2.fast_path import FastPathStats

    stats = FastPathStats()
    stats.add(pa.table({
        "route": [a["answer_source"] if a["answer_source"] in _ANSWERED_BY_L1L2 else "llm"
                  for a in answers],
        "kb_ids": pa.array([a.get("kb_ids") for a in answers], pa.list_(pa.string()))}))
    summary = stats.summary()
    summary["mean_top_score"] = None
    return summary


def summary_columns(pipeline) -> list[str]:
    """The answers table's columns the summary reads: every one but the answer's text,
    which is most of a row's bytes (the summary of a long run reads hundreds of
    thousands of rows)."""
    from spark_ext.l4.answers import answer_schema

    keys = pipeline.config.tagging.key_columns
    return [name for name in answer_schema(keys).names if name != "answer"]


def _demo_summary(opts: DemoOptions, out: Path, sidecar, pipeline, replayer,
                  wall_s: float, replay_began_s: float) -> dict:
    """The summary of a finished run: answers by source and priority, the sidecar's
    stats, rollout shares, the micro-batch durations since the replay began (epoch
    seconds), the plots and where the tables are."""
    from google.protobuf.json_format import MessageToDict

    from sts_harness.demo_plots import plot_demo
    from sts_harness.rollout_report import rollout_shares

    try:
        stats = MessageToDict(sidecar.client.stats(), preserving_proto_field_name=False)
    except Exception:  # the sidecar is gone
        stats = {}
    answers = [a for a in pipeline.store.read("answers", summary_columns(pipeline)).to_pylist()
               if not is_warm_up(a)]
    add_readable_times(answers, pipeline.config.output.table("answers"))
    fast_path = pipeline.fast_path_stats.summary() if opts.l1l2 else None
    if fast_path is not None and not fast_path["events"] and answers:  # counted elsewhere
        fast_path = fast_path_from_answers(answers)
    summary = summarize(answers, events=replayer.offered, wall_s=wall_s, stats=stats,
                        fast_path=fast_path)
    shadow = [a for a in pipeline.store.read("shadow_answers").to_pylist() if not is_warm_up(a)]
    summary["rollout"] = rollout_shares(answers, shadow, mode=opts.rollout,
                                        canary_share=opts.canary_share)
    summary["batch_ms"] = batch_durations(pipeline.queries, since_s=replay_began_s)
    summary["source"] = opts.source
    summary["kafka_lag"] = pipeline.kafka_lag()
    summary["dead_letters"] = pipeline.dead_letters
    high, normal, low = opts.sla_ms
    summary["plots"] = [str(p) for p in plot_demo(
        answers, out / "plots", {"high": high, "normal": normal, "low": low})]
    output = pipeline.config.output
    summary["tables"] = {name: output.table(name) for name in ("answers", "requests", "results")}
    if opts.rollout == "shadow":
        summary["tables"]["shadow_answers"] = output.table("shadow_answers")
    return summary


def print_summary(summary: dict) -> None:
    """Print the summary tables."""
    print("\n=== sts demo summary ===")
    if summary.get("incomplete"):
        print(f"INCOMPLETE: {summary['incomplete']}")
    print(f"events replayed      {summary['events']}")
    if (s := summary.get("sizing")) is not None:
        print(f"overload             {s['model_requests_per_s']:.2f} model requests/s offered, "
              f"{s['offered_factor']:g}x the measured capacity {s['capacity_rps']:.2f}/s "
              f"(sized for {s['factor']:g}x; answers of {s['max_tokens']} tokens)")
        if s.get("pace_mean") is not None:
            print(f"pace                 the engine delivered {s['pace_mean']:.0%} of its "
                  f"calibrated speed beside Spark (lowest {s['pace_min']:.0%}): "
                  f"{s['offered_factor_delivered']:g}x what it delivered")
    print(f"answers              {summary['answers']}  by source {summary['answers_by_source']}")
    print(f"fallbacks by cause   {summary['fallbacks_by_reason'] or '{}'}")
    if (r := summary.get("retrieval")) is not None:
        def share(x: float | None) -> str:
            return f"{x:.0%}" if x is not None else "n/a"

        top = r["mean_top_score"]
        print(f"L1/L2 routes         {r['routes']}; answered without the LLM (rule + kb) "
              f"{share(r['without_llm'])}")
        print(f"retrieval            hit rate {share(r['hit_share'])} (an article at or above "
              f"the score threshold), FAQ answers {share(r['kb_share'])}, mean top-1 score "
              f"{f'{top:.2f}' if top is not None else 'n/a'}")
        print(f"answers with kb_ids  {r['with_kb_ids']}")
    routed = summary.get("retrieval") is not None
    for p, v in summary["llm_within_sla"].items():
        share = f"{v['share']:.0%}" if v["share"] is not None else "n/a"
        lat = summary["latency_ms_by_priority"][p]
        figures = ", ".join(f"{k} {x:.0f} ms" for k, x in lat.items()
                            if k != "n" and x is not None)
        of_llm = ""
        if routed:  # L1/L2 answered some events itself: the model's share of the rest
            to_llm = v.get("share_of_to_llm")
            of_llm = (f", {v['llm_on_time']}/{v.get('to_llm', 0)} left to the LLM "
                      f"({f'{to_llm:.0%}' if to_llm is not None else 'n/a'})")
        readable = (f", {v['llm_readable_on_time']} readable by the deadline"
                    if "llm_readable_on_time" in v else "")
        print(f"{p:<7} LLM within SLA {v['llm_on_time']:>4}/{v['events']:<4} ({share:>4})"
              f"{of_llm}{readable}  latency {figures}")
    if "rollout" in summary:
        from sts_harness.rollout_report import format_rollout

        print(format_rollout(summary["rollout"]))
    llm_rate = summary["llm_answers_per_s"] or 0.0
    print(f"llm answers/s        {llm_rate:.2f}")
    hit = summary["prefix_cache_hit_rate"]
    print(f"engine               {summary['engine']}, "
          f"{summary['engine_output_tokens_per_s'] or 0:.0f} output tokens/s (last 10 s), "
          f"prefix-cache hit rate {f'{hit:.1%}' if hit is not None else 'not reported'}")
    for name, v in (summary.get("batch_ms") or {}).items():
        if v.get("n"):
            print(f"micro-batches {name:<12} {v['n']} with input since the replay began, "
                  f"P50 {v['p50']:.0f} ms, P99 {v['p99']:.0f} ms")
    for query, lag in (summary.get("kafka_lag") or {}).items():
        print(f"kafka lag {query:<11} {sum(lag.values())} records behind "
              f"({', '.join(f'{tp} {n}' for tp, n in sorted(lag.items()))})")
    if summary.get("source") == "kafka":
        print(f"dead letters         {summary.get('dead_letters', 0)} records that are not "
              "events (the dead_letters table)")
    print("where the time went (answers of the model and fallbacks):")
    for line in format_hops(summary["hops_ms"]):
        print("  " + line)
    for name, path in summary["tables"].items():
        print(f"delta table {name:<9} {path}")
    for path in summary.get("plots", []):
        print(f"plot                  {path}")
