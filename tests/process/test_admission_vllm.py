"""Admission of a burst on a fresh sidecar: the shipped config on the real SmolLM2.

A fresh sidecar has measured the engine's speed (warm-up calibration) but no answer yet,
so its estimate of a queue wait assumes every answer uses all of ``max_tokens``: an upper
bound, on which it must not refuse. And ``high``'s 2 s ``max_queue_delay_ms`` must not
turn away work whose deadline leaves room for the wait (README "Scheduling knobs",
step 3)."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.config import SidecarConfig
from sidecar.contract import RefusalReason
from sidecar.pb.sts.v1 import inference_pb2 as pb
from sts_harness.result_check import results_by_id
from tests.conftest import CONF
from tests.utils import RemoteSidecar, make_request, read_results, wait_for_results, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

#: Engine slots of the shipped config (``scheduler.max_in_flight``).
SLOTS = SidecarConfig.from_yaml(CONF).scheduler.max_in_flight
#: Answers that run to ``max_tokens``, so a burst's length does not depend on the text.
COUNTING = "Count from 1 to 500, one number per line, and say nothing else."
#: Time the sidecar may take past a deadline to write the row (result flush interval).
ROW_GRACE_MS = 600


@pytest.fixture(scope="module")
def fresh_sidecar(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path
                  ) -> Iterator[RemoteSidecar]:
    """``sts sidecar --config conf/sidecar.yaml`` on SmolLM2, nothing served yet."""
    results = tmp_path_factory.mktemp("admission") / "results"
    args = ["--config", str(CONF), "--model", str(smollm2_dir), "--sidecar-id", "admission"]
    with RemoteSidecar(results, args) as sidecar:
        yield sidecar


def _burst(sidecar: RemoteSidecar, prefix: str, *, deadline_in_ms: int, max_tokens: int
           ) -> tuple[dict[str, pb.SubmitAck], dict[str, dict]]:
    """``2 x SLOTS`` ``high`` requests in one SubmitBatch; their acks and, once the
    sidecar is idle again, their terminal rows (exactly one each, checked)."""
    ids = [f"{prefix}-{i}" for i in range(2 * SLOTS)]
    reply = sidecar.client.submit([
        make_request(rid, priority="high", prompt=COUNTING, max_tokens=max_tokens,
                     deadline_in_ms=deadline_in_ms) for rid in ids])
    acks = {a.request_id: a for a in reply.acks}
    assert list(acks) == ids
    wait_for_results(sidecar.results_dir, set(ids), timeout_s=deadline_in_ms / 1000 + 60)
    wait_until(lambda: not sum(p.queued + p.in_flight for p in sidecar.client.stats().pools),
               what="sidecar idle")
    # Rows are written in order: once a later request's row is in, a second row of any
    # burst request would be too.
    barrier = f"{prefix}-barrier"
    sidecar.client.submit([make_request(barrier, priority="high", max_tokens=2)])
    wait_for_results(sidecar.results_dir, {barrier})
    rows = [r for r in read_results(sidecar.results_dir) if r["request_id"] in acks]
    by_id = results_by_id(rows)  # raises on a second terminal row
    assert len(rows) == len(by_id) == len(ids), collections.Counter(r["request_id"] for r in rows)
    return acks, by_id


def test_a_fresh_sidecar_answers_a_burst_of_twice_its_slots_with_far_deadlines(
        fresh_sidecar: RemoteSidecar) -> None:
    """Half the burst must queue behind the other half for a whole answer (seconds on
    this CPU, over ``high``'s 2 s ``max_queue_delay_ms``); the 120 s deadline leaves
    room, so every request is admitted and answered."""
    assert fresh_sidecar.client.stats().accepted == 0  # nothing measured but calibration
    acks, rows = _burst(fresh_sidecar, "far", deadline_in_ms=120_000, max_tokens=24)
    refused = {rid: (a.reason, a.detail) for rid, a in acks.items() if not a.accepted}
    assert not refused, refused
    assert {rid: r["status"] for rid, r in rows.items() if r["status"] != "ok"} == {}
    waited = sorted(r["first_token_ts"] - r["received_ts"] for r in rows.values())
    # The second half started only when slots of the first half freed.
    assert waited[SLOTS] > waited[0], waited


def test_the_same_burst_with_3_s_deadlines_sheds_what_cannot_finish(
        fresh_sidecar: RemoteSidecar) -> None:
    """48 tokens at the full batch take more than 1.5 s even on a fast CPU, so the half
    that must wait for a slot cannot finish in 3 s: it is refused or times out, with a
    reason, and every row comes by its deadline."""
    acks, rows = _burst(fresh_sidecar, "near", deadline_in_ms=3000, max_tokens=48)
    for rid, ack in acks.items():
        row = rows[rid]
        assert row["finish_ts"] <= row["deadline_ts"] + ROW_GRACE_MS, row
        if not ack.accepted:
            assert ack.reason in (pb.REFUSAL_REASON_DEADLINE_INFEASIBLE,
                                  pb.REFUSAL_REASON_QUEUE_DELAY_EXCEEDED), ack
            assert (row["status"], row["reason"]) == ("shed", str(RefusalReason(ack.reason))), row
            assert row["fallback_text"], row
        elif row["status"] == "shed":  # refused later, from the queue
            assert row["reason"] in ("deadline_infeasible", "queue_delay_exceeded"), row
            assert row["output_tokens"] == 0, row
        elif row["status"] == "timeout":
            assert row["finish_reason"] == "timeout" and row["fallback_text"], row
        else:
            assert row["status"] == "ok" and row["finish_ts"] <= row["deadline_ts"], row
    statuses = collections.Counter(r["status"] for r in rows.values())
    assert statuses["ok"] <= SLOTS, statuses  # at most the half that started at once
    assert statuses["shed"] + statuses["timeout"] >= SLOTS, statuses
