"""The submit query in Spark's Real-Time Mode against the micro-batch trigger.

``python -m benchmarks.realtime_mode`` runs the submit path of the pipeline, Kafka
events -> L1/L2 tagging (:func:`spark_ext.l2.prompts.build_requests`) -> fire-and-forget
submission (:func:`spark_ext.submit.submission.submit_requests`, ``mapInArrow``) -> the
ack rows to a Kafka topic (a sink Real-Time Mode accepts), in each mode at each rate:

* ``microbatch``: ``trigger(processingTime="0 seconds")`` (as fast as possible, what the
  pipeline runs);
* ``realtime``: ``outputMode("update").trigger(realTime=...)`` (Spark 4.1+) with
  ``spark.sql.streaming.realTimeMode.allowlistCheck=false``: its allowlist has no Python
  operator, so ``mapInArrow`` is refused otherwise (``--probe`` shows the errors);
* ``realtime-small-arrow``: the same with ``spark.sql.execution.arrow.maxRecordsPerBatch``
  set to ``--small-arrow-batch`` (the Python worker receives a batch only when it is full
  or the real-time batch ends);
* ``realtime-intake``: what ``output.triggers.submit: realtime`` runs, with the allowlist
  check on: the request rows as JSON records to a requests topic
  (:func:`spark_ext.submit.realtime.request_records`, Spark's Kafka sink), which the
  sidecar reads itself (``intake.topic``, :mod:`sidecar.kafka_intake`); those records are
  the acks.

Each event carries the time it was produced (``event_ts``, epoch ms, set just before
``produce``), which tagging makes the request's ``enqueue_ts``; the sidecar's result row
carries ``enqueue_ts`` and ``received_ts``, so **event -> sidecar received** is
``received_ts - enqueue_ts`` per request. Also reported: event -> on topic (the
brokers' append time), event -> submitted (the ack's ``submit_ts``) and event -> ack on
the acks topic. The engine is the ``simulated`` one (labelled SIMULATION): only the
time to reach the sidecar is measured.

``--probe`` also starts, in Real-Time Mode with the allowlist check on (and a few with
it off), the other parts of the pipeline and records what runs and the exact error of
what is refused: ``mapInArrow`` submission, the L1/L2 pandas UDFs, the ``foreachBatch``
writers of requests and answers, a Delta sink, the stateless answers projection
(results topic -> answers topic).

Example::

    python -m benchmarks.realtime_mode --rates 50,200 --duration 20 --probe \\
        --out benchmarks/results/realtime_mode.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.kafka_topics import create_topics, landing_times
from sidecar import percentiles, security_fields, write_text_atomically
from sidecar.contract import PRIORITY_NAMES, now_ms

logger = logging.getLogger(__name__)

MODES: tuple[str, ...] = ("microbatch", "realtime", "realtime-small-arrow",
                          "realtime-small-buffers", "realtime-intake")
#: The requests topic of ``realtime-intake`` (the sidecar's ``intake.topic``).
INTAKE_TOPIC = "rtm-requests"
#: Spark's switch for Real-Time Mode's operator and sink allowlist.
ALLOWLIST_CHECK = "spark.sql.streaming.realTimeMode.allowlistCheck"
ARROW_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: The buffer of the JVM's stream to an Arrow Python worker (default ``spark.buffer.size``).
PYTHON_BUFFER = "spark.sql.execution.pandas.udf.buffer.size"
#: The Python workers' own buffer of their output (a static setting, 64 KiB by default:
#: the workers get it as ``SPARK_BUFFER_SIZE``).
BUFFER_SIZE = "spark.buffer.size"
#: The events' schema (what the replayed events carry).
EVENT_DDL = "event_id STRING, text STRING, priority STRING, event_ts LONG"
#: Events sent (and answered) before each measured run: the query's first records.
WARM_UP_EVENTS = 10


@dataclass
class RealtimeOptions:
    """What ``python -m benchmarks.realtime_mode`` runs."""

    rates: list[float] = field(default_factory=lambda: [50.0, 200.0])
    """Events/s offered, one run per rate and mode."""

    duration_s: float = 20.0
    """Seconds of events per run."""

    modes: list[str] = field(default_factory=lambda: list(MODES))
    """Of :data:`MODES`."""

    realtime_interval: str = "5 seconds"
    """The real-time trigger's checkpoint interval (4.2's minimum: 5 s)."""

    small_arrow_batch: int = 1
    """``maxRecordsPerBatch`` of the ``realtime-small-arrow*`` modes."""

    small_buffer: int = 1024
    """Bytes of both buffers between the JVM and the Python worker in
    ``realtime-small-buffers``."""

    partitions: int = 2
    """Partitions of each run's events topic (one long-running task each in Real-Time
    Mode, which needs a free task slot per partition: ``local[2]`` has two)."""

    probe: bool = False
    """Also try the other parts of the pipeline in Real-Time Mode (see the module doc)."""

    kafka_bootstrap: str | None = None
    """The brokers; ``None``: a local broker started for the run."""

    sidecar_config: str = "conf/sidecar-seed-sim.yaml"
    """The simulated sidecar's config (ten replicas: nothing is shed at these rates)."""

    out: str = "./sts-realtime/realtime_mode.json"
    """Where the JSON result goes (scratch space is a temporary folder, removed after)."""


class _ResultRows:
    """The sidecar's result rows by ``event_id`` attribute, reading each Parquet file
    that lands in its folder after construction once (~20 files/s land)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.seen: set[str] = {p.name for p in folder.glob("*.parquet")}
        self.by_event: dict[str, dict] = {}

    def __call__(self) -> dict[str, dict]:
        import pyarrow.parquet as pq

        for path in sorted(self.folder.glob("*.parquet")):
            if path.name in self.seen:
                continue
            self.seen.add(path.name)
            for r in pq.read_table(path).to_pylist():
                attrs = r.get("attributes")
                attrs = dict(attrs) if isinstance(attrs, list) else (attrs or {})
                if (e := attrs.get("event_id")) and not r.get("late"):
                    self.by_event.setdefault(e, r)
        return self.by_event


def _stats(values: list[float]) -> dict:
    return {"n": len(values), **percentiles(values, (50, 90, 99), digits=1),
            "max": max(values) if values else None}


class _EventProducer(threading.Thread):
    """Produces events to ``topic`` at ``rate``/s (evenly spaced) for ``duration_s``,
    each stamped with its produce time; ``events`` keeps what was sent."""

    def __init__(self, bootstrap: str, topic: str, rate: float, duration_s: float,
                 prefix: str) -> None:
        super().__init__(name="rtm-events", daemon=True)
        from confluent_kafka import Producer

        self.topic, self.rate, self.duration_s, self.prefix = topic, rate, duration_s, prefix
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                                  "enable.idempotence": True, "log_level": 0})
        self.sent: list[str] = []
        self.start_ms = 0

    def send(self, i: int) -> None:
        ts = now_ms()
        event = {"event_id": f"{self.prefix}-{i:06d}", "text": f"Is my order {i} late?",
                 "priority": PRIORITY_NAMES[i % 3], "event_ts": ts}
        self.producer.produce(self.topic, json.dumps(event).encode(),
                              key=event["event_id"].encode())
        self.producer.poll(0)
        self.sent.append(event["event_id"])

    def run(self) -> None:
        n = int(round(self.rate * self.duration_s))
        # the producer's connection and the topic's metadata first: else the first events
        # wait up to a second for them, a cost of this client, not of the path measured
        self.producer.list_topics(self.topic, timeout=10)
        self.start_ms = now_ms()
        start = time.monotonic()
        for i in range(n):
            wait = start + i / self.rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self.send(i)
        self.producer.flush(30)


def _events(spark, bootstrap: str, topic: str):
    from pyspark.sql import functions as F

    records = (spark.readStream.format("kafka")
               .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
               .option("startingOffsets", "earliest").load())
    return records.select(F.from_json(F.col("value").cast("string"), EVENT_DDL).alias("e")) \
        .select("e.*")


def _acks_query(spark, bootstrap: str, topic: str, ack_topic: str, sidecar, checkpoint: str,
                mode: str, interval: str):
    """The submit query of one run: events -> tagging -> submission -> acks topic."""
    from pyspark.sql import functions as F

    from spark_ext.config import SidecarEndpointConfig, TaggingConfig
    from spark_ext.l2.prompts import build_requests
    from spark_ext.l2.template import PromptTemplate
    from spark_ext.submit.submission import submit_requests

    tagging = TaggingConfig(sla_ms={"high": 60_000, "normal": 60_000, "low": 60_000},
                            max_tokens=16)
    endpoint = SidecarEndpointConfig(endpoint=sidecar.target, timeout_s=10.0,
                                     **security_fields(sidecar.client.security))
    template = PromptTemplate(stable=("You are a support assistant. Reply to the customer's "
                                      "ticket in one short, polite sentence.\n"),
                              dynamic="Ticket: {text}")
    requests = build_requests(_events(spark, bootstrap, topic), tagging, template)
    if mode == "realtime-intake":
        from spark_ext.submit.realtime import request_records

        records = request_records(requests, pipeline_id="rtm-bench", requests_topic=INTAKE_TOPIC,
                                  acks_topic=ack_topic, attribute_columns=["event_id"])
        return (records.writeStream.format("kafka").queryName(f"rtm-{mode}")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("checkpointLocation", checkpoint)
                .outputMode("update").trigger(realTime=interval).start())
    acks = submit_requests(requests, endpoint, ["event_id"])
    value = F.to_json(F.struct("request_id", "event_id", "enqueue_ts", "submit_ts",
                               "accepted", "reason"))
    writer = (acks.select(F.col("request_id").alias("key"), value.alias("value"))
              .writeStream.format("kafka").queryName(f"rtm-{mode}")
              .option("kafka.bootstrap.servers", bootstrap).option("topic", ack_topic)
              .option("checkpointLocation", checkpoint))
    if mode == "microbatch":
        return writer.trigger(processingTime="0 seconds").start()
    return writer.outputMode("update").trigger(realTime=interval).start()


class _LiveSparkConf:
    """The running SparkContext's own ``SparkConf`` (the one ``SparkEnv`` hands to Python
    runners in local mode): a static setting such as ``spark.buffer.size`` changed there
    reaches the Python workers started afterwards. A benchmark's shortcut; a deployment
    sets it when the cluster starts."""

    def __init__(self, spark) -> None:
        self._conf = spark.sparkContext._jsc.sc().conf()

    def get(self, key: str, default: str | None) -> str | None:
        return self._conf.get(key) if self._conf.contains(key) else default

    def set(self, key: str, value: str) -> None:
        self._conf.set(key, value)

    def unset(self, key: str) -> None:
        self._conf.remove(key)


@contextlib.contextmanager
def _conf(spark, values: dict[str, str | None]):
    """Settings for the ``with`` body, restored after: session settings, and
    ``spark.buffer.size`` on the live SparkConf (:class:`_LiveSparkConf`)."""
    live = _LiveSparkConf(spark)
    where = {k: live if k == BUFFER_SIZE else spark.conf for k in values}
    old = {k: where[k].get(k, None) for k in values}
    for k, v in values.items():
        if v is None:
            where[k].unset(k)
        else:
            where[k].set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                where[k].unset(k)
            else:
                where[k].set(k, v)


def _wait_for(what: str, done: Callable[[], bool], query, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if query.exception() is not None:
            raise RuntimeError(f"{what}: the query failed: "
                               f"{_first_line(str(query.exception()))}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done after {timeout_s:.0f} s")
        time.sleep(0.5)


def _first_line(text: str, limit: int = 600) -> str:
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line[:limit]


def run_one(spark, bootstrap: str, sidecar, results_dir: Path, work: Path, mode: str,
            rate: float, opts: RealtimeOptions) -> dict:
    """One mode at one rate: warm-up, ``duration_s`` of events, wait for the sidecar to
    have received every event, figures."""
    tag = f"{mode}-{rate:g}-{uuid.uuid4().hex[:6]}"
    topic, ack_topic = f"rtm-events-{tag}", f"rtm-acks-{tag}"
    create_topics(bootstrap, [topic], partitions=opts.partitions)
    create_topics(bootstrap, [ack_topic])
    settings: dict[str, str | None] = {}
    if mode not in ("microbatch", "realtime-intake"):
        settings[ALLOWLIST_CHECK] = "false"
    if mode in ("realtime-small-arrow", "realtime-small-buffers"):
        settings[ARROW_BATCH] = str(opts.small_arrow_batch)
    if mode == "realtime-small-buffers":
        settings[PYTHON_BUFFER] = str(opts.small_buffer)
        settings[BUFFER_SIZE] = str(opts.small_buffer)
    wanted: set[str] = set()
    received = _ResultRows(results_dir)

    with _conf(spark, settings):
        query = _acks_query(spark, bootstrap, topic, ack_topic, sidecar,
                            str(work / "checkpoints" / tag), mode, opts.realtime_interval)
        try:
            warm = _EventProducer(bootstrap, topic, 5.0, WARM_UP_EVENTS / 5.0, f"warm-{tag}")
            t0 = time.monotonic()
            warm.run()
            _wait_for("warm-up", lambda: set(warm.sent) <= set(received()), query, 180)
            if mode != "microbatch":  # the first real-time batch's end (a cold JVM's is slow)
                _wait_for("the first real-time batch", lambda: bool(query.recentProgress),
                          query, 60)
            warm_up_s = time.monotonic() - t0
            producer = _EventProducer(bootstrap, topic, rate, opts.duration_s, f"ev-{tag}")
            producer.start()
            producer.join()
            wanted = set(producer.sent)
            _wait_for("the run's events", lambda: wanted <= set(received()), query, 120)
            progress = list(query.recentProgress)
        finally:
            query.stop()
    by_event = {e: r for e, r in received().items() if e in wanted}
    rows = list(by_event.values())
    since = producer.start_ms - 1000
    on_topic, kind = landing_times(bootstrap, [topic], since_ms=since)
    # realtime-intake: the request records are the acks the answers query reads
    acked, ack_kind = landing_times(
        bootstrap, [INTAKE_TOPIC if mode == "realtime-intake" else ack_topic], since_ms=since)
    hops = {
        "event -> on events topic": [on_topic[e] - r["enqueue_ts"]
                                     for e, r in by_event.items() if e in on_topic],
        "event -> submitted": [r["submit_ts"] - r["enqueue_ts"] for r in rows
                               if r.get("submit_ts")],
        "event -> sidecar received": [r["received_ts"] - r["enqueue_ts"] for r in rows],
        "event -> ack on acks topic": [acked[r["request_id"]] - r["enqueue_ts"] for r in rows
                                       if r["request_id"] in acked],
    }
    seconds: dict[int, list[int]] = {}
    for r in rows:  # event -> received per second of the run (the real-time batch edges)
        seconds.setdefault((r["enqueue_ts"] - producer.start_ms) // 1000, []).append(
            r["received_ts"] - r["enqueue_ts"])
    return {
        "mode": mode, "rate": rate, "offered": len(wanted), "received": len(rows),
        "received_ms_by_second": [[s, len(v), percentiles(v, (50,), digits=0)["p50"], max(v)]
                                  for s, v in sorted(seconds.items())],
        "statuses": {s: sum(r["status"] == s for r in rows) for s in {r["status"] for r in rows}},
        "hops_ms": {h: _stats(v) for h, v in hops.items()},
        "settings": settings, "warm_up_s": round(warm_up_s, 1),
        "timestamps": {"events": kind, "acks": ack_kind},
        "progress_batches": len(progress),
        "load_average_after": list(os.getloadavg()),
    }


# --------------------------------------------------------------------------- probes


def _probe(spark, name: str, what: str, start: Callable[[], object], *,
           settings: dict[str, str | None] | None = None, feed: Callable[[], None] | None = None,
           ran: Callable[[], bool] | None = None, timeout_s: float = 40.0) -> dict:
    """Start one query in Real-Time Mode; ``runs`` when ``ran()`` holds before it fails,
    else the first line of its error (at ``start()`` or from the running query)."""
    out: dict = {"probe": name, "what": what, "settings": settings or {}}
    with _conf(spark, settings or {}):
        try:
            query = start()
        except Exception as e:  # noqa: BLE001 - the refusal is the finding
            out |= {"outcome": "refused at start()", "error": _first_line(str(e)),
                    "error_type": type(e).__name__}
            return out
        try:
            if feed is not None:
                feed()
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if (exc := query.exception()) is not None:
                    out |= {"outcome": "refused when planned", "error": _first_line(str(exc)),
                            "error_type": type(exc).__name__}
                    return out
                if ran is not None and ran():
                    out["outcome"] = "runs"
                    return out
                time.sleep(0.3)
            out["outcome"] = "no output and no error within the timeout"
            return out
        finally:
            with contextlib.suppress(Exception):
                query.stop()


def _passthrough(spark, bootstrap: str, work: Path, interval: str, tag: str, *,
                 arrow: bool) -> dict:
    """Kafka -> Kafka in Real-Time Mode, with or without an identity ``mapInArrow``
    between (1-record Arrow batches, 1 KiB buffers, allowlist check off): how long a
    record takes from the events topic to the output topic (both append times)."""
    from pyspark.sql import functions as F

    name = "passthrough" + ("-mapInArrow" if arrow else "")
    t, out_t = f"rtm-probe-{name}-in-{tag}", f"rtm-probe-{name}-out-{tag}"
    create_topics(bootstrap, [t], partitions=2)
    create_topics(bootstrap, [out_t])
    events = _events(spark, bootstrap, t)
    if arrow:
        events = events.mapInArrow(_identity, events.schema)
    settings = {ALLOWLIST_CHECK: "false", ARROW_BATCH: "1", PYTHON_BUFFER: "1024"}
    with _conf(spark, settings):
        query = (events.select(F.col("event_id").alias("key"),
                               F.to_json(F.struct("event_id", "event_ts")).alias("value"))
                 .writeStream.format("kafka").queryName(f"probe-{name}")
                 .option("kafka.bootstrap.servers", bootstrap).option("topic", out_t)
                 .option("checkpointLocation", str(work / "probe-ckpt" / f"{name}-{tag}"))
                 .outputMode("update").trigger(realTime=interval).start())
        try:
            _EventProducer(bootstrap, t, 5.0, 2.0, f"warm-{name}").run()
            time.sleep(6)
            producer = _EventProducer(bootstrap, t, 50.0, 10.0, f"ev-{name}")
            producer.run()
            time.sleep(7)
            error = query.exception()
        finally:
            query.stop()
    produced, _ = landing_times(bootstrap, [t], since_ms=producer.start_ms - 1000)
    landed, _ = landing_times(bootstrap, [out_t], since_ms=producer.start_ms - 1000)
    lat = [landed[e] - produced[e] for e in producer.sent if e in landed and e in produced]
    return {"probe": name, "what": "Kafka -> " + ("identity mapInArrow -> " if arrow else "")
            + "Kafka, 50 records/s for 10 s: events topic -> output topic",
            "settings": settings, "outcome": "runs" if error is None else "failed",
            "error": None if error is None else _first_line(str(error)),
            "latency_ms": _stats(lat), "delivered": len(lat), "offered": len(producer.sent)}


def _identity(batches):
    yield from batches


class _Probes:
    """What every probe of :func:`run_probes` shares: the session, the broker, the sidecar,
    a work folder, the real-time interval and a tag that keeps this run's topics apart."""

    def __init__(self, spark, bootstrap: str, sidecar, work: Path, interval: str) -> None:
        self.spark, self.bootstrap, self.sidecar = spark, bootstrap, sidecar
        self.work, self.interval = work, interval
        self.tag = uuid.uuid4().hex[:6]

    def topic(self, name: str, n: int = 1) -> str:
        t = f"rtm-probe-{name}-{self.tag}"
        create_topics(self.bootstrap, [t], partitions=n)
        return t

    def checkpoint(self, name: str) -> str:
        return str(self.work / "probe-ckpt" / f"{name}-{self.tag}")

    def events(self, t: str):
        return _events(self.spark, self.bootstrap, t)

    def feed_events(self, t: str) -> Callable[[], None]:
        return lambda: _EventProducer(self.bootstrap, t, 10.0, 0.5, f"probe-{t}").run()

    def has_records(self, t: str) -> Callable[[], bool]:
        return lambda: bool(landing_times(self.bootstrap, [t], since_ms=0, timeout_s=5)[0])

    def kafka_sink(self, df, out_topic: str, name: str):
        return (df.writeStream.format("kafka").queryName(f"probe-{name}")
                .option("kafka.bootstrap.servers", self.bootstrap).option("topic", out_topic)
                .option("checkpointLocation", self.checkpoint(name))
                .outputMode("update").trigger(realTime=self.interval))

    def probe(self, name: str, what: str, start, *, allow: bool = True, **kwargs) -> dict:
        """:func:`_probe` with the allowlist check on, or off (``allow=False``)."""
        return _probe(self.spark, name, what + ("" if allow else " (allowlist check off)"),
                      start, settings={} if allow else {ALLOWLIST_CHECK: "false"}, **kwargs)


def _submit_probe(p: _Probes, name: str, allow: bool) -> dict:
    t, out_t = p.topic(f"{name}-in"), p.topic(f"{name}-out")
    return p.probe(name, "Kafka events -> build_requests -> submit_requests (mapInArrow) -> "
                         "Kafka acks",
                   lambda: _acks_query(p.spark, p.bootstrap, t, out_t, p.sidecar,
                                       p.checkpoint(name), "realtime", p.interval),
                   allow=allow, feed=p.feed_events(t), ran=p.has_records(out_t))


def _tagging_probe(p: _Probes) -> dict:
    """Tagging alone (no Python): what the allowlist accepts."""
    from pyspark.sql import functions as F

    t, out_t = p.topic("tagging-in"), p.topic("tagging-out")

    def tagging_only():
        from spark_ext.config import TaggingConfig
        from spark_ext.l2.prompts import build_requests
        from spark_ext.l2.template import PromptTemplate

        reqs = build_requests(p.events(t), TaggingConfig(),
                              PromptTemplate(stable="You help customers.\n",
                                             dynamic="Ticket: {text}"))
        return p.kafka_sink(reqs.select(F.col("request_id").alias("key"),
                                        F.to_json(F.struct("request_id", "prompt",
                                                           "deadline_ts")).alias("value")),
                            out_t, "tagging").start()

    return p.probe("tagging", "Kafka events -> build_requests (L1 tags, L2 prompt: built-in "
                   "expressions) -> Kafka", tagging_only, feed=p.feed_events(t),
                   ran=p.has_records(out_t))


def _pandas_udf_probe(p: _Probes, allow: bool) -> dict:
    """An iterator pandas UDF: the shape of the L1/L2 fast path (spark_ext.l2.fast_path)."""
    from collections.abc import Iterator

    import pandas as pd
    from pyspark.sql import functions as F

    name = "l1l2-pandas-udf" + ("" if allow else "-allowlist-off")
    t, out_t = p.topic(f"{name}-in"), p.topic(f"{name}-out")

    def upper(batches):
        for s in batches:
            yield s.str.upper()

    # the hints make it an iterator UDF (as strings, they would not resolve here)
    upper.__annotations__ = {"batches": Iterator[pd.Series], "return": Iterator[pd.Series]}
    udf = F.pandas_udf(upper, "string")  # SQL_SCALAR_PANDAS_ITER_UDF

    def query():
        df = p.events(t).select(F.col("event_id").alias("key"), udf(F.col("text")).alias("value"))
        return p.kafka_sink(df, out_t, name).start()

    return p.probe(name, "Kafka events -> iterator pandas UDF (the L1 embedding/routing and "
                         "L2 retrieval UDFs' kind) -> Kafka", query, allow=allow,
                   feed=p.feed_events(t), ran=p.has_records(out_t))


class _MarkWriter:
    """A Python ``foreach`` writer that leaves a file per row in ``marks``."""

    def __init__(self, marks: Path) -> None:
        self.marks = marks

    def open(self, partition_id, epoch_id):
        return True

    def process(self, row):
        (self.marks / f"{row['event_id']}.seen").touch()

    def close(self, error):
        pass


def _foreach_probe(p: _Probes) -> dict:
    """A Python foreach writer: where a row-wise writer (delta-rs, a service) would go."""
    t = p.topic("foreach-in")
    marks = p.work / "probe-foreach" / p.tag
    marks.mkdir(parents=True, exist_ok=True)

    def query():
        return (p.events(t).writeStream.queryName("probe-foreach").foreach(_MarkWriter(marks))
                .option("checkpointLocation", p.checkpoint("foreach"))
                .outputMode("update").trigger(realTime=p.interval).start())

    return p.probe("foreach-writer", "Kafka events -> foreach(Python writer object)", query,
                   feed=p.feed_events(t), ran=lambda: any(marks.iterdir()))


def _foreach_batch_probe(p: _Probes, allow: bool) -> dict:
    """The foreachBatch writers (requests, answers tables)."""
    t = p.topic(f"fb-{allow}")
    seen: list[int] = []

    def query():
        return (p.events(t).writeStream.queryName("probe-foreachBatch")
                .foreachBatch(lambda df, batch_id: seen.append(df.count()))
                .option("checkpointLocation", p.checkpoint(f"fb-{allow}"))
                .outputMode("update").trigger(realTime=p.interval).start())

    return p.probe("foreachBatch" + ("" if allow else "-allowlist-off"),
                   "Kafka events -> foreachBatch (how the requests/answers Delta writes run)",
                   query, allow=allow, feed=p.feed_events(t), ran=lambda: sum(seen) > 0)


def _delta_probe(p: _Probes) -> dict:
    t = p.topic("delta-in")

    def query():
        return (p.events(t).writeStream.format("delta")
                .option("checkpointLocation", p.checkpoint("delta"))
                .outputMode("update").trigger(realTime=p.interval)
                .start(str(p.work / "probe-delta" / p.tag)))

    return p.probe("delta-sink", "Kafka events -> Delta sink (update mode)", query,
                   feed=p.feed_events(t))


def _answers_probe(p: _Probes) -> dict:
    """The stateless answers projection: results topic -> answers topic."""
    from pyspark.sql import functions as F

    t, out_t = p.topic("results-in"), p.topic("answers-out")

    def query():
        from sidecar.contract import RESULT_SCHEMA
        from spark_ext.schemas import spark_schema

        records = (p.spark.readStream.format("kafka")
                   .option("kafka.bootstrap.servers", p.bootstrap)
                   .option("subscribe", t).option("startingOffsets", "earliest").load())
        r = F.from_json(F.col("value").cast("string"), spark_schema(RESULT_SCHEMA)).alias("r")
        answers = records.select(r).select(
            F.col("r.request_id").alias("key"),
            F.to_json(F.struct(
                F.col("r.request_id"),
                F.when(F.col("r.status") == "ok", F.col("r.text")).otherwise(
                    F.lit("We will get back to you shortly.")).alias("answer"),
                F.when(F.col("r.status") == "ok", F.lit("llm")).otherwise(
                    F.lit("fallback")).alias("answer_source"))).alias("value"))
        return p.kafka_sink(answers, out_t, "answers").start()

    def feed_results() -> None:
        from confluent_kafka import Producer

        from sidecar.contract import RESULT_SCHEMA

        producer = Producer({"bootstrap.servers": p.bootstrap, "log_level": 0})
        row = {name: None for name in RESULT_SCHEMA.names}
        row |= {"request_id": "probe-r1", "status": "ok", "text": "Hello."}
        producer.produce(t, json.dumps(row).encode(), key=b"probe-r1")
        producer.flush(10)

    return p.probe("answers-projection", "Kafka results -> from_json -> answer/fallback "
                   "columns -> Kafka answers topic (the stateless answers query without its "
                   "Delta writes)", query, feed=feed_results, ran=p.has_records(out_t))


def run_probes(spark, bootstrap: str, sidecar, results_dir: Path, work: Path,
               interval: str) -> list[dict]:
    """Each part of the pipeline in Real-Time Mode (see the module doc)."""
    p = _Probes(spark, bootstrap, sidecar, work, interval)
    results = [_passthrough(spark, bootstrap, work, interval, p.tag, arrow=arrow)
               for arrow in (False, True)]
    results += [_submit_probe(p, "submit-mapInArrow", allow=True),
                _submit_probe(p, "submit-mapInArrow-allowlist-off", allow=False),
                _tagging_probe(p),
                _pandas_udf_probe(p, allow=True), _pandas_udf_probe(p, allow=False),
                _foreach_probe(p),
                _foreach_batch_probe(p, allow=True), _foreach_batch_probe(p, allow=False),
                _delta_probe(p), _answers_probe(p)]
    return results


# --------------------------------------------------------------------------- driver


def _machine() -> dict:
    import pyspark

    from benchmarks.cpu_accounting import reference_cpu_ms

    return {"platform": platform.platform(), "python": sys.version.split()[0],
            "cpus": os.cpu_count(), "pyspark": pyspark.__version__,
            "reference_cpu_ms": reference_cpu_ms(), "load_average": list(os.getloadavg())}


def run(opts: RealtimeOptions) -> dict:
    """Run every mode at every rate (and the probes); write and return the JSON."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from sidecar import ClientSecurity
    from spark_ext.session import session_scope
    from sts_harness.process import SidecarProcess, write_token_file

    unknown = set(opts.modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}; choose from {MODES}")
    out = Path(opts.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    # scratch (broker log, checkpoints, result files): a fresh folder, removed at the end
    work = Path(tempfile.mkdtemp(prefix="sts-realtime-"))
    doc: dict = {"kind": "realtime_mode", "options": asdict(opts), "simulation": True,
                 "machine": _machine(), "runs": [], "probes": []}
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)  # runs last
        if opts.kafka_bootstrap:
            bootstrap, cluster = opts.kafka_bootstrap, "external"
        else:
            from sts_harness.kafka_broker import KafkaBroker

            broker = stack.enter_context(KafkaBroker(work / f"kafka-{uuid.uuid4().hex[:6]}"))
            bootstrap, cluster = broker.bootstrap_servers, "local"
        doc["kafka"] = {"cluster": cluster, "bootstrap_servers": bootstrap}
        if "realtime-intake" in opts.modes:  # the sidecar subscribes at its start
            create_topics(bootstrap, [INTAKE_TOPIC], partitions=opts.partitions)
        token = write_token_file(work / "sidecar-token")
        results_dir = work / f"results-{uuid.uuid4().hex[:6]}"
        sidecar = stack.enter_context(SidecarProcess(
            results_dir, ["--config", str(Path(opts.sidecar_config).resolve()),
                          "--engine", "simulated", "--sidecar-id", "rtm-bench",
                          "--set", "results.flush_interval_s=0.05",
                          "--set", f"server.token_file={json.dumps(str(token))}",
                          *(["--set", f'intake.topic="{INTAKE_TOPIC}"',
                             "--set", f'intake.bootstrap_servers="{bootstrap}"']
                            if "realtime-intake" in opts.modes else [])],
            log_path=work / "sidecar.log", stop_timeout_s=30,
            security=ClientSecurity(token_file=str(token))))
        spark = stack.enter_context(session_scope("sts-realtime-mode"))
        print(f"realtime_mode: Kafka {bootstrap} ({cluster}), sidecar {sidecar.target} "
              f"(simulated), Spark {spark.version}", flush=True)
        for rate in opts.rates:
            for mode in opts.modes:
                try:
                    r = run_one(spark, bootstrap, sidecar, results_dir, work, mode, rate, opts)
                except Exception as e:  # noqa: BLE001 - recorded, the other runs go on
                    r = {"mode": mode, "rate": rate, "error": _first_line(str(e))}
                doc["runs"].append(r)
                _print_run(r)
                write_text_atomically(out, json.dumps(doc, indent=1))
        if opts.probe:
            doc["probes"] = run_probes(spark, bootstrap, sidecar, results_dir, work,
                                       opts.realtime_interval)
            for p in doc["probes"]:
                lat = p.get("latency_ms")
                print(f"probe {p['probe']:<34} {p['outcome']}"
                      + (f": {p['error']}" if p.get("error") else "")
                      + (f" (p50 {lat['p50']} p99 {lat['p99']} ms, {p['delivered']}/"
                         f"{p['offered']})" if lat else ""), flush=True)
    doc["machine_after"] = {k: v for k, v in _machine().items()
                            if k in ("reference_cpu_ms", "load_average")}
    write_text_atomically(out, json.dumps(doc, indent=1))
    print(f"wrote {out}", flush=True)
    return doc


def _print_run(r: dict) -> None:
    if "error" in r:
        print(f"{r['mode']:<22}{r['rate']:>7g}  error: {r['error']}", flush=True)
        return
    h = r["hops_ms"]["event -> sidecar received"]
    s = r["hops_ms"]["event -> submitted"]
    print(f"{r['mode']:<22}{r['rate']:>7g}{r['offered']:>8}{r['received']:>9}"
          f"  event->received p50 {h['p50']} p99 {h['p99']} max {h['max']} ms;"
          f" event->submitted p50 {s['p50']} p99 {s['p99']} ms", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.realtime_mode",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="50,200", help="comma-separated events/s")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of events per run")
    p.add_argument("--modes", default=",".join(MODES), help=f"subset of {','.join(MODES)}")
    p.add_argument("--realtime-interval", default="5 seconds")
    p.add_argument("--small-arrow-batch", type=int, default=1)
    p.add_argument("--small-buffer", type=int, default=1024)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--probe", action="store_true", help="also try the pipeline's other parts")
    p.add_argument("--kafka-bootstrap", help="brokers (default: a local broker)")
    p.add_argument("--sidecar-config", default="conf/sidecar-seed-sim.yaml")
    p.add_argument("--out", default="./sts-realtime/realtime_mode.json")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    run(RealtimeOptions(rates=[float(r) for r in a.rates.split(",") if r],
                        duration_s=a.duration, modes=[m for m in a.modes.split(",") if m],
                        realtime_interval=a.realtime_interval,
                        small_arrow_batch=a.small_arrow_batch, small_buffer=a.small_buffer,
                        partitions=a.partitions,
                        probe=a.probe, kafka_bootstrap=a.kafka_bootstrap,
                        sidecar_config=a.sidecar_config, out=a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
