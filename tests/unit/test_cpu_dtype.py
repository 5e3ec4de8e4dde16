"""The CPU engine's dtype follows the CPU: bf16 where it has bf16 instructions and PyTorch
runs its AVX-512 kernels, fp32 on AVX2 (where vLLM's CPU bf16 path fails; issue 31)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from tests.utils import REPO

_PROBE = "from sidecar.engines.vllm import cpu_dtype; print(cpu_dtype())"


def _dtype(**env: str) -> str:
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_avx2_kernels_run_fp32() -> None:
    assert _dtype(ATEN_CPU_CAPABILITY="avx2") == "float32"


def test_a_cpu_with_bf16_instructions_runs_bf16() -> None:
    has_bf16 = (torch.backends.cpu.get_cpu_capability() == "AVX512"
                and torch.cpu._is_avx512_bf16_supported())
    assert _dtype() == ("bfloat16" if has_bf16 else "float32")
