"""Admission step *load*: can the request wait its turn and still finish in time?

In order (first refusal wins; all ``shed``, none of them does engine work):

1. its pool is full (``queue_full``);
2. load shedding: the total queue depth or the tokens in the engine reached the
   watermark of its priority, or a higher pool is losing requests to waiting and its
   priority is in ``load_shedding.under_pressure`` (``overloaded``; never ``high``);
3. the estimated queue wait is over its pool's ``max_queue_delay_ms`` and the
   deadline does not leave room for that wait plus the measured service time
   (``queue_delay_exceeded``; the rule is
   :meth:`~sidecar.load_control.LoadControl.queue_delay_refusal`);
4. the estimated completion (queue wait + service) is after ``deadline_ts`` even in
   the smallest batch preemption can give it and even at the speed the warm-up measured,
   which fewer lower starts can give it (``preemption.hold_lower``;
   ``deadline_infeasible``).

Both rest on the estimated wait only once a request has completed
(:meth:`~sidecar.load_control.LoadControl.evidence_wait_s`): before that, nothing the
sidecar has seen says how long answers are, the wait is an upper bound, and a fresh
sidecar refuses nothing for its queue (step 4 then counts the service time alone).

The estimates come from :class:`~sidecar.load_control.LoadControl`, the load model the
dispatcher uses too; this step only decides. Within a batch, a request it admitted
counts as queued in its pool for the requests after it (:meth:`LoadCheck.admit`), until
:meth:`LoadCheck.end_batch`, when the scheduler queues them for real.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.acks import Refusal
from sidecar.contract import Priority, RefusalReason, now_ms
from sidecar.request_state import SidecarRequest

if TYPE_CHECKING:
    from sidecar.load_control import LoadControl


class LoadCheck:
    """Admission against pool limits, watermarks, queue delay and the deadline.

    Args:
        load: The scheduler's load model (read; only the batch's admitted requests are
            noted in it, until :meth:`end_batch`).
    """

    def __init__(self, load: LoadControl) -> None:
        self.load = load
        self.config = load.config
        self.wait_s = 0.0
        """The queue wait estimated by the last :meth:`check` that got that far (logged
        against the actual wait when the request starts)."""
        self.held = False
        """The last :meth:`check` admitted its request only on the engine's unloaded
        speed: lower work must start less (``preemption.hold_lower``)."""

    def check(self, req: SidecarRequest) -> Refusal | None:
        """The first load refusal of ``req``, or ``None`` when it may queue."""
        assert req.priority is not None
        load = self.load
        pool = load.pools[req.priority]
        queued = load.queued(req.priority)
        if queued >= pool.config.max_queued:
            return Refusal(RefusalReason.QUEUE_FULL,
                           f"{queued} requests already queued in pool {req.priority} "
                           f"(max_queued {pool.config.max_queued})")
        if req.priority is not Priority.HIGH and (why := self.over_watermark(req.priority)):
            return Refusal(RefusalReason.OVERLOADED, f"load shedding: {why}")
        self.wait_s = load.estimate_wait_s(req)
        wait_s = load.evidence_wait_s(self.wait_s)
        if refusal := load.queue_delay_refusal(req, wait_s):
            return refusal
        self.held = False
        if self.config.deadline_admission and load.estimator.warm:
            if load.fit_batch(req, wait_s) is None and not self._fits_with_preemption(req):
                if not load.fits_if_held(req, wait_s):
                    return self._infeasible(req, wait_s)
                self.held = True
        return None

    def admit(self, req: SidecarRequest) -> float:
        """``req`` passed :meth:`check`: it counts as queued for the rest of the batch
        (and, admitted on the warm-up's speed, narrows the intake windows below
        it). Returns its estimated queue wait (seconds)."""
        assert req.priority is not None
        self.load.admit_pending(req.priority)
        if self.held:
            self.load.windows.slowed(req.priority)
        return self.wait_s

    def end_batch(self) -> None:
        """The batch is decided: its admitted requests are the scheduler's to queue."""
        self.load.clear_pending()

    def over_watermark(self, priority: Priority) -> str | None:
        """Why ``priority`` is being shed right now, or ``None``."""
        load = self.load
        marks = self.config.load_shedding
        name = str(priority)
        depth = marks.queue_depth.get(name)
        if depth is not None and load.total_queued() >= depth:
            return f"{load.total_queued()} requests queued (watermark for {name}: {depth})"
        tokens = marks.tokens_in_flight.get(name)
        if tokens is not None and load.total_tokens_in_flight() >= tokens:
            return (f"{load.total_tokens_in_flight()} tokens in the engine "
                    f"(watermark for {name}: {tokens})")
        if name in marks.under_pressure and (losing := load.losing_above(priority)) is not None:
            return (f"pool {losing} lost a request to waiting in the last "
                    f"{marks.pressure_window_s:g} s (load_shedding.under_pressure)")
        return None

    def _fits_with_preemption(self, req: SidecarRequest) -> bool:
        """Whether preempting lower work (for a priority that preempts only when its
        deadline is at risk) would let ``req`` finish in time."""
        pre = self.load.preempt_wait_s(req)
        return pre is not None and self.load.fit_batch(req, pre) is not None

    def _infeasible(self, req: SidecarRequest, wait_s: float) -> Refusal:
        assert req.priority is not None
        load, cfg = self.load, self.config
        service_s = load.estimator.service_s(req.priority, max_tokens=req.max_tokens,
                                             batch=min(load.in_flight() + 1, cfg.max_in_flight))
        done_ms = now_ms() + cfg.deadline_slack * (wait_s + service_s) * 1000.0
        return Refusal(RefusalReason.DEADLINE_INFEASIBLE,
                       f"estimated completion in {done_ms - now_ms():.0f} ms (wait "
                       f"{wait_s * 1000:.0f} ms + service {service_s * 1000:.0f} ms) is "
                       f"after the deadline, {req.deadline_ts - now_ms()} ms away")
