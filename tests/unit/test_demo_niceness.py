"""``sts demo`` with the real engine on the CPU starts Spark at a lower CPU priority than
the sidecar's: the JVM (and what it starts) inherits the nice value of the thread that
launches it, while the demo's own thread keeps its own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sts_harness.demo import SPARK_NICENESS, in_thread_at_niceness


def _child_niceness() -> int:
    """The nice value of a process started from the calling thread."""
    out = subprocess.run([sys.executable, "-c", "import os; print(os.nice(0))"],
                         capture_output=True, text=True, check=True).stdout
    return int(out)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's nice value")
def test_what_the_thread_starts_runs_at_the_raised_niceness_and_the_caller_keeps_its_own(
        ) -> None:
    mine = os.nice(0)
    child = in_thread_at_niceness(_child_niceness, SPARK_NICENESS)
    assert child == min(mine + SPARK_NICENESS, 19)
    assert os.nice(0) == mine and _child_niceness() == mine


def test_its_result_and_its_error_come_back() -> None:
    assert in_thread_at_niceness(lambda: "spark", 0) == "spark"
    assert in_thread_at_niceness(lambda: "spark", 1) == "spark"

    def fail() -> None:
        raise RuntimeError("the JVM did not start")

    with pytest.raises(RuntimeError, match="the JVM did not start"):
        in_thread_at_niceness(fail, 1)
