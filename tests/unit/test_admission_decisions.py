"""Admission decides and changes nothing outside itself; the scheduler applies the
decisions (issue 30: one way through the sidecar)."""

from __future__ import annotations

import asyncio

from sidecar.admission import Admission, GateState
from sidecar.config import LoadSheddingConfig, PoolConfig, SchedulerConfig
from sidecar.contract import Priority, RefusalReason
from sidecar.estimator import ServiceRateEstimator
from sidecar.load_control import LoadControl
from sidecar.pools import Pool
from sidecar.request_state import ResultRecord
from sidecar.scheduler import Scheduler
from sidecar.stats import SchedulerCounters
from tests.utils import fast_engine, make_sidecar_request, until, with_scheduler

HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW
OPEN = GateState(engine_error=None, draining=False, outstanding=0)


def _admission(config: SchedulerConfig) -> tuple[Admission, dict[Priority, Pool]]:
    pools = {p: Pool(p, config.pools[str(p)]) for p in Priority}
    load = LoadControl(config, pools, ServiceRateEstimator(), in_flight=lambda: 0)
    return Admission(config, engine=fast_engine(), load=load,
                     counters=SchedulerCounters()), pools


def test_admission_returns_decisions_and_changes_no_pool() -> None:
    """A batch's decisions: acks in order, the accepted requests in order with their
    waits, the refusals that get a row; the pools are untouched, and a request admitted
    earlier in the batch counts as queued for the ones after it (max_queued 2: the
    third normal is refused ``queue_full``, a high still fits its own pool)."""
    config = SchedulerConfig(max_in_flight=1, pools={"normal": PoolConfig(max_queued=2)})
    admission, pools = _admission(config)
    batch = [make_sidecar_request(f"n{i}") for i in range(3)] + \
        [make_sidecar_request("h0", priority=HIGH), make_sidecar_request("bad", max_tokens=0)]
    decisions = admission.decide(batch, OPEN)
    assert [(a.request_id, a.accepted) for a in decisions.acks] == \
        [("n0", True), ("n1", True), ("n2", False), ("h0", True), ("bad", False)]
    assert decisions.acks[2].reason is RefusalReason.QUEUE_FULL
    assert decisions.acks[2].fallback_text == config.pools["normal"].fallback_text
    assert [req.request_id for req, _ in decisions.accepted] == ["n0", "n1", "h0"]
    assert [(req.request_id, r.reason) for req, r in decisions.refused] == \
        [("bad", RefusalReason.MAX_TOKENS_OUT_OF_RANGE), ("n2", RefusalReason.QUEUE_FULL)]
    assert all(p.queued == 0 and not p.queue for p in pools.values())
    # The batch is over: the next one sees the pools as they are (nothing queued).
    assert admission.load.load.total_queued() == 0
    again = admission.decide([make_sidecar_request(f"m{i}") for i in range(2)], OPEN)
    assert all(a.accepted for a in again.acks)


def test_the_gate_reads_the_scheduler_state_it_is_given() -> None:
    admission, _ = _admission(SchedulerConfig())
    dead = admission.decide([make_sidecar_request("a")],
                            GateState(engine_error="boom", draining=False, outstanding=0))
    draining = admission.decide([make_sidecar_request("b")],
                                GateState(engine_error=None, draining=True, outstanding=0))
    assert dead.acks[0].reason is RefusalReason.ENGINE_UNAVAILABLE
    assert "boom" in dead.acks[0].detail
    assert draining.acks[0].reason is RefusalReason.DRAINING
    assert [r.reason for _, r in dead.refused + draining.refused] == \
        [RefusalReason.ENGINE_UNAVAILABLE, RefusalReason.DRAINING]


def test_watermarks_within_one_batch_shed_as_one_request_at_a_time_did() -> None:
    """Low queued at the low watermark; a batch of normals is admitted whole (the lows
    the watermark sheds for each count as gone for the next), and once applied the
    lows are shed newest first, as when each request was queued before the next."""
    marks = LoadSheddingConfig(queue_depth={"low": 4, "normal": 6})

    async def body(s: Scheduler, results: list[ResultRecord]) -> None:
        s.submit_batch([make_sidecar_request("busy", priority=HIGH, max_tokens=2000)])
        await until(lambda: s.stats().in_flight[HIGH] == 1)
        s.submit_batch([make_sidecar_request(f"l{i}", priority=LOW) for i in range(4)])
        acks = s.submit_batch([make_sidecar_request(f"n{i}", priority=NORMAL) for i in range(5)])
        assert [a.accepted for a in acks] == [True] * 5
        assert [r.request_id for r in results if r.reason == "overloaded"] == \
            ["l3", "l2", "l1", "l0"]
        assert s.stats().queued == {HIGH: 0, NORMAL: 5, LOW: 0}

    asyncio.run(with_scheduler(fast_engine(max_num_seqs=1),
                               SchedulerConfig(max_in_flight=1, load_shedding=marks), body))


def test_what_was_decided_before_a_step_raised_is_applied() -> None:
    """The tokenizer fails for the batch after a static refusal was decided and
    remembered: that refusal still gets its one row (a replay of the RPC says refused, so
    a row must exist), and the sidecar takes the next batch."""
    results: list[ResultRecord] = []

    class FailingTokenizer(type(fast_engine())):
        fail = True

        def encode_prompt(self, prompts):
            if self.fail:
                raise RuntimeError("tokenizer crashed")
            return super().encode_prompt(prompts)

    async def body() -> None:
        engine = FailingTokenizer(fast_engine().config)
        await engine.start()
        s = Scheduler(engine, results.append, SchedulerConfig(), "t")
        s.start()
        try:
            batch = [make_sidecar_request("bad", max_tokens=0), make_sidecar_request("ok1")]
            try:
                s.submit_batch(batch)
            except RuntimeError:
                pass
            else:
                raise AssertionError("the tokenizer's error must reach the caller")
            assert [(r.request_id, r.status) for r in results] == [("bad", "rejected")]
            replay = s.submit_batch([make_sidecar_request("bad", max_tokens=0)])
            assert replay[0].duplicate and not replay[0].accepted
            engine.fail = False
            [ack] = s.submit_batch([make_sidecar_request("ok1")])
            assert ack.accepted
            await until(lambda: len(results) == 2)
        finally:
            await s.abort_all()
            await engine.shutdown()

    asyncio.run(body())
    assert [(r.request_id, r.status) for r in results] == [("bad", "rejected"), ("ok1", "ok")]
