"""``sts bench --cpu-split``: the real engine's CPU kept apart from Spark for every scheme
alike, said in ``bench.json``, and refused where nothing can be kept apart."""

from __future__ import annotations

import contextlib
import os

import pytest

from benchmarks.bench import _apply_cpu_split, resolve_cpu_split
from sidecar import ConfigError
from sts_harness.demo import SPARK_NICENESS, spark_cpus


def test_the_simulated_engine_shares_the_cpus_and_refuses_a_pinned_split() -> None:
    assert resolve_cpu_split("auto", "simulated") == {"mode": "shared", "spark_cpus": None}
    assert resolve_cpu_split("shared", "simulated")["mode"] == "shared"
    with pytest.raises(ConfigError, match=r"^--cpu-split pinned needs the vllm engine .*'simulated'"):
        resolve_cpu_split("pinned", "simulated")
    with pytest.raises(ConfigError, match=r"^--cpu-split 'half' must be one of auto, pinned, shared"):
        resolve_cpu_split("half", "vllm")


@pytest.mark.skipif(spark_cpus("vllm") is None, reason="needs a CPU machine with 2+ CPUs incl. CPU 0")
def test_a_pinned_split_keeps_cpu_0_for_the_engine_until_the_bench_ends() -> None:
    before = os.sched_getaffinity(0)
    split = resolve_cpu_split("auto", "vllm")
    assert split["mode"] == "pinned" and 0 not in split["spark_cpus"]
    assert resolve_cpu_split("shared", "vllm")["mode"] == "shared"  # a CPU user's run, kept
    with contextlib.ExitStack() as stack:
        recorded = _apply_cpu_split(stack, split)
        assert os.sched_getaffinity(0) == set(split["spark_cpus"])
        assert recorded == {"mode": "pinned", "spark_cpus": split["spark_cpus"],
                            "engine_cpus": sorted(before - set(split["spark_cpus"])),
                            "spark_niceness": SPARK_NICENESS}
    assert os.sched_getaffinity(0) == before


def test_a_shared_split_touches_nothing_and_says_so() -> None:
    before = os.sched_getaffinity(0)
    with contextlib.ExitStack() as stack:
        recorded = _apply_cpu_split(stack, {"mode": "shared", "spark_cpus": None})
        assert os.sched_getaffinity(0) == before
    assert recorded == {"mode": "shared", "spark_cpus": None, "engine_cpus": None,
                        "spark_niceness": 0}


def test_a_pinned_split_that_cannot_be_kept_is_refused_before_anything_is_made(
        tmp_path) -> None:
    from benchmarks.bench import BenchOptions, run_bench

    out = tmp_path / "bench"
    with pytest.raises(ConfigError, match=r"^--cpu-split pinned needs"):
        run_bench(BenchOptions(profile="cpu-small", engine="simulated", rates=[1.0],
                               duration_s=1.0, schemes=["engine"], out=str(out),
                               cpu_split="pinned"))
    assert not out.exists()
