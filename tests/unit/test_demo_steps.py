"""``sts demo``'s start-up steps: a failure in any of them is one line naming the step (or
our own error's first line) and the log, with the traceback in the log only."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from spark_ext.exceptions import PipelineConfigError
from sts_harness.demo import DemoFailedError, demo_step, log_demo_to_file
from sts_harness.kafka_broker import KafkaBrokerError


class _PlannerRefusal(Exception):
    """Stands in for a Spark ``AnalysisException``: not one of sts-spark's own errors."""


@pytest.mark.parametrize(("step", "error", "expected"), [
    ("Starting Kafka", KafkaBrokerError("the broker did not start in 60 s: port 9092 in use\n"
                                        "detail"), "the broker did not start in 60 s"),
    ("Building the pipeline", PipelineConfigError("template field 'kb_context' is carried by "
                                                  "no event"), "template field 'kb_context'"),
    ("Starting the queries", _PlannerRefusal("[UNRESOLVED_COLUMN] kb_context\nplan ..."),
     "Starting the queries failed: "),
])
def test_a_failed_step_is_one_line_with_the_log(step: str, error: Exception, expected: str,
                                                tmp_path: Path, capsys) -> None:
    log = tmp_path / "demo.log"
    with contextlib.ExitStack() as stack:
        log_demo_to_file(stack, log)
        with pytest.raises(DemoFailedError) as caught:
            with demo_step(step, log):
                raise error
    message = str(caught.value)
    assert "\n" not in message and expected in message and str(log) in message
    assert "Traceback" in log.read_text(encoding="utf-8"), "the traceback is in the log"
    assert "Traceback" not in capsys.readouterr().err


def test_a_step_that_succeeds_says_how_long_it_took(tmp_path: Path, capsys) -> None:
    with demo_step("Starting Spark (local[2])", tmp_path / "demo.log", expect="10-20 s"):
        pass
    out = capsys.readouterr().out
    assert "Starting Spark (local[2]) ... (10-20 s)" in out and "done in 0 s" in out
