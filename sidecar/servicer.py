"""gRPC servicer: converts between proto messages and domain objects, then delegates."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import grpc

from sidecar.acks import Ack
from sidecar.contract import FinishReason, Priority, RefusalReason, Status
from sidecar.exceptions import EngineDeadError
from sidecar.pb.sts.v1 import inference_pb2 as pb
from sidecar.pb.sts.v1 import inference_pb2_grpc as pb_grpc
from sidecar.request_state import ResultRecord, SidecarRequest
from sidecar.result_channels import ResultChannelStats
from sidecar.scale_signal import ScaleSignal
from sidecar.scheduler import Scheduler
from sidecar.stats import SchedulerStats

_PRIORITY_BY_VALUE = {int(p): p for p in Priority}


def request_from_proto(msg: pb.InferenceRequest) -> SidecarRequest:
    """Domain request from the wire message (an unknown priority becomes ``None``)."""
    # Positional, in field order: one call per request, keywords cost more.
    return SidecarRequest(
        msg.request_id,
        msg.trace_id,
        _PRIORITY_BY_VALUE.get(msg.priority),
        msg.enqueue_ts,
        msg.deadline_ts,
        msg.model,
        msg.prompt,
        msg.max_tokens,
        msg.temperature,
        msg.cache_key,
        msg.callback_topic,
        msg.seed if msg.HasField("seed") else None,
        dict(msg.attributes) if msg.attributes else {},
        msg.submit_ts,
        msg.delivery_ms,
        0,  # received_ts: set by Scheduler.submit_batch, once per batch
    )


def _ack_fields(ack: Ack) -> dict:
    """The fields of an ack's wire form that differ from their defaults."""
    if (ack.accepted and not ack.duplicate and ack.reason is None and not ack.detail
            and not ack.fallback_text):  # the common case
        return {"request_id": ack.request_id, "accepted": True, "received_ts": ack.received_ts}
    return dict(
        request_id=ack.request_id,
        accepted=ack.accepted,
        reason=int(ack.reason) if ack.reason is not None else pb.REFUSAL_REASON_UNSPECIFIED,
        detail=ack.detail,
        duplicate=ack.duplicate,
        received_ts=ack.received_ts,
        fallback_text=ack.fallback_text,
        id_conflict=ack.id_conflict,
    )


def submit_batch_response(acks: list[Ack], sidecar_id: str) -> pb.SubmitBatchResponse:
    """The ``SubmitBatch`` answer: one ack per request, in order."""
    response = pb.SubmitBatchResponse(sidecar_id=sidecar_id)
    add = response.acks.add  # built in place: no message copied per ack
    for ack in acks:
        if (ack.accepted and not ack.duplicate and ack.reason is None and not ack.detail
                and not ack.fallback_text):  # the common case, without a dict per ack
            add(request_id=ack.request_id, accepted=True, received_ts=ack.received_ts)
        else:
            add(**_ack_fields(ack))
    return response


def stats_to_proto(s: SchedulerStats, *, sidecar_id: str, engine_kind: str, model: str,
                   uptime_s: float, intake_topic: str = "") -> pb.GetStatsResponse:
    """The Stats RPC answer: the same live figures ``/metrics`` exposes, and the Kafka
    topic the sidecar reads requests from (``intake_topic``; empty: none)."""
    pools = [
        pb.PoolStats(
            priority=int(p), queued=ps.queued, in_flight=ps.in_flight,
            tokens_in_flight=ps.tokens_in_flight, max_queued=ps.max_queued,
            max_in_flight=ps.max_in_flight, max_tokens_in_flight=ps.max_tokens_in_flight,
            max_queue_delay_ms=ps.max_queue_delay_ms,
            estimated_queue_wait_ms=min(ps.estimated_queue_wait_s * 1000.0, 1e12),
            ttft_ms=ps.ttft_s * 1000.0, tpot_ms=ps.tpot_s * 1000.0,
            shed_by_reason=ps.shed_by_reason, results_by_status=ps.results_by_status,
            met_deadline=ps.met_deadline)
        for p, ps in s.pools.items()
    ]
    e = s.engine
    return pb.GetStatsResponse(
        sidecar_id=sidecar_id,
        engine=engine_kind,
        model=model,
        pools=pools,
        submitted=s.admissions.submitted,
        accepted=s.admissions.accepted,
        duplicates=s.admissions.duplicates,
        id_conflicts=s.admissions.id_conflicts,
        results_by_status=s.results_by_status,
        refusals_by_reason=s.refusals_by_reason,
        output_tokens_per_s=s.output_tokens_per_s,
        prompt_tokens_total=s.prompt_tokens_total,
        cached_tokens_total=s.cached_tokens_total,
        prefix_cache_hit_rate=s.prefix_cache_hit_rate,
        draining=s.draining,
        uptime_s=uptime_s,
        kv_cache_usage=e.kv_cache_usage if e.kv_cache_usage is not None else -1.0,
        engine_running=e.running or 0,
        engine_waiting=e.waiting or 0,
        tokens_in_flight=s.tokens_in_flight,
        late_results=s.late_results,
        late_aborted=s.late_aborted,
        late_in_flight=s.late_in_flight,
        result_channel=_channel_to_proto(s.result_channel),
        calibration=[pb.EngineSpeed(batch=c.batch, ttft_ms=c.ttft_s * 1000.0,
                                    tpot_ms=(c.tpot_s or 0.0) * 1000.0)
                     for c in s.calibration],
        scale=_scale_to_proto(s.scale),
        intake_topic=intake_topic,
    )


def _scale_to_proto(scale: ScaleSignal | None) -> pb.ScaleSignal | None:
    if scale is None:
        return None
    return pb.ScaleSignal(
        demand_tokens_per_s=scale.demand_tokens_per_s, demand_by_pool=scale.demand_by_pool,
        backlog_tokens=scale.backlog_tokens, capacity_tokens_per_s=scale.capacity_tokens_per_s,
        gpus=scale.gpus, target_utilisation=scale.target_utilisation,
        desired_gpus_exact=scale.desired_gpus_exact, desired_gpus=scale.desired_gpus,
        utilisation=scale.utilisation, refused_share=scale.refused_share,
        timeout_share=scale.timeout_share)


def _channel_to_proto(c: ResultChannelStats | None) -> pb.ResultChannelStats | None:
    if c is None:
        return None
    return pb.ResultChannelStats(kind=c.kind, produced=c.produced, delivered=c.delivered,
                                 delivery_errors=c.delivery_errors, buffered=c.buffered,
                                 up=-1 if c.up is None else int(c.up))


def result_to_proto(r: ResultRecord) -> pb.Result:
    """The wire form of one terminal result (the same fields as a result-channel row)."""
    return pb.Result(
        request_id=r.request_id, trace_id=r.trace_id, status=Status(r.status).wire,
        text=r.text, finish_reason=r.finish_reason, prompt_tokens=r.prompt_tokens,
        output_tokens=r.output_tokens, cached_tokens=r.cached_tokens, enqueue_ts=r.enqueue_ts,
        received_ts=r.received_ts, first_token_ts=r.first_token_ts or 0, finish_ts=r.finish_ts,
        ttft_ms=r.ttft_ms or 0.0, tpot_ms=r.tpot_ms or 0.0, error=r.error or "",
        sidecar_id=r.sidecar_id, model=r.model,
        priority=int(Priority.parse(r.priority)) if r.priority else pb.PRIORITY_UNSPECIFIED,
        deadline_ts=r.deadline_ts, callback_topic=r.callback_topic,
        reason=int(RefusalReason[r.reason.upper()]) if r.reason else
        pb.REFUSAL_REASON_UNSPECIFIED,
        fallback_text=r.fallback_text, attributes=r.attributes, submit_ts=r.submit_ts,
        late=r.late)


def _ack_as_result(ack: Ack, msg: pb.InferenceRequest, sidecar_id: str) -> pb.Result:
    detail = ("request_id was submitted before; its result went to the result channel"
              if ack.duplicate else ack.detail)
    return pb.Result(request_id=ack.request_id, trace_id=msg.trace_id, status=pb.STATUS_REJECTED,
                     finish_reason=FinishReason.REJECTED.value, received_ts=ack.received_ts,
                     finish_ts=ack.received_ts, error=detail, sidecar_id=sidecar_id,
                     priority=msg.priority, deadline_ts=msg.deadline_ts,
                     reason=int(ack.reason) if ack.reason else pb.REFUSAL_REASON_UNSPECIFIED,
                     fallback_text=ack.fallback_text, attributes=msg.attributes,
                     submit_ts=msg.submit_ts)


#: Requests admitted per step of a big ``SubmitBatch`` (between checks of the clock).
_SLICE = 64


class InferenceServicer(pb_grpc.InferenceServicer):
    """Implements ``sts.v1.Inference`` on top of a :class:`Scheduler`."""

    def __init__(self, scheduler: Scheduler, *, engine_kind: str, started_at: float,
                 submit_yield_ms: float = 5.0, intake_topic: str = "") -> None:
        self.scheduler = scheduler
        self.intake_topic = intake_topic
        """The Kafka topic the sidecar reads requests from (``GetStats`` says it)."""
        self.engine_kind = engine_kind
        self.started_at = started_at
        self.submit_yield_s = submit_yield_ms / 1000.0
        """Longest a ``SubmitBatch`` admits requests before it lets other RPCs (health) run."""
        self.tracer = scheduler.tracer
        """Notes admission times of traced requests (``None``: tracing off)."""

    async def SubmitBatch(self, request: pb.SubmitBatchRequest,
                          context: grpc.aio.ServicerContext) -> pb.SubmitBatchResponse:
        msgs = request.requests
        if self.tracer is not None:  # tracing off: this one check per batch
            return await self._submit_traced(msgs)
        if len(msgs) <= _SLICE:
            acks = self.scheduler.submit_batch([request_from_proto(r) for r in msgs])
            return submit_batch_response(acks, self.scheduler.sidecar_id)
        response = pb.SubmitBatchResponse(sidecar_id=self.scheduler.sidecar_id)
        add = response.acks.add
        clock = time.perf_counter
        since = clock()
        for start in range(0, len(msgs), _SLICE):
            if clock() - since >= self.submit_yield_s:
                # A big batch never holds the loop for long. A real sleep, not sleep(0):
                # an RPC needs several loop turns, and gRPC's poller must get the GIL.
                await asyncio.sleep(0.001)
                since = clock()
            for ack in self.scheduler.submit_batch(
                    [request_from_proto(r) for r in msgs[start:start + _SLICE]]):
                add(**_ack_fields(ack))
        return response

    async def _submit_traced(self, msgs: Sequence[pb.InferenceRequest]
                             ) -> pb.SubmitBatchResponse:
        """``SubmitBatch`` with its admission times noted for the traced requests
        (yielding the loop as the untraced path does)."""
        assert self.tracer is not None
        response = pb.SubmitBatchResponse(sidecar_id=self.scheduler.sidecar_id)
        add = response.acks.add
        since = time.perf_counter()
        for start in range(0, len(msgs), _SLICE):
            if time.perf_counter() - since >= self.submit_yield_s:
                await asyncio.sleep(0.001)
                since = time.perf_counter()
            requests = [request_from_proto(r) for r in msgs[start:start + _SLICE]]
            started = time.time_ns()
            acks = self.scheduler.submit_batch(requests)
            self.tracer.admitted(requests, acks, started, time.time_ns())
            for ack in acks:
                add(**_ack_fields(ack))
        return response

    async def Generate(self, request: pb.InferenceRequest,
                       context: grpc.aio.ServicerContext) -> pb.Result:
        outcome = await self.scheduler.generate(request_from_proto(request))
        if self.scheduler.engine_error is not None:  # its row says error / engine_unavailable
            raise EngineDeadError(self.scheduler.engine_error)
        if isinstance(outcome, Ack):
            return _ack_as_result(outcome, request, self.scheduler.sidecar_id)
        return result_to_proto(outcome)

    async def GetStats(self, request: pb.GetStatsRequest,
                       context: grpc.aio.ServicerContext) -> pb.GetStatsResponse:
        return stats_to_proto(self.scheduler.stats(), sidecar_id=self.scheduler.sidecar_id,
                              engine_kind=self.engine_kind,
                              model=self.scheduler.engine.model_name,
                              uptime_s=time.monotonic() - self.started_at,
                              intake_topic=self.intake_topic)
