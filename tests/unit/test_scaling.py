"""The scaling controller's decisions on a recorded load trace (issue 32, item 2): up
after the up window to the level it held, down after the down window, hold in between
and while cooling down; never flapping on a steady or noisy load."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from spark_ext.config import PipelineConfig, ScalingConfig
from spark_ext.exceptions import PipelineConfigError
from spark_ext.pipeline.scaling import (ScaleController, ScaleDecision, SparkExecutors,
                                        pipeline_scale, scaling_step)

CONFIG = ScalingConfig(enabled=True, min_gpus=1, max_gpus=4, up_window_s=60,
                       down_window_s=600, cooldown_s=180)


def _trace() -> list[tuple[float, int]]:
    """(seconds, desired GPUs) every 30 s: 10 minutes at a base one GPU serves (desired
    1, with a one-check blip to 2), a 3-minute step to 4x (desired 4, one check at 3),
    back to the base for 20 minutes."""
    trace = [(t, 1) for t in range(0, 600, 30)]
    trace[7] = (210, 2)  # a single noisy check in the steady phase
    trace += [(t, 4) for t in range(600, 780, 30)]
    trace[22] = (660, 3)
    trace += [(t, 1) for t in range(780, 1980, 30)]
    return trace


def _replay(controller: ScaleController, trace: list[tuple[float, int]]
            ) -> list[tuple[float, ScaleDecision]]:
    current, actions = 1, []
    for t, desired in trace:
        decision = controller.decide(t, desired=desired, current=current)
        if decision.action != "hold":
            actions.append((t, decision))
            current = decision.target
    return actions


def test_sidecars_each_short_of_a_gpu_ask_for_one_gpu_together() -> None:
    """Four sidecars at a quarter of a GPU each: the pipeline needs one GPU, so the
    controller can shrink a four-GPU fleet back to one (a sum of each sidecar's
    rounded-up value would say four for ever)."""
    rows = [{"sidecar_id": f"gpu{i}", "gpus": 1, "desired_gpus": 1,
             "desired_gpus_exact": 0.22, "demand_tokens_per_s": 500.0} for i in range(4)]
    rows += rows[:2]  # two tasks reached the same sidecars again
    scale = pipeline_scale(rows)
    assert (scale["gpus"], scale["desired_gpus"]) == (4.0, 1.0)
    assert scale["desired_gpus_exact"] == pytest.approx(0.88)
    controller = ScaleController(ScalingConfig(min_gpus=1, max_gpus=4, down_window_s=60,
                                               cooldown_s=0))
    decisions = [controller.decide(t, desired=scale["desired_gpus_exact"], current=4)
                 for t in (0, 30, 60)]
    assert [(d.action, d.target) for d in decisions][-1] == ("down", 1)
    assert pipeline_scale([{"sidecar_id": None, "gpus": None, "desired_gpus_exact": None,
                            "demand_tokens_per_s": None}])["desired_gpus"] == 0.0


def test_a_steady_load_at_a_boundary_never_flaps() -> None:
    """Measured at a steady 12 events/s on one simulated GPU (a load-step run): the signal
    wandered between 0.9 and 1.1 GPUs, and with rounded values the controller went
    1 -> 2 -> 1 -> 2 within ten minutes. Within the tolerance it holds; a real rise
    past it still scales up."""
    controller = ScaleController(CONFIG)
    trace = [0.96, 1.04, 1.08, 0.99, 1.07, 1.02, 0.93, 1.09, 1.05, 1.01] * 4  # 20 minutes
    decisions = [controller.decide(30.0 * i, desired=d, current=1) for i, d in enumerate(trace)]
    assert {d.action for d in decisions} == {"hold"}
    rise = [controller.decide(1200.0 + 30 * i, desired=1.4, current=1) for i in range(3)]
    assert (rise[-1].action, rise[-1].target) == ("up", 2)
    # At two GPUs a signal of 1.05 rounds up to 2: no release to 1 and back.
    assert controller.decide(1400.0, desired=1.05, current=2).action == "hold"
    with pytest.raises(PipelineConfigError, match="tolerance"):
        ScalingConfig(tolerance=1.0)


def test_a_load_step_scales_up_once_and_down_once() -> None:
    actions = _replay(ScaleController(CONFIG), _trace())
    assert [(t, d.action, d.target) for t, d in actions] == [
        # The step starts at 600 s; 60 s later the median of the window (4, 4, 3: one
        # noisy check) is asked for; at 780 s the load is back, but the cool-down (180 s
        # from 660 s) and then the down window (600 s from 780 s) hold it.
        (660, "up", 4),
        (1380, "down", 1),
    ]
    # Nothing during the steady phases: the blip at 210 s did not last the up window.
    assert all(600 <= t <= 1380 for t, _ in actions)


def test_the_limits_and_the_cool_down_hold() -> None:
    c = ScaleController(ScalingConfig(enabled=True, min_gpus=2, max_gpus=3, up_window_s=0,
                                      down_window_s=0, cooldown_s=100))
    assert c.decide(0, desired=9, current=2) == ScaleDecision(
        "up", 3, "9 desired for 0 s (window 0 s), 2 there")
    assert c.decide(50, desired=1, current=3).action == "hold"  # cooling down
    assert (c.decide(150, desired=1, current=3).action,
            c.decide(150, desired=1, current=2).action) == ("down", "hold")
    assert c.decide(400, desired=2, current=2) == ScaleDecision("hold", 2,
                                                                "2 desired, 2 there")


def test_a_spike_inside_the_down_window_holds_the_capacity() -> None:
    c = ScaleController(ScalingConfig(enabled=True, max_gpus=4, up_window_s=60,
                                      down_window_s=300, cooldown_s=0))
    decisions = [c.decide(t, desired=d, current=4)
                 for t, d in ((0, 1), (100, 3), (200, 1), (300, 1))]
    assert [(d.action, d.target) for d in decisions] == [
        ("hold", 4), ("hold", 4), ("hold", 4), ("down", 3)]


class _RefusingContext:
    """A SparkContext whose scheduler backend cannot add executors (local mode), or with
    ``accept`` one that can."""

    def __init__(self, accept: bool = False) -> None:
        self.asked: list[int] = []
        jsc = self

        class _Sc:
            def getExecutorIds(self):
                return _Ids()

            def requestTotalExecutors(self, n, locality_aware_tasks, host_counts):
                jsc.asked.append(n)
                return accept

        class _Jsc:
            def sc(self):
                return _Sc()

        self._jsc = _Jsc()
        self._jvm = SimpleNamespace(PythonUtils=SimpleNamespace(toScalaMap=dict),
                                    java=SimpleNamespace(util=SimpleNamespace(HashMap=dict)))


class _Ids(list):
    def size(self) -> int:
        return len(self)


def test_a_driver_that_cannot_ask_logs_once_and_keeps_the_signal(caplog) -> None:
    context = _RefusingContext()
    spark = type("Spark", (), {"sparkContext": context})()
    executors = SparkExecutors(spark)
    controller = ScaleController(ScalingConfig(enabled=True, up_window_s=0, cooldown_s=0))
    with caplog.at_level(logging.INFO, logger="spark_ext.pipeline.scaling"):
        first = scaling_step(controller, executors, desired=3, clock=lambda: 0.0)
        scaling_step(controller, executors, desired=3, clock=lambda: 1.0)
    assert (first.action, first.target, context.asked) == ("up", 3, [3, 3])
    assert not first.applied  # so no warm-up waits for executors that will not come
    refusals = [r for r in caplog.records if "cannot add or remove executors" in r.message]
    assert len(refusals) == 1
    assert any("not applied" in r.message for r in caplog.records)


def test_the_scaling_section_is_checked() -> None:
    assert PipelineConfig.from_dict({"scaling": {"enabled": True}}).scaling.max_gpus == 4
    with pytest.raises(PipelineConfigError, match="min_gpus"):
        PipelineConfig.from_dict({"scaling": {"min_gpus": 5, "max_gpus": 2}})


def test_a_failing_scale_check_is_a_warning_not_the_pipelines_failure(caplog) -> None:
    """The scale check runs on a ticker whose exception would stop the pipeline: a check
    that fails (an executor going away mid-check) is logged and the next one runs."""
    from spark_ext.pipeline.sts_pipeline import StsPipeline

    pipeline = object.__new__(StsPipeline)  # only what the scale check reads
    pipeline.config = PipelineConfig.from_dict({"scaling": {"enabled": True}})
    pipeline.spark = None
    pipeline._stopping = None
    calls = []

    def check_sidecars(**kw):
        calls.append(kw)
        raise RuntimeError("Job aborted: executor 1 lost\n\tat org.apache.spark...")

    pipeline.check_sidecars = check_sidecars
    step = pipeline._scaler()
    with caplog.at_level(logging.WARNING, logger="spark_ext.pipeline.sts_pipeline"):
        assert step() is None and step() is None
    assert len(calls) == 2 and calls[0] == {"log_level": logging.DEBUG}
    assert "The scale check failed" in caplog.text and "executor 1 lost" in caplog.text


@pytest.mark.parametrize("accept", [True, False])
def test_an_applied_scale_up_starts_the_warm_up_with_the_executors_there(
        monkeypatch, accept: bool) -> None:
    """The scale check hands an applied scale-up to the warm-up (the executors its own
    check rows came from are the ones known); a refused one starts nothing."""
    from spark_ext.pipeline import sts_pipeline
    from spark_ext.pipeline.sts_pipeline import StsPipeline

    started = []

    class _Warmup:
        def __init__(self, registered, check, *, stopping) -> None:
            pass

        def start(self, target: int, known: set[str]) -> bool:
            started.append((target, known))
            return True

    monkeypatch.setattr(sts_pipeline, "ExecutorWarmup", _Warmup)
    pipeline = object.__new__(StsPipeline)  # only what the scale check reads
    pipeline.config = PipelineConfig.from_dict(
        {"scaling": {"enabled": True, "up_window_s": 0, "cooldown_s": 0}})
    pipeline.spark = SimpleNamespace(sparkContext=_RefusingContext(accept=accept))
    pipeline._stopping = None
    rows = [{"sidecar_id": "a", "gpus": 1, "desired_gpus_exact": 2.6,
             "demand_tokens_per_s": 900.0, "executor": "h:1"}]
    pipeline.check_sidecars = lambda **kw: rows
    decision = pipeline._scaler()()
    assert (decision.action, decision.target, decision.applied) == ("up", 3, accept)
    assert started == ([(3, {"h:1"})] if accept else [])
