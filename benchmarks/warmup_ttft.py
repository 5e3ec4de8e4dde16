"""TTFT of the first real requests after a sidecar starts, with and without warm-up.

Starts a fresh sidecar (real vLLM, the prepared SmolLM2, the pipeline's stable prefix as
``warmup.stable_prefixes``), sends ``--requests`` tickets one after the other through the
blocking ``Generate`` call, each prompt being the stable prefix plus the ticket (as the
Spark side builds them), and records each result's ``ttft_ms`` and ``cached_tokens``
(measured by the sidecar from receipt). One mode per run, so each run is one engine start.

Run::

    python -m benchmarks.warmup_ttft --mode cold --out benchmarks/results/warmup_ttft
    python -m benchmarks.warmup_ttft --mode warm --out benchmarks/results/warmup_ttft

``--standby-s N`` also measures a warm standby (issue 32): the sidecar left idle, loaded and
serving, for ``N`` seconds after its requests (what a released executor's sidecar does in
its orphan window, ``sidecar.orphan_exit_s``), then one more request. A scale-out onto a
cold GPU waits ``ready_s`` plus its first answer; onto a standby, that answer alone.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

TICKETS = [
    "My order #1042 has not arrived yet.", "I was charged twice for one subscription.",
    "How do I reset my password?", "The app crashes when I open settings.",
    "Can I change my delivery address?", "My discount code does not work.",
    "I want to cancel my plan.", "The invoice shows the wrong company name.",
    "Where can I download my receipts?", "The product arrived damaged.",
]


def run(mode: str, *, requests: int, max_tokens: int, stable: str,
        standby_s: float = 0.0) -> dict:
    """One fresh sidecar; the first ``requests`` TTFTs (ms) and cached prompt tokens, each
    answer's wall time from its call, and (``standby_s`` > 0) one more request after the
    sidecar stood idle that long."""
    from sidecar.contract import now_ms
    from sts_harness.process import SidecarProcess

    args = ["--engine", "vllm", "--sidecar-id", f"warmup-{mode}",
            "--set", f"warmup.enabled={json.dumps(mode == 'warm')}",
            "--set", f"warmup.stable_prefixes={json.dumps([stable])}",
            "--set", "scheduler.deadline_admission=false"]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        with SidecarProcess(Path(tmp) / "results", args, start_timeout_s=300,
                            stop_timeout_s=30) as sidecar:
            ready_s = time.monotonic() - started
            assert sidecar.client is not None

            def ask(i: int, name: str) -> dict:
                now, called = now_ms(), time.monotonic()
                result = sidecar.client.generate({
                    "request_id": f"{mode}-{name}", "priority": "high", "enqueue_ts": now,
                    "deadline_ts": now + 120_000, "max_tokens": max_tokens,
                    "temperature": 0.0,
                    "prompt": f"{stable}\nTicket: {TICKETS[i % len(TICKETS)]}"},
                    timeout_s=120)
                return {"ttft_ms": round(result.ttft_ms, 1),
                        "answer_ms": round((time.monotonic() - called) * 1000, 1),
                        "cached_tokens": result.cached_tokens,
                        "prompt_tokens": result.prompt_tokens, "status": result.status}

            rows = [ask(i, str(i)) for i in range(requests)]
            standby = None
            if standby_s > 0:
                time.sleep(standby_s)  # the standby: loaded, serving, nothing to do
                standby = {"idle_s": standby_s, **ask(requests, "after-standby")}
            log = sidecar.tail_log(100_000)
    warmup_line = next((line for line in log.splitlines() if "Warm-up:" in line), None)
    return {"mode": mode, "ready_s": round(ready_s, 1), "warmup_log": warmup_line,
            "requests": rows, "standby": standby,
            "scale_out_to_first_answer_s": {
                "cold_gpu": round(ready_s + rows[0]["answer_ms"] / 1000, 1) if rows else None,
                "warm_standby": round(standby["answer_ms"] / 1000, 3) if standby else None}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["cold", "warm"], required=True)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--standby-s", type=float, default=0.0,
                        help="then leave the sidecar idle this long and ask once more")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/warmup_ttft"))
    args = parser.parse_args(argv)
    from spark_ext.config import PipelineConfig

    stable = PipelineConfig.from_yaml("conf/pipeline.yaml").template.stable.strip()
    doc = run(args.mode, requests=args.requests, max_tokens=args.max_tokens, stable=stable,
              standby_s=args.standby_s)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"{args.mode}-standby" if args.standby_s > 0 else args.mode
    (args.out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n",
                                                encoding="utf-8")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
