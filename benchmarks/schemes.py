"""One benchmark run: one scheme at one offered rate, measured the same way for all.

Schemes (same generated events, same sidecar settings, same trigger interval):

* ``engine``: the sidecar driven directly (no Spark), the engine's raw ceiling;
* ``sts``: :class:`spark_ext.pipeline.sts_pipeline.StsPipeline` (fire-and-forget submit, join, fallback);
* ``sts-kafka``: the same pipeline with the events on a Kafka topic (Spark's Kafka source)
  and the results on the ``llm.result.{priority}`` topics (a second sidecar, same engine
  settings, on the ``kafka`` result channel);
* ``baseline-sync`` / ``baseline-concurrent``: :class:`benchmarks.baseline.BlockingForeachBatch`.

Per run: offered events, answers (any source) and answers within the SLA, LLM
answers within the SLA (goodput), sustained LLM throughput over the offered
window, end-to-end latency P50/P90/P99 per priority (answer time minus the
event's scheduled arrival), backlog over time (offered minus answered), micro-batch
durations, engine output tokens/s.
"""

from __future__ import annotations

import collections
import logging
import shutil
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.cli_args import KAFKA_SCHEMES, SCHEMES
from benchmarks.generate import GeneratedRequest, events_for_spark
from benchmarks.kafka_topics import create_topics, landing_times, merge_hops, topic_hops
from benchmarks.loadgen import send_on_schedule
from sts_capacity.profiles import TrafficProfile
from sidecar import percentiles, security_fields
from sidecar.client import SidecarClient
from sidecar.contract import PRIORITY_NAMES, now_ms
from sts_harness.hops import hop_latencies
from sts_harness.readable import add_readable_times, readable_by_deadline
from sts_harness.replay import EVENT_SCHEMA, EventReplayer, KafkaTopicSink
from sts_harness.result_check import read_results, results_by_id
from sts_harness.warm_up import (is_warm_up, send_warm_up, wait_answered, wait_first_writes,
                                  warm_up_events)

logger = logging.getLogger(__name__)


@dataclass
class Answer:
    """One answered event, whatever the scheme."""

    priority: str
    latency_ms: float
    on_time: bool
    llm: bool
    answered_ms: int
    readable_on_time: bool | None = None
    """Whether its row was readable by the deadline (its commit;
    :mod:`sts_harness.readable`); ``None``: not known (no table of ours)."""


@dataclass
class KafkaPath:
    """What the ``sts-kafka`` scheme runs on: its own sidecar (the ``kafka`` result
    channel) and the cluster."""

    client: SidecarClient
    bootstrap_servers: str
    cluster: str
    """``local`` (a broker the bench started) or ``external``."""

    event_partitions: int = 2
    """Partitions of each run's events topic (the files source reads ~2 partitions of
    the due files on 2 cores)."""
    results_reader: str = "driver"
    """``kafka.results_reader`` of the pipeline: ``driver`` or ``spark``."""
    answers_topic: str | None = None
    """Publish each run's answers on a topic of its own (``answers.topic``) and measure
    when they land there: ``microbatch`` or ``realtime`` (``triggers.publish``)."""


@dataclass
class RunContext:
    """What every run shares."""

    client: SidecarClient
    results_dir: Path
    work_dir: Path
    profile: TrafficProfile
    duration_s: float
    trigger_s: float
    spark: object | None = None
    writer: str = "auto"
    """``output.writer`` of the Spark schemes."""
    kafka: KafkaPath | None = None
    """Set when the ``sts-kafka`` scheme runs."""


@dataclass
class Sampler:
    """Backlog and engine throughput, once a second; a progress line every ``every_s``."""

    label: str = ""
    every_s: float = 10.0
    start: float = field(default_factory=time.monotonic)
    backlog: list[tuple[float, int]] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    _last_print: float = 0.0

    def sample(self, client: SidecarClient, offered: int, answered: int) -> None:
        t = time.monotonic() - self.start
        self.backlog.append((round(t, 2), offered - answered))
        try:
            self.tokens_per_s.append(client.stats().output_tokens_per_s)
        except Exception:  # stats are best effort while the sidecar is saturated
            pass
        if self.label and t - self._last_print >= self.every_s:
            self._last_print = t
            tps = f"{self.tokens_per_s[-1]:.0f}" if self.tokens_per_s else "-"
            print(f"  [{self.label} {t:5.0f}s] offered {offered}, answered {answered}, "
                  f"backlog {offered - answered}, engine {tps} tok/s", flush=True)


def _percentiles(values: list[float]) -> dict:
    """``{"n", "p50", "p90", "p99"}`` of ``values`` (unrounded; ``None`` for no values)."""
    return {"n": len(values), **percentiles(values, digits=None)}


def _phase_medians(progress: list[dict]) -> dict[str, float]:
    """Median ``durationMs`` per phase over the micro-batches that had input rows."""
    busy = [p["durationMs"] for p in progress if p.get("numInputRows")]
    phases = sorted({k for d in busy for k in d})
    return {k: statistics.median(d.get(k, 0) for d in busy) for k in phases}


#: Events run through a Spark scheme before its measured replay, so that its start-up
#: (query planning, the first Python workers: ~7 s for the first micro-batch on 2 cores)
#: is not billed to the first events of the run (:mod:`sts_harness.warm_up`).
WARM_UP_EVENTS = 6


def warm_up_scheme(target: Path | Callable[[list[dict]], None], answered: Callable[[], int],
                   timeout_s: float = 120.0) -> None:
    """Write :data:`WARM_UP_EVENTS` events (into a landing folder, or through a
    function, e.g. onto a topic) and wait until the scheme answered them."""
    events = warm_up_events([{"text": "Hello, is my order late?", "priority": "low",
                              "max_tokens": 1}] * WARM_UP_EVENTS, now_ms())
    send_warm_up(target, events)
    wait_answered(answered, WARM_UP_EVENTS, timeout_s=timeout_s)


def _replayer(sink: Path | KafkaTopicSink, requests: list[GeneratedRequest]) -> EventReplayer:
    """Replays ``requests`` as Spark events into ``sink`` (a landing folder or a topic),
    each at its arrival time."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    return EventReplayer(sink, [r.arrival_s for r in ordered],
                         lambda start_ms: events_for_spark(ordered, start_ms))


def summarize(scheme: str, rate: float, offered: int, answers: list[Answer], start_ms: int,
              ctx: RunContext, sampler: Sampler, batch_durations_s: list[float]) -> dict:
    """The figures of one run (the JSON row)."""
    window_end = start_ms + ctx.duration_s * 1000
    llm_in_window = sum(1 for a in answers if a.llm and a.answered_ms <= window_end)
    by_priority = {p: _percentiles([a.latency_ms for a in answers if a.priority == p])
                   for p in PRIORITY_NAMES}
    return {
        "scheme": scheme,
        "offered_rate": rate,
        "offered": offered,
        "answered": len(answers),
        "answered_on_time": sum(a.on_time for a in answers),
        "llm_answers": sum(a.llm for a in answers),
        "llm_on_time": sum(a.on_time and a.llm for a in answers),
        "goodput": (sum(a.on_time and a.llm for a in answers) / offered) if offered else None,
        "llm_on_time_by_priority": {p: [sum(a.on_time and a.llm for a in answers
                                            if a.priority == p),
                                        sum(a.priority == p for a in answers)]
                                    for p in PRIORITY_NAMES},
        "on_time_rate": (sum(a.on_time for a in answers) / offered) if offered else None,
        "llm_throughput_per_s": llm_in_window / ctx.duration_s,
        "latency_ms": _percentiles([a.latency_ms for a in answers]),
        "latency_ms_by_priority": by_priority,
        "backlog": sampler.backlog,
        "final_backlog": offered - len(answers),
        "batch_s": _percentiles(batch_durations_s),
        "engine_tokens_per_s": statistics.fmean(sampler.tokens_per_s) if sampler.tokens_per_s
        else None,
        **readable_figures(answers, offered),
    }


def readable_figures(answers: list[Answer], offered: int) -> dict:
    """Goodput with an answer counted on time only when its row was readable by its
    deadline (where that is known): the share of events, and per priority; ``{}``
    when no answer's readable time is known.

    Example:
        >>> decided = [Answer("high", 900.0, True, True, 1_000, readable_on_time=False),
        ...            Answer("low", 900.0, True, True, 1_000, readable_on_time=True)]
        >>> figures = readable_figures(decided, offered=4)
        >>> figures["goodput_readable"], figures["llm_readable_on_time_by_priority"]["high"]
        (0.25, [0, 1])
        >>> readable_figures([Answer("low", 900.0, True, True, 1_000)], offered=1)
        {}
    """
    known = [a for a in answers if a.readable_on_time is not None]
    if not known or not offered:
        return {}
    return {
        "goodput_readable": sum(a.llm and bool(a.readable_on_time) for a in known) / offered,
        "llm_readable_on_time_by_priority": {
            p: [sum(a.llm and bool(a.readable_on_time) for a in known if a.priority == p),
                sum(a.priority == p for a in answers)] for p in PRIORITY_NAMES},
    }


def wait_idle(client: SidecarClient, timeout_s: float = 120.0) -> None:
    """Until the sidecar has nothing queued or running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = client.stats()
        if sum(p.queued + p.in_flight for p in st.pools) == 0:
            return
        time.sleep(0.5)
    logger.warning("sidecar still busy after %.0fs", timeout_s)


def archive_results(results_dir: Path, archive: Path) -> None:
    """Move finished result files aside so the next run's streams start empty."""
    archive.mkdir(parents=True, exist_ok=True)
    for f in results_dir.glob("*.parquet"):
        shutil.move(str(f), archive / f.name)


# --------------------------------------------------------------------------- engine


def run_engine(ctx: RunContext, rate: float, requests: list[GeneratedRequest]) -> dict:
    """Drive the sidecar directly with the generated requests, on schedule."""
    sampler = Sampler(f"engine @{rate:g}/s")
    run = send_on_schedule(
        ctx.client, requests, id_prefix=f"eng-{rate}", duration_s=ctx.duration_s,
        sample_every_s=1.0,
        on_sample=lambda _, sent: sampler.sample(ctx.client, sent,
                                                 len(read_results(ctx.results_dir))))
    deadline = time.monotonic() + max(ctx.profile.sla_ms.values()) / 1000 + 10
    want = {s.request_id for s in run.sent}
    while True:
        rows = results_by_id(read_results(ctx.results_dir), want)
        sampler.sample(ctx.client, len(want), len(rows))
        if len(rows) == len(want) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    answers = [Answer(r["priority"], r["finish_ts"] - r["enqueue_ts"],
                      r["status"] == "ok" and r["finish_ts"] <= r["deadline_ts"],
                      r["status"] == "ok", r["finish_ts"]) for r in rows.values()]
    return summarize("engine", rate, len(want), answers, run.start_ms, ctx, sampler, [])


# --------------------------------------------------------------------------- spark schemes


#: ``sts-kafka-rtm``'s requests topic: the Kafka sidecar's ``intake.topic``.
RTM_REQUESTS_TOPIC = "sts-bench-requests"
#: How long a run waits for its answers on the answers topic before it stops.
PUBLISH_WAIT_S = 30.0


def _pipeline_config(ctx: RunContext, run_dir: Path, *, events_topic: str | None = None,
                     realtime: bool = False):
    """The pipeline of a Spark scheme: events from ``run_dir/events`` and results from
    the files channel, or, with ``events_topic``, both on Kafka (``ctx.kafka``); with
    ``realtime``, its submit query in Real-Time Mode (the requests on
    :data:`RTM_REQUESTS_TOPIC`, which the Kafka sidecar reads)."""
    from spark_ext.config import PipelineConfig

    cap = max(ctx.profile.output_tokens.cap, 1)
    source: dict = {"path": str(run_dir / "events"), "schema": EVENT_SCHEMA,
                    "options": {"maxFilesPerTrigger": "1000"}}
    client, kafka, channel, extra = ctx.client, {}, "files", {}
    answers: dict = {"grace_ms": 1000}
    tagging: dict = {"sla_ms": dict(ctx.profile.sla_ms), "max_tokens": cap,
                     "max_tokens_column": "max_tokens"}
    triggers: dict = {"submit": "realtime" if realtime else ctx.trigger_s,
                      "answers": ctx.trigger_s}
    if events_topic is not None:
        assert ctx.kafka is not None
        client, channel = ctx.kafka.client, "kafka"
        source = {"format": "kafka", "schema": EVENT_SCHEMA,
                  "options": {"subscribe": events_topic, "startingOffsets": "earliest"}}
        kafka = {"kafka": {"bootstrap_servers": ctx.kafka.bootstrap_servers,
                           "results_reader": ctx.kafka.results_reader,
                           "requests_topic": RTM_REQUESTS_TOPIC}}
        if ctx.kafka.answers_topic:
            answers["topic"] = f"{events_topic}.answers"
        if ctx.kafka.answers_topic == "realtime":
            # one result topic of one partition: a real-time query holds a slot per partition
            tagging["callback_topic"] = f"{events_topic}.results"
            extra = {"validation": {"enabled": False}}
            triggers["publish"] = "realtime"
    from sts_harness.support_app import support_sections

    return PipelineConfig.from_dict(support_sections({
        **kafka, **extra,
        "source": source,
        "tagging": tagging,
        "sidecar": {"endpoint": client.target, "results_dir": str(ctx.results_dir),
                    "result_channel": channel,
                    "timeout_s": 30.0, **security_fields(client.security)},
        "answers": answers,
        "output": {"out_dir": str(run_dir / "tables"),
                   "checkpoint_dir": str(run_dir / "checkpoints"),
                   "triggers": triggers,
                   "writer": ctx.writer},
    }))


def run_sts(ctx: RunContext, rate: float, requests: list[GeneratedRequest], *,
            channel: str = "files", realtime: bool = False) -> dict:
    """The STS pipeline on the replayed events: from a landing folder with the files
    result channel, or (``channel="kafka"``) from a topic of its own with the results on
    the ``llm.result.{priority}`` topics; ``realtime``: its submit query in Real-Time Mode
    (``sts-kafka-rtm``: an events topic of one partition, Real-Time Mode holding a task
    slot per partition and the answers query needing the other)."""
    from spark_ext.pipeline.sts_pipeline import StsPipeline

    scheme = "sts" if channel == "files" else "sts-kafka-rtm" if realtime else "sts-kafka"
    run_dir = ctx.work_dir / f"{scheme}-{rate}"
    client = ctx.client
    topic = None
    if channel == "kafka":
        assert ctx.kafka is not None, "sts-kafka needs RunContext.kafka"
        client = ctx.kafka.client
        topic = f"sts-bench-events-{rate:g}-{uuid.uuid4().hex[:8]}"
    config = _pipeline_config(ctx, run_dir, events_topic=topic, realtime=realtime)
    if topic is not None:
        assert ctx.kafka is not None
        topics = create_topics(ctx.kafka.bootstrap_servers, [topic],
                               partitions=1 if realtime else ctx.kafka.event_partitions)
        topics |= create_topics(ctx.kafka.bootstrap_servers, config.result_topics())
        sink = KafkaTopicSink(ctx.kafka.bootstrap_servers, topic)
        replayer = _replayer(sink, requests)
        warm_target: Path | Callable[[list[dict]], None] = lambda events: sink(0, 0, events)
    else:
        replayer = _replayer(run_dir / "events", requests)
        warm_target = run_dir / "events"
    sampler = Sampler(f"{scheme} @{rate:g}/s")
    pipeline = StsPipeline(ctx.spark, config)
    pipeline.start()
    warm_up_scheme(warm_target, lambda: pipeline.store.stats.answers_written)
    wait_first_writes(pipeline)
    warm = pipeline.store.stats.answers_written
    replayer.start()

    def answered() -> list[dict]:
        rows = pipeline.store.read("answers", [
            "request_id", "event_id", "priority", "answer_source", "latency_ms",
            "deadline_met", "enqueue_ts", "submit_ts", "received_ts", "finish_ts",
            "answered_ts", "deadline_ts"]).to_pylist()
        return [r for r in rows if not is_warm_up(r)]

    try:
        end = time.monotonic() + ctx.duration_s
        while time.monotonic() < end:
            time.sleep(1.0)
            pipeline.check()
            sampler.sample(client, replayer.offered,
                           pipeline.store.stats.answers_written - warm)
        replayer.join()
        # Every request is answered by deadline + grace (the safety net runs on
        # processing time), so waiting that long plus a margin is enough.
        drain_end = time.monotonic() + (max(ctx.profile.sla_ms.values())
                                        + config.answers.grace_ms) / 1000 + 10
        while time.monotonic() < drain_end:
            pipeline.check()
            written = pipeline.store.stats.answers_written - warm
            sampler.sample(client, replayer.offered, written)
            if written >= replayer.offered:
                break
            time.sleep(0.5)
        rows = answered()
        if topic is not None and config.answers.topic is not None:
            _wait_published(pipeline, ctx.kafka.bootstrap_servers, config.answers.topic,
                            {r["event_id"] for r in rows}, since_ms=replayer.start_ms - 1000)
        durations = [p["durationMs"].get("triggerExecution", 0) / 1000
                     for q in pipeline.queries if q.name == "sts-submit"
                     for p in q.recentProgress]
        query_ms = {q.name: _phase_medians(q.recentProgress) for q in pipeline.queries}
    finally:
        pipeline.stop()
        replayer.stop()
    add_readable_times(rows, config.output.table("answers"))
    answers = [Answer(r["priority"], float(r["latency_ms"]), bool(r["deadline_met"]),
                      r["answer_source"] == "llm", r["answered_ts"],
                      readable_by_deadline(r)) for r in rows]
    result = summarize(scheme, rate, replayer.offered, answers, replayer.start_ms, ctx, sampler,
                       durations)
    result["hops_ms"] = hop_latencies(rows)
    result["writer"] = pipeline.writer
    if topic is not None:
        _kafka_figures(ctx, config, topic, topics, rows, replayer.start_ms, result)
    result["query_phase_ms_p50"] = query_ms
    result["answers_steps_ms"] = pipeline.counts.step_percentiles(since_ms=replayer.start_ms)
    result["answers_by_source"] = dict(collections.Counter(r["answer_source"] for r in rows))
    return result


def _kafka_figures(ctx: RunContext, config, topic: str, topics: object, rows: list[dict],
                   start_ms: int, result: dict) -> None:
    """The Kafka route's figures into ``result``: the hops through the events and result
    topics (and the answers topic, when published), and the cluster's description."""
    assert ctx.kafka is not None
    since = start_ms - 1000
    events_at, kind = landing_times(ctx.kafka.bootstrap_servers, [topic], since_ms=since)
    results_at, result_kind = landing_times(ctx.kafka.bootstrap_servers,
                                            config.result_topics(), since_ms=since)
    result["hops_ms"] = merge_hops(result["hops_ms"],
                                   topic_hops(rows, events_at, results_at))
    if config.answers.topic is not None:  # keyed by the event's key column
        published, _ = landing_times(ctx.kafka.bootstrap_servers, [config.answers.topic],
                                     since_ms=since)
        for hop, source in (("event -> on answers topic", None),
                            ("event -> on answers topic, the model's", "llm")):
            on_topic = [r for r in rows if r["event_id"] in published
                        and source in (None, r["answer_source"])]
            result["hops_ms"][hop] = percentiles(
                [published[r["event_id"]] - r["enqueue_ts"] for r in on_topic], (50, 99),
                digits=1) | {"n": len(on_topic)}
    result["kafka"] = {"cluster": ctx.kafka.cluster, "events_topic": topic,
                       "result_topics": config.result_topics(), "topics": topics,
                       "event_partitions": ctx.kafka.event_partitions,
                       "timestamps": {"events": kind, "results": result_kind}}


def _wait_published(pipeline, bootstrap_servers: str, topic: str, event_ids: set[str], *,
                    since_ms: int, timeout_s: float = PUBLISH_WAIT_S) -> None:
    """Wait (at most ``timeout_s``) until every answered event is on the answers topic:
    the publisher's micro-batch trails the answers table's, so a topic read right after
    the table is complete misses the answers of its last batch (a measurement of the
    stop, not a loss)."""
    end = time.monotonic() + timeout_s
    while True:
        published, _ = landing_times(bootstrap_servers, [topic], since_ms=since_ms)
        missing = len(event_ids - published.keys())
        if not missing:
            return
        if time.monotonic() >= end:
            logger.warning("%d answered events not on %s after %.0f s.", missing, topic,
                           timeout_s)
            return
        pipeline.check()
        time.sleep(1.0)


def run_baseline(ctx: RunContext, rate: float, requests: list[GeneratedRequest],
                 mode: str) -> dict:
    """Scheme A on the replayed events; what is unanswered at the cutoff counts as missed."""
    from benchmarks.baseline import BlockingForeachBatch

    run_dir = ctx.work_dir / f"baseline-{mode}-{rate}"
    config = _pipeline_config(ctx, run_dir)
    baseline = BlockingForeachBatch(ctx.spark, config, mode)  # type: ignore[arg-type]
    replayer = _replayer(run_dir / "events", requests)
    sampler = Sampler(f"baseline-{mode} @{rate:g}/s")
    baseline.start()
    warm_up_scheme(run_dir / "events", lambda: len(baseline.state.answers))
    with baseline.state.lock:
        baseline.state.answers.clear()
        baseline.state.batch_durations_s.clear()
    replayer.start()
    try:
        end = time.monotonic() + ctx.duration_s
        while time.monotonic() < end:
            time.sleep(1.0)
            sampler.sample(ctx.client, replayer.offered, len(baseline.state.answers))
        replayer.join()
        drain_end = time.monotonic() + max(ctx.profile.sla_ms.values()) / 1000 + 5
        while time.monotonic() < drain_end and \
                len(baseline.state.answers) < replayer.offered:
            time.sleep(1.0)
            sampler.sample(ctx.client, replayer.offered, len(baseline.state.answers))
    finally:
        baseline.stop()
        replayer.stop()
    with baseline.state.lock:
        done = list(baseline.state.answers)
        durations = list(baseline.state.batch_durations_s)
    answers = [Answer(a.priority, float(a.answered_ts - a.enqueue_ts),
                      a.ok and a.answered_ts <= a.sla_deadline_ts, a.ok, a.answered_ts)
               for a in done]
    return summarize(f"baseline-{mode}", rate, replayer.offered, answers, replayer.start_ms,
                     ctx, sampler, durations)


def run_scheme(scheme: str, ctx: RunContext, rate: float,
               requests: list[GeneratedRequest]) -> dict:
    """Run one scheme at one rate, then wait for the sidecar to go idle."""
    if scheme == "engine":
        result = run_engine(ctx, rate, requests)
    elif scheme in ("sts", *KAFKA_SCHEMES):
        result = run_sts(ctx, rate, requests,
                         channel="kafka" if scheme in KAFKA_SCHEMES else "files",
                         realtime=scheme == "sts-kafka-rtm")
    elif scheme in ("baseline-sync", "baseline-concurrent"):
        result = run_baseline(ctx, rate, requests, scheme.removeprefix("baseline-"))
    else:
        raise ValueError(f"unknown scheme {scheme!r}; choose from {SCHEMES}")
    wait_idle(ctx.kafka.client if scheme in KAFKA_SCHEMES and ctx.kafka else ctx.client)
    archive_results(ctx.results_dir, ctx.work_dir / "results-archive" / f"{scheme}-{rate}")
    return result
