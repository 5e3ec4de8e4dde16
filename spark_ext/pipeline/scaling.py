"""Elastic GPU capacity through Spark (issue 32, item 2): the pipeline asks the cluster
manager for GPU executors when the sidecars' scale signal stays above what there is, and
releases executors when it stays below.

The signal is the sum of the sidecars' unrounded ``desired_gpus`` over the distinct
sidecars the executors reach, rounded up (:func:`pipeline_scale`), asked every
:data:`~spark_ext.pipeline.sts_pipeline.SCALE_CHECK_INTERVAL_S`. :class:`ScaleController`
decides, with hysteresis, so steady load never flaps:

- **up** once the desired number has stayed above the current one for ``up_window_s``,
  to the *median* of the values seen over that window (a level, not one check's noise);
- **down** once it has stayed below for ``down_window_s``, to the *largest* value seen
  over that window (a spike inside the window holds the capacity);
- **hold** otherwise: while the signal is within ``tolerance`` (10 %) of the GPUs there
  are (as Kubernetes' HPA), and for ``cooldown_s`` after any action (a new executor's sidecar
  warms up before it serves, so the signal lags the action);
- always within ``min_gpus``-``max_gpus``.

:class:`SparkExecutors` carries a decision out through Spark's own executor requests
(``SparkContext.requestTotalExecutors``; an executor is released by Spark's graceful
decommissioning where ``spark.decommission.enabled``, else ``killExecutors``: standalone,
YARN, Kubernetes). A released executor's lazily started sidecar finishes what it holds by
the requests' deadlines and exits (``sidecar.orphan_exit_s``), so a scale-in loses no
answer and frees the GPU.
Where the driver cannot ask (local mode, Spark Connect, a Databricks cluster whose
autoscaling Databricks runs) the request is refused and logged once; the signal stays on
the driver's ``/metrics`` (``sts_spark_scale``) for an outside autoscaler.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spark_ext.config import ScalingConfig

logger = logging.getLogger(__name__)


def pipeline_scale(rows: list[dict]) -> dict[str, float]:
    """The scale signal of a pipeline: each sidecar's (one row per task that reached it;
    several tasks may share one) summed over the distinct sidecars.

    The GPUs desired are the sidecars' unrounded values summed, then rounded up: four
    sidecars each asking for a quarter of a GPU make one GPU, not four (a sum of
    per-sidecar values rounded up would never let the pipeline shrink below the
    sidecars it has).

    Example:
        >>> rows = [{"sidecar_id": "a", "gpus": 1, "desired_gpus_exact": 2.4,
        ...          "demand_tokens_per_s": 900.0},
        ...         {"sidecar_id": "a", "gpus": 1, "desired_gpus_exact": 2.4,
        ...          "demand_tokens_per_s": 900.0},
        ...         {"sidecar_id": "b", "gpus": 1, "desired_gpus_exact": 0.3,
        ...          "demand_tokens_per_s": 100.0},
        ...         {"sidecar_id": None, "gpus": None, "desired_gpus_exact": None,
        ...          "demand_tokens_per_s": None}]
        >>> pipeline_scale(rows)
        {'gpus': 2.0, 'desired_gpus': 3.0, 'desired_gpus_exact': 2.7, 'demand_tokens_per_second': 1000.0}
    """
    seen = {r["sidecar_id"]: r for r in rows
            if r.get("sidecar_id") is not None and r.get("desired_gpus_exact") is not None}
    exact = sum(r["desired_gpus_exact"] for r in seen.values())
    return {"gpus": float(sum(r["gpus"] for r in seen.values())),
            "desired_gpus": float(max(1, math.ceil(exact - 1e-9))) if seen else 0.0,
            "desired_gpus_exact": round(exact, 3),
            "demand_tokens_per_second": float(sum(r["demand_tokens_per_s"]
                                                  for r in seen.values()))}


@dataclass(frozen=True)
class ScaleDecision:
    """What the controller decided at one check."""

    action: str
    """``up``, ``down`` or ``hold``."""
    target: int
    """GPUs to have after it (the current number for ``hold``)."""
    why: str
    applied: bool = True
    """Whether the cluster manager took it (``False``: refused, or cannot be asked here)."""


class ScaleController:
    """Decides how many GPU executors the pipeline should have (changes nothing itself).

    Args:
        config: The ``scaling`` section.

    Example:
        >>> c = ScaleController(ScalingConfig(max_gpus=4, up_window_s=60, down_window_s=300,
        ...                                   cooldown_s=120))
        >>> [(d.action, d.target) for d in (c.decide(t, desired=3, current=1)
        ...                                  for t in (0, 30, 60))]
        [('hold', 1), ('hold', 1), ('up', 3)]
        >>> c.decide(90, desired=4, current=3).why
        'cooling down after the last action (30 s ago)'
    """

    def __init__(self, config: ScalingConfig) -> None:
        self.config = config
        self._seen: list[tuple[float, int]] = []
        """(time, desired) since the desired number left the current one (one side)."""
        self._side = 0
        """+1 while the desired number is above the current one, -1 below, 0 level."""
        self._acted_at: float | None = None

    def decide(self, now: float, *, desired: float, current: int) -> ScaleDecision:
        """The decision at ``now`` (seconds, monotonic) for a signal of ``desired`` GPUs
        (the capacity formula's unrounded value) with ``current`` GPU executors.

        Within ``tolerance`` of the current number (``desired / current`` between
        ``1 - tolerance`` and ``1 + tolerance``) the signal asks for what there is: a load
        that sits at a boundary (1.05 GPUs, then 0.97) never flaps between two sizes."""
        cfg = self.config
        if abs(desired / max(current, 1) - 1) <= cfg.tolerance:
            want = current
        else:
            want = max(1, math.ceil(desired - 1e-9))
        want = min(max(want, cfg.min_gpus), cfg.max_gpus)
        desired = float(f"{desired:.3g}")  # as the reasons print it
        side = (want > current) - (want < current)
        if side != self._side:
            self._side, self._seen = side, []
        if side == 0:
            return ScaleDecision("hold", current, f"{desired:g} desired, {current} there")
        self._seen.append((now, want))
        if self._acted_at is not None and now - self._acted_at < cfg.cooldown_s:
            return ScaleDecision("hold", current, f"cooling down after the last action "
                                                  f"({now - self._acted_at:.0f} s ago)")
        window = cfg.up_window_s if side > 0 else cfg.down_window_s
        since = self._seen[0][0]
        if now - since < window:
            return ScaleDecision("hold", current, f"{desired:g} desired, {current} there, for "
                                                  f"{now - since:.0f} of {window:.0f} s")
        recent = [w for t, w in self._seen if t >= now - window]
        target = int(statistics.median_high(recent)) if side > 0 else max(recent)
        self._acted_at, self._side, self._seen = now, 0, []
        action = "up" if side > 0 else "down"
        return ScaleDecision(action, target, f"{desired:g} desired for {now - since:.0f} s "
                                             f"(window {window:.0f} s), {current} there")


class SparkExecutors:
    """GPU executors asked of and released to the cluster manager through Spark.

    Args:
        spark: A classic session (Spark Connect has no ``SparkContext``: refused).
    """

    def __init__(self, spark: Any) -> None:
        self.sc = getattr(spark, "sparkContext", None)
        self._refused_logged = False

    def current(self) -> int:
        """Executors registered now (the driver excluded; local mode: 1)."""
        if self.sc is None:
            return 1
        ids = self.sc._jsc.sc().getExecutorIds()
        return max(int(ids.size()), 1)

    def starting(self) -> int:
        """Executors far enough in their start to take tasks within moments: their block
        manager has registered (in the executor's constructor, just before Spark offers
        it tasks; an executor is counted by :meth:`current` seconds earlier)."""
        if self.sc is None:
            return 1
        infos = self.sc._jsc.sc().statusTracker().getExecutorInfos()
        return max(len(infos) - 1, 1)  # the driver's block manager is one of them

    def apply(self, decision: ScaleDecision, current: int) -> bool:
        """Ask for ``decision.target`` executors; ``False`` when the cluster manager
        cannot be asked here (logged once)."""
        if decision.action == "hold":
            return True
        ok = False
        try:
            jsc = self.sc._jsc.sc() if self.sc is not None else None
            if jsc is not None and decision.action == "down":
                seq = jsc.getExecutorIds()
                ids = [seq.apply(i) for i in range(seq.size())][: current - decision.target]
                ok = bool(ids) and self._release(jsc, ids)
            if jsc is not None and (decision.action == "up" or ok):
                # An absolute total: an application without dynamic allocation has no
                # target of its own for a relative request to add to.
                ok = bool(jsc.requestTotalExecutors(
                    decision.target, 0, self.sc._jvm.PythonUtils.toScalaMap(
                        self.sc._jvm.java.util.HashMap())))
        except Exception as e:  # the cluster manager refused: the signal is still exported
            logger.warning("Scaling %s to %d GPU executors failed: %s", decision.action,
                           decision.target, str(e).splitlines()[0])
            return False
        if not ok and not self._refused_logged:
            self._refused_logged = True
            logger.warning("The cluster manager cannot add or remove executors from this "
                           "driver (local mode, or autoscaling run by the platform): scaling "
                           "acts on nothing; the signal is on the driver's /metrics "
                           "(sts_spark_scale) for an outside autoscaler.")
        return ok

    def _release(self, jsc: Any, ids: list[str]) -> bool:
        """Release executors ``ids``: decommissioned where ``spark.decommission.enabled``
        (Spark's graceful removal: no new tasks go there, running ones finish, then the
        executor exits), else killed. Their lazily started sidecars drain and exit once
        the executor is gone (``sidecar.orphan_exit_s``)."""
        assert self.sc is not None
        if self.sc.getConf().get("spark.decommission.enabled", "false").lower() == "true":
            jvm = self.sc._jvm
            info = jvm.org.apache.spark.scheduler.ExecutorDecommissionInfo(
                "sts scale-in", jvm.scala.Option.apply(None))
            backend = jsc.schedulerBackend()
            released = [i for i in ids if backend.decommissionExecutor(i, info, True, False)]
            logger.info("Decommissioned executor(s) %s.", ", ".join(released) or "none")
            return bool(released)
        return bool(jsc.killExecutors(_scala_seq(self.sc, ids)))


def _scala_seq(sc: Any, items: list[str]) -> Any:
    """A Scala ``Seq`` of ``items`` (what ``killExecutors`` takes)."""
    jlist = sc._jvm.java.util.ArrayList()
    for item in items:
        jlist.add(item)
    return sc._jvm.scala.jdk.javaapi.CollectionConverters.asScala(jlist).toSeq()


def scaling_step(controller: ScaleController, executors: SparkExecutors,
                 desired: float, clock: Callable[[], float] = time.monotonic) -> ScaleDecision:
    """One check: decide on ``desired`` GPUs (unrounded) and carry it out; log every
    action."""
    current = executors.current()
    decision = controller.decide(clock(), desired=desired, current=current)
    if decision.action != "hold":
        applied = executors.apply(decision, current)
        logger.info("Scaling %s: %d -> %d GPU executors (%s)%s.", decision.action, current,
                    decision.target, decision.why, "" if applied else "; not applied")
        decision = dataclasses.replace(decision, applied=applied)
    return decision
