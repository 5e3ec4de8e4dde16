"""The real default model end to end, and SIGTERM draining with nothing lost."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from sidecar.contract import PRIORITY_NAMES
from sidecar.pb.sts.v1 import inference_pb2 as pb
from tests.conftest import CONF
from tests.utils import RemoteSidecar, make_request, read_results, wait_until

TICKETS = [
    "My card was charged twice for the same order. What should I do?",
    "The app logs me out every time I switch to another tab.",
    "How do I change the delivery address of an order that already shipped?",
    "I was sent the wrong size. Can I exchange it in a store?",
    "Password reset emails never arrive in my inbox.",
    "Can I get an invoice with my company's VAT number?",
]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_smollm2_answers_and_sigterm_drains(tmp_path: Path, smollm2_dir: Path) -> None:
    results = tmp_path / "results"
    prompts = [f"You are a support assistant. Answer in one sentence.\nTicket: {t}"
               for t in TICKETS]
    ids = [f"smol-{i}" for i in range(len(prompts))]
    with RemoteSidecar(results, ["--config", str(CONF), "--sidecar-id", "smol"]) as sidecar:
        reply = sidecar.client.submit(
            [make_request(rid, prompt=p, max_tokens=48, priority=PRIORITY_NAMES[i % 3])
             for i, (rid, p) in enumerate(zip(ids, prompts))])
        assert all(a.accepted for a in reply.acks)
        wait_until(lambda: sum(p.in_flight for p in sidecar.client.stats().pools),
                   what="generation started")
        sidecar.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: sidecar.client.stats().draining, what="draining")
        late = sidecar.client.submit([make_request("smol-late")]).acks[0]
        assert (late.accepted, late.reason) == (False, pb.REFUSAL_REASON_DRAINING)
        assert sidecar.proc.wait(180) == 0, sidecar.tail_log()
    rows = read_results(results)
    by_id = {r["request_id"]: r for r in rows}
    assert len(rows) == len(by_id) == len(ids) + 1, "a request has no result or two"
    for rid in ids:
        assert by_id[rid]["status"] == "ok", by_id[rid]
        assert by_id[rid]["text"].strip(), by_id[rid]
        assert by_id[rid]["model"] == "smollm2-135m-instruct"
        assert by_id[rid]["ttft_ms"] is not None and by_id[rid]["prompt_tokens"] > 0
    assert by_id["smol-late"]["status"] == "shed"
    assert not list(results.glob(".*")), "temporary files left behind"
