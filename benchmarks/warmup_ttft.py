"""TTFT of the first real requests after a sidecar starts, with and without warm-up.

Starts a fresh sidecar (real vLLM, the prepared SmolLM2, the pipeline's stable prefix as
``warmup.stable_prefixes``), sends ``--requests`` tickets one after the other through the
blocking ``Generate`` call, each prompt being the stable prefix plus the ticket (as the
Spark side builds them), and records each result's ``ttft_ms`` and ``cached_tokens``
(measured by the sidecar from receipt). One mode per run, so each run is one engine start.

Run::

    python -m benchmarks.warmup_ttft --mode cold --out benchmarks/results/warmup_ttft
    python -m benchmarks.warmup_ttft --mode warm --out benchmarks/results/warmup_ttft
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


def run(mode: str, *, requests: int, max_tokens: int, stable: str) -> dict:
    """One fresh sidecar; the first ``requests`` TTFTs (ms) and cached prompt tokens."""
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
            rows = []
            for i in range(requests):
                now = now_ms()
                result = sidecar.client.generate({
                    "request_id": f"{mode}-{i}", "priority": "high", "enqueue_ts": now,
                    "deadline_ts": now + 120_000, "max_tokens": max_tokens,
                    "temperature": 0.0,
                    "prompt": f"{stable}\nTicket: {TICKETS[i % len(TICKETS)]}"},
                    timeout_s=120)
                rows.append({"ttft_ms": round(result.ttft_ms, 1),
                             "cached_tokens": result.cached_tokens,
                             "prompt_tokens": result.prompt_tokens, "status": result.status})
            log = sidecar.tail_log(100_000)
    warmup_line = next((line for line in log.splitlines() if "Warm-up:" in line), None)
    return {"mode": mode, "ready_s": round(ready_s, 1), "warmup_log": warmup_line,
            "requests": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["cold", "warm"], required=True)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/warmup_ttft"))
    args = parser.parse_args(argv)
    from spark_ext.config import PipelineConfig

    stable = PipelineConfig.from_yaml("conf/pipeline.yaml").template.stable.strip()
    doc = run(args.mode, requests=args.requests, max_tokens=args.max_tokens, stable=stable)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.mode}.json").write_text(json.dumps(doc, indent=2) + "\n",
                                                encoding="utf-8")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
