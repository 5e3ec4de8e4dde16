"""The warm-up after a scale-up (issue 32's stall): the sidecar check runs while a
registered executor has not answered, and the watch ends once every expected executor
has. The cluster here is a script of what Spark would report (the test's purpose is the
watch's behaviour); the real check on a real multi-executor Spark is in
``tests/process/test_gpu_cluster.py``."""

from __future__ import annotations

import threading

from spark_ext.config import PipelineConfig
from spark_ext.pipeline.executor_warmup import ExecutorWarmup


class _Cluster:
    """Executors registering over the checks: ``registered[i]`` executors at the i-th
    count; a check answers from the executors it is told have launched."""

    def __init__(self, registered: list[int], answering: list[list[str]]) -> None:
        self.registered_seq, self.answering = registered, answering
        self.counts = self.checks = 0

    def registered(self) -> int:
        n = self.registered_seq[min(self.counts, len(self.registered_seq) - 1)]
        self.counts += 1
        return n

    def check(self) -> list[dict]:
        rows = self.answering[min(self.checks, len(self.answering) - 1)]
        self.checks += 1
        return [{"executor": e, "serving": True} for e in rows]


def test_checks_run_until_every_new_executor_answered() -> None:
    # One executor before; two asked for. The first checks land on the old one only
    # (the new ones registered but not launched yet), then on the new ones.
    cluster = _Cluster(registered=[1, 1, 3, 3, 3, 3],
                       answering=[["h:1"], ["h:1", "h:2"], ["h:1", "h:2", "h:3"]])
    warmup = ExecutorWarmup(cluster.registered, cluster.check, poll_s=0, retry_s=0)
    report = warmup.run(target=3, known={"h:1"})
    assert report.warmed == ["h:2", "h:3"]
    assert cluster.checks == 3 and not report.timed_out


def test_no_check_while_no_new_executor_registered() -> None:
    cluster = _Cluster(registered=[1] * 5 + [2], answering=[["h:1", "h:2"]])
    report = ExecutorWarmup(cluster.registered, cluster.check, poll_s=0, retry_s=0).run(
        target=2, known={"h:1"})
    assert cluster.checks == 1 and report.warmed == ["h:2"]


def test_checks_are_spaced_while_a_new_executor_has_not_answered() -> None:
    """Each check puts a task on every free slot: back to back they would take the
    stream's slots for as long as a new executor takes to come up."""
    cluster = _Cluster(registered=[2], answering=[["h:1"]])
    report = ExecutorWarmup(cluster.registered, cluster.check, poll_s=0.005, retry_s=0.1,
                            timeout_s=0.35).run(target=2, known={"h:1"})
    assert report.timed_out and 3 <= cluster.checks <= 4, cluster.checks


def test_executors_that_never_come_end_the_watch_at_its_timeout(caplog) -> None:
    cluster = _Cluster(registered=[1], answering=[["h:1"]])
    report = ExecutorWarmup(cluster.registered, cluster.check, poll_s=0.01,
                            timeout_s=0.05).run(target=2, known={"h:1"})
    assert report.timed_out and report.warmed == [] and cluster.checks == 0
    assert "1 of 2 executors answered" in caplog.text


def test_a_failing_check_is_tried_again() -> None:
    calls = []

    def check() -> list[dict]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("executor lost")
        return [{"executor": "h:2"}]

    report = ExecutorWarmup(lambda: 2, check, poll_s=0, retry_s=0).run(target=2, known={"h:1"})
    assert report.warmed == ["h:2"] and report.jobs == 2


def test_the_pipeline_stopping_ends_the_watch() -> None:
    stopping = threading.Event()
    warmup = ExecutorWarmup(lambda: 1, lambda: [], stopping=stopping, poll_s=0.01)
    assert warmup.start(target=2, known={"h:1"})
    assert not warmup.start(target=2, known={"h:1"})  # one watch at a time
    stopping.set()
    warmup.join(5)
    assert warmup.last is not None and not warmup.last.timed_out


def test_warm_up_is_on_by_default_and_can_be_turned_off() -> None:
    assert PipelineConfig.from_dict({}).scaling.warm_up is True
    assert PipelineConfig.from_dict({"scaling": {"warm_up": False}}).scaling.warm_up is False
