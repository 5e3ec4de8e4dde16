"""The real engine's speed on this CPU, setting by setting (issue 31, item 4).

Starts ``sts sidecar --engine vllm`` (the prepared SmolLM2) once per variant and reads
the warm-up's calibration from ``GetStats``: time to first token and per output token
alone and at the full batch (8), and the demo's capacity from them
(:func:`sts_harness.demo_sizing.size_demo`: model requests/s at answers of 48 tokens).

Variants (``--variants``, comma-separated; each is environment variables plus engine
arguments; the sidecar otherwise runs as ``sts demo`` starts it):

* ``default``: as shipped (:func:`sidecar.engines.vllm.cpu_dtype`: bfloat16 on a CPU
  with AVX512-BF16, else float32; vLLM's automatic thread binding: on 2 CPUs one OpenMP
  thread, the other CPU kept for vLLM's scheduler process);
* ``fp32``: ``dtype=float32`` (the default before bfloat16 was chosen where it runs);
* ``two-threads``: ``VLLM_CPU_OMP_THREADS_BIND=0-1`` (both CPUs decode);
* ``avx2``: ``ATEN_CPU_CAPABILITY=avx2`` and ``ONEDNN_MAX_CPU_ISA=AVX2``: PyTorch's and
  oneDNN's kernels limited to AVX2, the code paths of an AVX2-only CPU on this one
  (float32, as the default picks there);
* ``avx2-two-threads``: the two together; ``avx2-bf16``: bfloat16 forced on AVX2 kernels.

Example:
    python -m benchmarks.engine_speed --variants default,avx2,avx2-bf16
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from benchmarks.cpu_accounting import machine_info
from sidecar import write_text_atomically
from sts_harness.demo_sizing import full_batch_speed, sizing_from_stats, speeds_from_stats
from sts_harness.process import SidecarProcess, SidecarStartError

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "engine_speed.json"
_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
_TWO = {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}
_BF16 = ["--engine-arg", "dtype=bfloat16"]
#: name -> (environment, extra sidecar arguments)
VARIANTS: dict[str, tuple[dict[str, str], list[str]]] = {
    "default": ({}, []),
    "fp32": ({}, ["--engine-arg", "dtype=float32"]),
    "two-threads": (_TWO, []),
    "avx2": (_AVX2, []),
    "avx2-two-threads": (_AVX2 | _TWO, []),
    "avx2-bf16": (_AVX2, _BF16),
}


def _why(log_tail: str) -> str:
    """The last line of a failed start's log that names an error."""
    lines = [ln.strip() for ln in log_tail.splitlines() if "Error" in ln or "error" in ln]
    return lines[-1][-300:] if lines else "no error line in the log"


def measure(name: str, tmp: Path) -> dict:
    """One sidecar start with variant ``name``: its calibration and start time, or why
    it did not start."""
    env, args = VARIANTS[name]
    started = time.monotonic()
    try:
        # the variant's variables in this process for the sidecar child to inherit
        with mock.patch.dict(os.environ, env), SidecarProcess(
                tmp / name / "results", ["--engine", "vllm", "--max-in-flight", "8",
                                         "--engine-arg", "max_num_seqs=8", *args],
                log_path=tmp / name / "sidecar.log", start_timeout_s=600) as sidecar:
            assert sidecar.client is not None
            stats = sidecar.client.stats()
    except SidecarStartError as e:
        return {"variant": name, "env": env, "args": args, "error": _why(e.log_tail)}
    start_s = time.monotonic() - started
    alone = [c for c in stats.calibration if c.batch == 1]
    full = full_batch_speed(speeds_from_stats(stats))
    sizing = sizing_from_stats(stats, max_tokens=48, high_sla_ms=8000, l1l2=False)
    return {"variant": name, "env": env, "args": args, "start_s": round(start_s, 1),
            "alone": {"ttft_ms": round(alone[0].ttft_ms, 1),
                      "tpot_ms": round(alone[0].tpot_ms, 1)} if alone else None,
            "full_batch": {"batch": full[0], "ttft_ms": round(full[1] * 1000, 1),
                           "tpot_ms": round(full[2] * 1000, 1)} if full else None,
            "tokens_per_s_full_batch": round(full[0] / full[2], 1) if full else None,
            "demo_capacity_rps_48_tokens": (round(8 / (full[1] + 47 * full[2]), 3)
                                            if full else None),
            "demo_sizing": sizing.as_dict() if sizing else None}


def main(argv: list[str] | None = None) -> int:
    """Command line: measure each variant, print a table, write the JSON result."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_speed",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    if unknown := [n for n in names if n not in VARIANTS]:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="sts-engine-speed-") as tmp:
        for name in names:
            print(f"[engine_speed] {name} ...", file=sys.stderr, flush=True)
            rows.append(measure(name, Path(tmp)))
    result = {"benchmark": "engine_speed", "machine": machine_info(),
              "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "variants": rows}
    write_text_atomically(args.out, json.dumps(result, indent=2) + "\n")
    print(f"{'variant':<18} {'alone TTFT/TPOT ms':>19} {'batch 8 TTFT/TPOT ms':>21} "
          f"{'tok/s':>6} {'req/s@48':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:<18} did not start: {r['error']}")
            continue
        a, f = r["alone"] or {}, r["full_batch"] or {}
        print(f"{r['variant']:<18} {a.get('ttft_ms', 0):>9.0f} /{a.get('tpot_ms', 0):>7.1f} "
              f"{f.get('ttft_ms', 0):>11.0f} /{f.get('tpot_ms', 0):>7.1f} "
              f"{r['tokens_per_s_full_batch'] or 0:>6.1f} "
              f"{r['demo_capacity_rps_48_tokens'] or 0:>9.2f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
