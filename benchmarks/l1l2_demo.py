"""L1+L2 on vs off in the demo: submit micro-batch duration, answers without the LLM,
prefix-cache hit rate (CLI).

Runs ``sts demo`` (:func:`sts_harness.demo.run_demo`) once per rate and setting, one
after the other, and prints one row each: the submit query's micro-batch duration
(P50/P99 of the batches with input), "event -> submitted" P50, the share of answers that
needed no LLM (``rule`` + ``kb``), the LLM answers and the prefix-cache hit rate::

    python -m benchmarks.l1l2_demo --engine simulated --rates 3,50 --duration 20
    python -m benchmarks.l1l2_demo --engine vllm --rates 3 --duration 40   # hit rates

Each run writes into ``--out/<engine>-<rate>-<on|off>`` (an earlier run's folder is
replaced); the rows go to ``--out/l1l2_demo.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sidecar import ENGINES
from sts_harness.demo import DemoOptions, run_demo


def measure(engine: str, rate: float, duration: float, l1l2: bool, out: Path) -> dict:
    """One demo run; its figures of interest."""
    folder = out / f"{engine}-{rate:g}-{'on' if l1l2 else 'off'}"
    s = run_demo(DemoOptions(rate=rate, duration=duration, out=str(folder), engine=engine,
                             l1l2=l1l2, overwrite=True))
    by = s["answers_by_source"]
    submit = s["batch_ms"].get("sts-submit", {})
    return {"engine": engine, "rate": rate, "l1l2": l1l2, "events": s["events"],
            "submit_batch_p50_ms": submit.get("p50"), "submit_batch_p99_ms": submit.get("p99"),
            "submit_batches": submit.get("n"),
            "event_to_submitted_p50_ms": s["hops_ms"]["event -> submitted"]["p50"],
            "without_llm": (by.get("rule", 0) + by.get("kb", 0)) / max(1, s["answers"]),
            "answers_by_source": by, "retrieval": s["retrieval"],
            "llm_within_sla": {p: v["share"] for p, v in s["llm_within_sla"].items()},
            "prefix_cache_hit_rate": s["prefix_cache_hit_rate"],
            "incomplete": s["incomplete"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.l1l2_demo", description=__doc__)
    ap.add_argument("--engine", choices=ENGINES.names, default="simulated")
    ap.add_argument("--rates", default="3,50", help="events/s, comma-separated")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--settings", default="off,on", help="L1+L2 off and/or on")
    ap.add_argument("--out", default="./sts-l1l2-demo")
    args = ap.parse_args(argv)
    out = Path(args.out)
    rows = []
    try:
        rates = [float(r) for r in args.rates.split(",")]
    except ValueError:
        ap.error(f"--rates {args.rates!r}: give events/s, comma-separated (e.g. 3,50)")
    for rate in rates:
        for setting in args.settings.split(","):
            rows.append(measure(args.engine, rate, args.duration, setting == "on", out))
            r = rows[-1]
            print(f"BENCH {args.engine} rate {rate:g}/s L1+L2 {setting}: submit batch P50 "
                  f"{r['submit_batch_p50_ms']} ms P99 {r['submit_batch_p99_ms']} ms "
                  f"(n {r['submit_batches']}), event->submitted P50 "
                  f"{r['event_to_submitted_p50_ms']} ms, without LLM {r['without_llm']:.0%}, "
                  f"by source {r['answers_by_source']}, LLM within SLA "
                  f"{r['llm_within_sla']}, prefix-cache hit rate {r['prefix_cache_hit_rate']}",
                  flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "l1l2_demo.json").write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
