"""Arguments of the benchmarks' ``sts`` subcommands, kept apart from the benchmark
code so that building the ``sts`` parser imports nothing heavy."""

from __future__ import annotations

import argparse

from sidecar import ENGINES
from spark_ext.kinds import writer_choices

SCHEMES: tuple[str, ...] = ("engine", "sts", "sts-kafka", "sts-kafka-rtm", "baseline-sync",
                             "baseline-concurrent")
#: The schemes on Kafka (their own sidecar on the ``kafka`` result channel and a broker).
KAFKA_SCHEMES: tuple[str, ...] = ("sts-kafka", "sts-kafka-rtm")
#: What ``sts bench`` runs without ``--schemes`` (the Kafka ones need a broker: name them).
DEFAULT_SCHEMES: tuple[str, ...] = ("engine", "sts", "baseline-sync", "baseline-concurrent")


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``sts bench``."""
    p.add_argument("--profile", default="cpu-small", help="conf/profiles/<name>.yaml or a path")
    p.add_argument("--engine", choices=ENGINES.names, default=ENGINES.default)
    p.add_argument("--model", help="model folder (default: prepared SmolLM2)")
    p.add_argument("--rates", help="comma-separated offered events/s (default: profile x 0.5..4)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds per run")
    p.add_argument("--schemes", default=",".join(DEFAULT_SCHEMES),
                   help=f"comma-separated subset of {','.join(SCHEMES)} (default: all but "
                        "sts-kafka and sts-kafka-rtm: its submit query in Real-Time Mode)")
    p.add_argument("--trigger", type=float, default=0.0,
                   help="micro-batch trigger of every query, seconds (0: as fast as possible)")
    p.add_argument("--out", default="./sts-bench", help="output folder (bench.json, *.png)")
    p.add_argument("--knee", action="store_true",
                   help="sidecar alone over a finer ladder; report the P99 knee")
    p.add_argument("--sidecar-config", help="sidecar YAML (default conf/sidecar.yaml)")
    p.add_argument("--sidecar-arg", action="append", default=[], dest="sidecar_args",
                   help="extra `sts sidecar` argument (repeat), e.g. --sidecar-arg=--set "
                        "--sidecar-arg=engine.simulated.replicas=8")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--writer", choices=writer_choices(), default="auto",
                   help="output.writer of the Spark schemes (auto: Delta on Spark where its "
                        "classes load, as a user gets)")
    p.add_argument("--kafka-bootstrap", metavar="HOST:PORT[,...]",
                   help="sts-kafka: the Kafka cluster to use (default: a local broker the "
                        "bench starts, labelled local)")
    p.add_argument("--answers-topic", nargs="?", const="microbatch",
                   choices=["microbatch", "realtime"],
                   help="sts-kafka, sts-kafka-rtm: publish the answers on a topic of each run "
                        "(answers.topic; needs Delta on Spark) and report event -> on answers "
                        "topic; realtime (sts-kafka only: a real-time query holds a task slot "
                        "per result partition): the model's answers from the result topic in "
                        "Real-Time Mode (output.triggers.publish: realtime, validation off, "
                        "one result topic)")
    p.add_argument("--trace", metavar="FILE",
                   help="replay a production trace (.csv as the Azure LLM inference trace, or "
                        ".jsonl) instead of the profile's arrivals and lengths: scaled to each "
                        "rate (default: its own mean rate x 0.5..4), its first --duration "
                        "seconds; the profile gives the SLAs, the priority mix and the prefix")
    p.add_argument("--trace-max-input-tokens", type=int, metavar="N",
                   help="--trace: cut longer prompts to N tokens (an engine's context); "
                        "counted in bench.json")
    p.add_argument("--trace-max-output-tokens", type=int, metavar="N",
                   help="--trace: cut longer outputs to N tokens; counted in bench.json")
    p.add_argument("--cpu-split", choices=["auto", "pinned", "shared"], default="auto",
                   help="the real engine on the CPU, for every scheme alike: pinned (Spark and "
                        "the bench's clients off CPU 0, where vLLM decodes, Spark at nice +10: "
                        "as on a GPU node), shared (no affinity, as a CPU user meets it); auto "
                        "(default): pinned where it can be; recorded in bench.json")
    p.add_argument("--kafka-results-reader", choices=["driver", "spark"], default="driver",
                   help="sts-kafka: kafka.results_reader, who reads the result and ack topics "
                        "(default: driver, one consumer on the driver; spark: Spark's Kafka "
                        "source)")


def positive_ints(parser: argparse.ArgumentParser, flag: str, text: str) -> list[int]:
    """``"1,64,512"`` -> ``[1, 64, 512]``; a usage error (exit 2) naming ``flag`` when a
    part is not an integer >= 1 or there is none.

    Example:
        >>> positive_ints(argparse.ArgumentParser(), "--sizes", "10,200")
        [10, 200]
    """
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        parser.error(f"{flag} must be comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        parser.error(f"{flag} must be integers >= 1, got {text!r}")
    return values
