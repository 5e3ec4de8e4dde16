"""``sts bench``: STS against the blocking-foreachBatch baseline over a ladder of rates,
and ``sts bench --knee``: the sidecar's own throughput/latency curve and its knee.

One sidecar process and one SparkSession serve every run, so all schemes meet the
same engine (``sts-kafka`` gets a second sidecar with the same flags on the ``kafka``
result channel, and a local broker unless ``--kafka-bootstrap`` names a cluster). Each (rate, scheme) run replays the same generated events (one seed
per rate) for ``duration_s``, then waits for the answers (up to the largest SLA
plus 5 s; STS then closes its join windows). Writes ``bench.json`` and PNG plots
into ``out``, and prints progress and a table while it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.cli_args import DEFAULT_SCHEMES, KAFKA_SCHEMES, SCHEMES
from benchmarks.generate import from_trace, generate
from sts_capacity.profiles import TrafficProfile, load_profile
from benchmarks.schemes import RTM_REQUESTS_TOPIC, KafkaPath, RunContext, run_scheme
from sidecar import ConfigError, write_text_atomically
from sts_harness.hops import format_hops
from sts_harness.log_file import log_to_file

#: Knee: the first rate where P99 exceeds this multiple of the baseline rate's P99,
#: or where the share of requests answered falls below ``KNEE_THROUGHPUT`` times the
#: share answered at the baseline rate (the lowest rate with enough answers).
KNEE_P99_FACTOR = 3.0
KNEE_THROUGHPUT = 0.9


@dataclass
class BenchOptions:
    """What ``sts bench`` runs."""

    profile: str = "cpu-small"
    """Profile name (``conf/profiles/<name>.yaml``) or path."""

    engine: str = "vllm"
    """``vllm`` (the prepared SmolLM2 unless ``model``) or ``simulated``."""

    model: str | None = None
    rates: list[float] = field(default_factory=list)
    """Offered events/s; empty = the profile's rate x 0.5, 1, 2, 4."""

    duration_s: float = 30.0
    schemes: list[str] = field(default_factory=lambda: list(DEFAULT_SCHEMES))
    """Of :data:`~benchmarks.cli_args.SCHEMES`; ``sts-kafka`` only when named."""
    trigger_s: float = 0.0
    """Micro-batch trigger of every query, seconds; 0 = as fast as possible."""
    out: str = "./sts-bench"
    knee: bool = False
    sidecar_config: str | None = None
    """``sts sidecar --config`` file (default: ``conf/sidecar.yaml``)."""

    sidecar_args: list[str] = field(default_factory=list)
    """Extra ``sts sidecar`` flags (e.g. ``--set engine.simulated.replicas=8``)."""

    seed: int = 0
    writer: str = "auto"
    """``output.writer`` of the Spark schemes (``auto``: Delta on Spark here, as a user gets)."""
    kafka_bootstrap: str | None = None
    """``sts-kafka``: the brokers to use; ``None``: a local broker the bench starts in
    ``<out>/work/kafka`` (labelled ``local`` in the results)."""
    kafka_results_reader: str = "driver"
    """``sts-kafka``: ``kafka.results_reader`` of its pipeline (``driver`` or ``spark``)."""
    trace: str | None = None
    """A production trace (``sts_capacity.trace``) replayed instead of the profile's
    arrivals and lengths: scaled to each rate, its first ``duration_s`` seconds."""
    trace_max_input_tokens: int | None = None
    trace_max_output_tokens: int | None = None
    """The trace's lengths cut to these (an engine's context), counted in the results."""
    cpu_split: str = "auto"
    """How the real engine on the CPU shares this machine with Spark, the same for every
    scheme: ``pinned`` (Spark's JVM, its Python workers and the bench's own clients on
    every CPU but CPU 0, where vLLM's CPU backend binds its decode thread, Spark at nice
    +10; as on a GPU node, the decode never shares its core with Spark), ``shared`` (no
    affinity, as a CPU user who starts both meets it), ``auto`` (``pinned`` where it can
    be: the ``vllm`` engine on the CPU of a machine with more than one CPU)."""
    answers_topic: str | None = None
    """The Kafka schemes also publish their answers on a topic (``answers.topic``):
    ``microbatch`` (from the answers' change feed) or ``realtime`` (the model's answers
    from the result topic in Real-Time Mode, ``output.triggers.publish: realtime``)."""


def _machine() -> dict:
    from benchmarks.cpu_accounting import reference_cpu_ms

    return {"platform": platform.platform(), "python": sys.version.split()[0],
            "cpus": os.cpu_count(), "processor": platform.processor(),
            "reference_cpu_ms": reference_cpu_ms(), "load_average": list(os.getloadavg())}


def _offered(opts: BenchOptions, profile: TrafficProfile, rate: float, seed: int,
             doc: dict) -> list:
    """The requests of one rate: the profile's, or the trace's (its caps reported in
    ``doc["trace"]`` and printed)."""
    if not opts.trace:
        return generate(profile.with_rate(rate), opts.duration_s, seed=seed)
    from sts_capacity.trace import read_trace

    requests, caps = from_trace(read_trace(opts.trace), profile, rate=rate,
                                duration_s=opts.duration_s, seed=seed,
                                max_input_tokens=opts.trace_max_input_tokens,
                                max_output_tokens=opts.trace_max_output_tokens)
    doc.setdefault("trace", {"file": opts.trace, "rates": {},
                             "output_lengths": "forced (engine.ignore_eos)"})["rates"][
        str(rate)] = {"requests": len(requests), **asdict(caps)}
    print(f"trace {Path(opts.trace).name} at {rate:g}/s: {len(requests)} requests in "
          f"{opts.duration_s:g} s; cut to the caps: {caps.inputs_capped} prompts, "
          f"{caps.outputs_capped} outputs", flush=True)
    return requests


def _rates(opts: BenchOptions, profile: TrafficProfile) -> list[float]:
    if opts.rates:
        return sorted(opts.rates)
    base = profile.arrivals.rate_per_s
    if opts.trace:
        from sts_capacity.trace import read_trace

        base = round(read_trace(opts.trace).mean_rate, 3)
    factors = (0.25, 0.5, 1, 1.5, 2, 3, 4) if opts.knee else (0.5, 1, 2, 4)
    return [round(base * f, 3) for f in factors]


#: Marks ``<out>/work`` as the bench's own scratch folder: only such a folder is replaced.
_WORK_MARKER = ".sts-bench-work"

#: The P99 baseline is the lowest rate with at least this many answers (fewer is noise).
KNEE_MIN_SAMPLES = 20


def find_knee(curve: list[dict]) -> dict:
    """The safe water level: the highest rate before P99 turns sharply upward or the
    engine stops keeping up (see :data:`KNEE_P99_FACTOR`, :data:`KNEE_THROUGHPUT`).

    "Keeping up" is LLM answers over offered requests (after the drain), or the
    in-window throughput over the offered rate when the run has no answer count,
    relative to the same share at the baseline rate (deadline-aware admission sheds
    a few long requests even when idle).
    """
    points = sorted((c for c in curve if c["latency_ms"]["p99"] is not None),
                    key=lambda c: c["offered_rate"])
    if not points:
        return {"knee_rate": None, "reason": "no answers"}
    base_point = next((c for c in points
                       if c["latency_ms"].get("n", KNEE_MIN_SAMPLES) >= KNEE_MIN_SAMPLES),
                      points[0])
    base = base_point["latency_ms"]["p99"]

    def served(c: dict) -> float:
        if "llm_answers" in c and c.get("offered"):
            return c["llm_answers"] / c["offered"]
        return c["llm_throughput_per_s"] / c["offered_rate"] if c["offered_rate"] else 1.0

    base_served = served(base_point) or 1.0
    safe = None
    for c in points:
        share = served(c) / base_served
        if c["offered_rate"] > base_point["offered_rate"] and \
                c["latency_ms"]["p99"] > KNEE_P99_FACTOR * base:
            return {"knee_rate": safe, "first_bad_rate": c["offered_rate"],
                    "reason": f"P99 {c['latency_ms']['p99']:.0f} ms > {KNEE_P99_FACTOR:g} x "
                              f"{base:.0f} ms (P99 at {base_point['offered_rate']:g}/s)"}
        if c["offered_rate"] > base_point["offered_rate"] and share < KNEE_THROUGHPUT:
            return {"knee_rate": safe, "first_bad_rate": c["offered_rate"],
                    "reason": f"served {served(c):.0%} of the offered requests, "
                              f"{share:.0%} of the share served at "
                              f"{base_point['offered_rate']:g}/s"}
        safe = c["offered_rate"]
    return {"knee_rate": safe, "first_bad_rate": None, "reason": "no knee within the ladder"}


def _sidecar_args(opts: BenchOptions, sidecar_id: str | None = None) -> list[str]:
    args = ["--engine", opts.engine, "--sidecar-id", sidecar_id or f"bench-{opts.engine}",
            "--set", "results.flush_interval_s=0.05"]
    if opts.sidecar_config:
        args = ["--config", str(Path(opts.sidecar_config).resolve()), *args]
    if opts.model:
        args += ["--model", opts.model]
    if opts.trace:  # the trace's output lengths hold on a real engine too
        args += ["--set", "engine.ignore_eos=true"]
    return args + list(opts.sidecar_args)


def steps_line(steps: dict[str, dict]) -> str:
    """One line of where the answers micro-batches' time went: each step's P50 (ms) and,
    for a step not in every micro-batch, in how many it ran.

    Example:
        >>> steps_line({"ledger": {"n": 29, "p50": 383.0}, "answers": {"n": 29, "p50": 250.4},
        ...             "results": {"n": 3, "p50": 130.0}, "total": {"n": 29, "p50": 640.0}})
        'answers micro-batch P50 ms (29): ledger 383, answers 250, results 130 (in 3), total 640'
    """
    total = steps.get("total", {}).get("n") or max(v["n"] for v in steps.values())
    parts = [f"{step} {v['p50']:.0f}" + (f" (in {v['n']})" if v["n"] < total else "")
             for step, v in steps.items() if v.get("p50") is not None]
    return f"answers micro-batch P50 ms ({total}): " + ", ".join(parts)


def _row(r: dict) -> str:
    lat = r["latency_ms"]
    p50 = f"{lat['p50']:.0f}" if lat["p50"] is not None else "-"
    p99 = f"{lat['p99']:.0f}" if lat["p99"] is not None else "-"
    return (f"{r['scheme']:<20}{r['offered_rate']:>7.2f}{r['offered']:>8}{r['answered']:>9}"
            f"{(r['goodput'] or 0):>9.0%}{(r['on_time_rate'] or 0):>9.0%}"
            f"{r['llm_throughput_per_s']:>8.2f}{p50:>9}{p99:>9}{r['final_backlog']:>9}")


HEADER = (f"{'scheme':<20}{'rate':>7}{'offered':>8}{'answered':>9}{'goodput':>9}{'on time':>9}"
          f"{'llm/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'backlog':>9}")


def run_bench(opts: BenchOptions) -> dict:
    """Run the benchmark; return (and write) the result document."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from benchmarks.plots import plot_bench
    from sidecar import ClientSecurity
    from sts_harness.process import SidecarProcess, write_token_file

    profile = load_profile(opts.profile)
    split = resolve_cpu_split(opts.cpu_split, opts.engine)  # refused before anything is made
    out = Path(opts.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    if work.exists():
        if not (work / _WORK_MARKER).exists():
            raise ConfigError(f"{work} exists and was not made by sts bench; "
                              "choose another folder (--out)")
        shutil.rmtree(work)  # an earlier run's scratch folder (it holds our marker)
    work.mkdir()
    (work / _WORK_MARKER).write_text("scratch folder of sts bench\n", encoding="utf-8")
    schemes = ["engine"] if opts.knee else list(opts.schemes)
    rates = _rates(opts, profile)
    doc: dict = {"kind": "knee" if opts.knee else "bench", "options": asdict(opts),
                 "profile": profile.name, "engine": opts.engine, "machine": _machine(),
                 "simulation": opts.engine == "simulated", "runs": []}
    if opts.engine == "vllm" and not opts.model:
        from sidecar import prepare_default_model

        prepare_default_model()
    spark = None
    log = out / "bench.log"
    print(f"sts bench: profile {profile.name}, engine {opts.engine}, rates {rates}, "
          f"schemes {schemes}, {opts.duration_s:.0f} s each; log {log}", flush=True)
    with contextlib.ExitStack() as stack:
        log_to_file(stack, log)  # the pipeline's INFO lines there, not between the rows
        token_file = write_token_file(work / "sidecar-token")  # as a deployment would run
        sidecar = stack.enter_context(SidecarProcess(
            work / "results",
            [*_sidecar_args(opts), "--set", f"server.token_file={json.dumps(str(token_file))}"],
            log_path=out / "sidecar.log", stop_timeout_s=30,
            security=ClientSecurity(token_file=str(token_file))))
        assert sidecar.client is not None
        kafka = _kafka_path(stack, opts, out, work, token_file) \
            if set(KAFKA_SCHEMES) & set(schemes) else None
        if kafka is not None:
            doc["kafka"] = {"cluster": kafka.cluster, "bootstrap_servers": kafka.bootstrap_servers,
                            "results_reader": kafka.results_reader,
                            "sidecar": "a second sidecar, the same flags plus the kafka "
                                       "result channel; idle while the other schemes run"}
        doc["cpu_split"] = _apply_cpu_split(stack, split)
        if any(s != "engine" for s in schemes):
            from spark_ext.session import session_scope
            from sts_harness.demo import in_thread_at_niceness

            # Spark stops before the sidecar; an active session (notebook, tests) is kept.
            spark = in_thread_at_niceness(
                lambda: stack.enter_context(session_scope("sts-bench")),
                doc["cpu_split"]["spark_niceness"])
        ctx = RunContext(client=sidecar.client, results_dir=work / "results", work_dir=work,
                         profile=profile, duration_s=opts.duration_s, trigger_s=opts.trigger_s,
                         spark=spark, kafka=kafka, writer=opts.writer)
        print(HEADER, flush=True)
        for i, rate in enumerate(rates):
            requests = _offered(opts, profile, rate, opts.seed + i, doc)
            for scheme in schemes:
                started = time.monotonic()
                result = run_scheme(scheme, ctx, rate, requests)
                result["wall_s"] = round(time.monotonic() - started, 1)
                result["load_average_after"] = list(os.getloadavg())
                doc["runs"].append(result)
                print(_row(result), flush=True)
                if result.get("hops_ms"):
                    print("\n".join("    " + line for line in format_hops(result["hops_ms"])),
                          flush=True)
                if result.get("answers_steps_ms"):
                    print("    " + steps_line(result["answers_steps_ms"]), flush=True)
                if result.get("goodput_readable") is not None:
                    print(f"    goodput with the row readable by its deadline (its commit): "
                          f"{result['goodput_readable']:.1%}", flush=True)
                write_text_atomically(out / "bench.json", json.dumps(doc, indent=1))
    doc["machine_after"] = {k: v for k, v in _machine().items()
                            if k in ("reference_cpu_ms", "load_average")}
    if opts.knee:
        doc["knee"] = find_knee([r for r in doc["runs"] if r["scheme"] == "engine"])
        print(f"knee (safe water level): {doc['knee']}", flush=True)
    doc["plots"] = [str(p) for p in plot_bench(doc, profile, out)]
    write_text_atomically(out / "bench.json", json.dumps(doc, indent=1))
    print(f"wrote {out / 'bench.json'} and {len(doc['plots'])} plots", flush=True)
    return doc


CPU_SPLITS: tuple[str, ...] = ("auto", "pinned", "shared")


def resolve_cpu_split(split: str, engine: str) -> dict:
    """``--cpu-split`` made concrete for ``engine`` on this machine: ``{"mode": "pinned",
    "spark_cpus": [...]}`` or ``{"mode": "shared", "spark_cpus": None}``; a
    :class:`~sidecar.ConfigError` for ``pinned`` where nothing can be kept apart."""
    from sts_harness.demo import spark_cpus

    if split not in CPU_SPLITS:
        raise ConfigError(f"--cpu-split {split!r} must be one of {', '.join(CPU_SPLITS)}")
    cpus = spark_cpus(engine)
    if split == "pinned" and cpus is None:
        raise ConfigError(f"--cpu-split pinned needs the vllm engine on the CPU of a machine "
                          f"with more than one CPU (engine {engine!r} here); use shared or auto")
    if split == "shared" or cpus is None:
        return {"mode": "shared", "spark_cpus": None}
    return {"mode": "pinned", "spark_cpus": sorted(cpus)}


def _apply_cpu_split(stack: contextlib.ExitStack, split: dict) -> dict:
    """Pin this process (the bench's clients, and the Spark it starts next) to
    ``split["spark_cpus"]`` until ``stack`` closes; the sidecars started before keep every
    CPU. Returns what ``bench.json`` records under ``cpu_split``."""
    from sts_harness.demo import SPARK_NICENESS

    if split["mode"] != "pinned":
        print("CPU split: shared (the engine, Spark and the clients on every CPU)", flush=True)
        return {**split, "engine_cpus": None, "spark_niceness": 0}
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, split["spark_cpus"])
    stack.callback(os.sched_setaffinity, 0, previous)
    engine_cpus = sorted(previous - set(split["spark_cpus"]))
    print(f"CPU split: pinned (the engine's decode on CPUs {engine_cpus}; Spark at nice "
          f"+{SPARK_NICENESS} and the bench's clients on CPUs {split['spark_cpus']})", flush=True)
    return {**split, "engine_cpus": engine_cpus, "spark_niceness": SPARK_NICENESS}


def _kafka_path(stack: contextlib.ExitStack, opts: BenchOptions, out: Path, work: Path,
                token_file: Path):
    """The ``sts-kafka`` scheme's cluster (``--kafka-bootstrap``, else a local broker
    started on ``stack``) and its own sidecar: the same flags as the first one plus the
    ``kafka`` result channel, so both schemes meet the same engine settings."""
    from sidecar import ClientSecurity
    from sts_harness.demo import kafka_results_args
    from sts_harness.process import SidecarProcess

    if opts.kafka_bootstrap:
        bootstrap, cluster = opts.kafka_bootstrap, "external"
    else:
        from sts_harness.kafka_broker import KafkaBroker

        broker = stack.enter_context(KafkaBroker(work / "kafka"))
        bootstrap, cluster = broker.bootstrap_servers, "local"
    print(f"sts-kafka: Kafka cluster {bootstrap} ({cluster}"
          f"{', started by sts bench' if cluster == 'local' else ''}); a second sidecar on "
          "the kafka result channel", flush=True)
    sidecar = stack.enter_context(SidecarProcess(
        work / "results-kafka",
        [*_sidecar_args(opts, f"bench-{opts.engine}-kafka"),
         "--set", f"server.token_file={json.dumps(str(token_file))}",
         *kafka_results_args(bootstrap),
         # sts-kafka-rtm's requests (an idle topic for sts-kafka)
         "--set", f"intake.topic={json.dumps(RTM_REQUESTS_TOPIC)}"],
        log_path=out / "sidecar-kafka.log", stop_timeout_s=30,
        security=ClientSecurity(token_file=str(token_file))))
    assert sidecar.client is not None
    return KafkaPath(client=sidecar.client, bootstrap_servers=bootstrap, cluster=cluster,
                     results_reader=opts.kafka_results_reader,
                     answers_topic=opts.answers_topic)


def run_bench_command(args: argparse.Namespace) -> int:
    """Entry point of ``sts bench``."""
    opts = BenchOptions(
        profile=args.profile, engine=args.engine, model=args.model,
        rates=[float(r) for r in args.rates.split(",")] if args.rates else [],
        duration_s=args.duration, schemes=[s for s in args.schemes.split(",") if s],
        trigger_s=args.trigger, out=args.out, knee=args.knee,
        sidecar_config=args.sidecar_config, sidecar_args=args.sidecar_args, seed=args.seed,
        kafka_bootstrap=args.kafka_bootstrap, writer=args.writer,
        kafka_results_reader=args.kafka_results_reader, answers_topic=args.answers_topic,
        trace=args.trace, trace_max_input_tokens=args.trace_max_input_tokens,
        trace_max_output_tokens=args.trace_max_output_tokens, cpu_split=args.cpu_split)
    unknown = set(opts.schemes) - set(SCHEMES)
    if unknown:
        raise ConfigError(f"unknown schemes {sorted(unknown)}; choose from {SCHEMES} (--schemes)")
    if opts.answers_topic == "realtime" and "sts-kafka-rtm" in opts.schemes:
        raise ConfigError("--answers-topic realtime runs with sts-kafka only: with sts-kafka-rtm "
                          "two real-time queries would hold both task slots of local[2] and "
                          "the answers query none")
    run_bench(opts)
    return 0
