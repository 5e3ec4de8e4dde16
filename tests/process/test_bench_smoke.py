"""A tiny `sts bench` run (simulated engine, seconds), the knee finder and `sts plan` wiring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from benchmarks.bench import BenchOptions, find_knee, run_bench
from sidecar.cli import main as sts_main
from tests.utils import REPO

pytestmark = pytest.mark.timeout(400)


def _curve(points: list[tuple[float, float, float]]) -> list[dict]:
    return [{"offered_rate": r, "llm_throughput_per_s": t, "latency_ms": {"p99": p}}
            for r, t, p in points]


def test_knee_is_the_last_rate_before_p99_turns_up() -> None:
    curve = _curve([(1, 1, 100), (2, 2, 120), (4, 4, 180), (8, 7.9, 900), (16, 8, 5000)])
    knee = find_knee(curve)
    assert knee["knee_rate"] == 4 and knee["first_bad_rate"] == 8
    # Throughput falling behind the offered rate is a knee too, even before P99 moves.
    knee = find_knee(_curve([(1, 1, 100), (2, 2, 110), (4, 3, 150)]))
    assert knee["knee_rate"] == 2 and "served" in knee["reason"]
    assert find_knee(_curve([(1, 1, 100), (2, 2, 100)]))["first_bad_rate"] is None
    # A P99 from a handful of answers is not the baseline; answers after the drain count.
    curve = _curve([(0.5, 0.5, 1000), (1, 1, 4000), (2, 2, 5000), (4, 3, 20000)])
    for c, n in zip(curve, (3, 25, 50, 90)):
        c["latency_ms"]["n"] = n
        c["offered"], c["llm_answers"] = n, n
    knee = find_knee(curve)
    assert knee["knee_rate"] == 2 and knee["first_bad_rate"] == 4 and "P99" in knee["reason"]


def test_plan_command_prints_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert sts_main(["plan", "--profile", "seed-200qps", "--tokens-per-s", "3400"]) == 0
    assert "GPUs" in capsys.readouterr().out


def test_bench_smoke_all_schemes_on_the_simulated_engine(tmp_path: Path, spark) -> None:
    """Seconds per scheme: every scheme answers, the JSON and the plots are written, and at
    an overload the blocking baseline keeps a backlog that STS does not."""
    profile = yaml.safe_load((REPO / "conf" / "profiles" / "cpu-small.yaml").read_text())
    profile["sla_ms"] = {"high": 1500, "normal": 2500, "low": 4000}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(profile))
    out = tmp_path / "bench"
    # ~2 requests/s for a one-at-a-time caller; 8/s offered.
    doc = run_bench(BenchOptions(
        profile=str(tmp_path / "tiny.yaml"), engine="simulated", rates=[8.0], duration_s=6.0,
        out=str(out),
        sidecar_args=["--set", "engine.simulated.max_num_seqs=4",
                      "--set", "engine.simulated.step_base_ms=20.0"]))
    saved = json.loads((out / "bench.json").read_text())
    assert saved["simulation"] is True and len(saved["runs"]) == 4
    for name in ("latency_vs_rate.png", "goodput_vs_rate.png", "backlog.png"):
        assert (out / name).stat().st_size > 10_000
    runs = {r["scheme"]: r for r in doc["runs"]}
    assert set(runs) == {"engine", "sts", "baseline-sync", "baseline-concurrent"}
    for r in runs.values():
        assert r["offered"] > 20 and r["answered"] > 0, r
    assert runs["sts"]["answered"] == runs["sts"]["offered"]  # fallback covers the rest
    assert runs["baseline-sync"]["final_backlog"] > runs["sts"]["final_backlog"] == 0
    # The blocking batch waits for the model; STS's submit batch does not.
    assert runs["baseline-sync"]["batch_s"]["p99"] > runs["sts"]["batch_s"]["p50"]
    # Where the answers micro-batches' time went, from the replay's start on.
    steps = runs["sts"]["answers_steps_ms"]
    assert steps["ledger"]["n"] == steps["total"]["n"] > 0
    assert 0 < steps["answers"]["n"] <= steps["total"]["n"]
    assert steps["total"]["p50"] >= steps["ledger"]["p50"] > 0
    # The pipeline's INFO lines go to the run's log, not between the table's rows.
    assert "INFO spark_ext.pipeline.sts_pipeline: Submit plan warmed up" in \
        (out / "bench.log").read_text()
    assert spark.sparkContext._jsc is not None, "the bench stopped the caller's session"


@pytest.mark.slow
def test_bench_smoke_sts_kafka_on_a_local_broker(tmp_path: Path, spark) -> None:
    """``sts-kafka`` end to end (~60-90 s on 2 cores): the bench starts a local broker and
    a second sidecar on the kafka result channel, events go through a topic, results come
    back on ``llm.result.{priority}``, every event is answered, and the topic hops are
    measured from the brokers' append times."""
    profile = yaml.safe_load((REPO / "conf" / "profiles" / "cpu-small.yaml").read_text())
    profile["sla_ms"] = {"high": 1500, "normal": 2500, "low": 4000}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(profile))
    doc = run_bench(BenchOptions(
        profile=str(tmp_path / "tiny.yaml"), engine="simulated", rates=[8.0], duration_s=4.0,
        out=str(tmp_path / "bench"), schemes=["sts-kafka"],
        sidecar_args=["--set", "engine.simulated.max_num_seqs=4",
                      "--set", "engine.simulated.step_base_ms=20.0"]))
    assert doc["kafka"]["cluster"] == "local"
    (run,) = doc["runs"]
    assert run["scheme"] == "sts-kafka" and run["offered"] > 10
    assert run["answered"] == run["offered"] and run["llm_answers"] > 0, run
    assert run["kafka"]["timestamps"] == {"events": "log_append_time",
                                          "results": "log_append_time"}
    hops = run["hops_ms"]
    # every answer the hops count (backfills are left out) was found on the events topic
    assert hops["event -> on events topic"]["n"] == hops["event -> submitted"]["n"] > 10
    assert hops["finished -> on result topic"]["n"] > 0
    assert hops["on result topic -> answer landed"]["p50"] >= 0
    assert doc["machine"]["reference_cpu_ms"] > 0
    assert spark.sparkContext._jsc is not None, "the bench stopped the caller's session"


def test_the_bench_waits_until_the_answered_events_are_on_the_answers_topic(
        kafka_broker, caplog: pytest.LogCaptureFixture) -> None:
    """The publisher trails the answers table, so the bench reads the answers topic only
    once every answered event is on it, or after its wait with a warning."""
    import logging
    import time

    from confluent_kafka import Producer

    from benchmarks.kafka_topics import create_topics
    from benchmarks.schemes import _wait_published

    class Pipeline:  # the stand-in a run checks while it waits
        checks = 0

        def check(self) -> None:
            self.checks += 1

    topic = "bench-answers-wait"
    create_topics(kafka_broker.bootstrap_servers, [topic])
    since = int(time.time() * 1000) - 1000
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    for key in ("e1", "e2"):
        producer.produce(topic, key=key, value=b"{}")
    producer.flush(30)
    pipeline = Pipeline()
    _wait_published(pipeline, kafka_broker.bootstrap_servers, topic, {"e1", "e2"},
                    since_ms=since, timeout_s=30)
    assert pipeline.checks == 0  # both there: no wait
    with caplog.at_level(logging.WARNING, logger="benchmarks.schemes"):
        _wait_published(pipeline, kafka_broker.bootstrap_servers, topic, {"e1", "e3"},
                        since_ms=since, timeout_s=1)
    assert "1 answered events not on bench-answers-wait after 1 s" in caplog.text


def test_bench_replays_a_trace_with_its_gaps_lengths_and_caps(tmp_path: Path) -> None:
    """``--trace`` on the simulated engine (the engine scheme, no Spark): the trace's
    requests at the offered rate, in its order, each output as its ``max_tokens``, and
    the one beyond the cap counted."""
    trace = tmp_path / "mine.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": i * 0.5, "input_tokens": 40,
                                         "output_tokens": 300 if i == 3 else 5 + i}) + "\n"
                             for i in range(20)))
    out = tmp_path / "bench"
    doc = run_bench(BenchOptions(
        profile="cpu-small", engine="simulated", rates=[4.0], duration_s=2.5, out=str(out),
        schemes=["engine"], trace=str(trace), trace_max_output_tokens=64))
    rates = doc["trace"]["rates"]["4.0"]
    assert rates["requests"] == 10 and rates["outputs_capped"] == 1, rates
    (run,) = doc["runs"]
    assert run["offered"] == 10 and run["answered"] == 10, run
