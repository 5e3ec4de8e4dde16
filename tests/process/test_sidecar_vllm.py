"""The sidecar process on real vLLM (tiny Llama) over a real gRPC socket."""

from __future__ import annotations

import time

import grpc
import pytest

from sidecar.pb.sts.v1 import inference_pb2 as pb
from tests.utils import (
    RemoteSidecar,
    make_request,
    read_results,
    wait_for_results,
    wait_until,
)

pytestmark = pytest.mark.timeout(300)


def _ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


def test_ack_returns_before_generation(tiny_sidecar: RemoteSidecar) -> None:
    ids = _ids("ack", 4)
    start = time.monotonic()
    reply = tiny_sidecar.client.submit(
        [make_request(i, max_tokens=300) for i in ids])
    ack_s = time.monotonic() - start
    seen_at_ack = {r["request_id"] for r in read_results(tiny_sidecar.results_dir)}
    assert [a.request_id for a in reply.acks] == ids
    assert all(a.accepted for a in reply.acks)
    assert reply.sidecar_id == "tiny-sidecar"
    assert not seen_at_ack & set(ids), "acks waited for results"
    results = wait_for_results(tiny_sidecar.results_dir, set(ids))
    done_s = time.monotonic() - start
    assert {r["status"] for r in results.values()} == {"ok"}
    assert all(r["output_tokens"] == 300 for r in results.values())
    assert ack_s < done_s / 5, f"ack took {ack_s:.3f}s, generation {done_s:.3f}s"


def test_high_priority_overtakes_queued_low(tiny_sidecar: RemoteSidecar) -> None:
    lows = _ids("prio-low", 6)
    highs = _ids("prio-high", 2)
    tiny_sidecar.client.submit([make_request(i, priority="low", max_tokens=150) for i in lows])
    tiny_sidecar.client.submit([make_request(i, priority="high", max_tokens=20) for i in highs])
    results = wait_for_results(tiny_sidecar.results_dir, set(lows) | set(highs))
    assert {r["status"] for r in results.values()} == {"ok"}
    # lows[0:2] took the two engine slots at once; the rest waited behind the highs.
    queued_low_start = min(results[i]["first_token_ts"] for i in lows[2:])
    for h in highs:
        assert results[h]["first_token_ts"] <= queued_low_start, results[h]
    assert [results[i]["priority"] for i in highs] == ["high", "high"]


def test_deadline_aborts_running_request(tiny_sidecar: RemoteSidecar) -> None:
    rid = "deadline-running"
    start = time.monotonic()
    tiny_sidecar.client.submit([make_request(rid, max_tokens=2000, deadline_in_ms=1500)])
    row = wait_for_results(tiny_sidecar.results_dir, {rid})[rid]
    assert row["status"] == "timeout"
    assert row["finish_reason"] == "timeout"
    assert 0 < row["output_tokens"] < 2000
    assert row["text"] == ""
    assert time.monotonic() - start < 5.0


def test_deadline_passes_while_queued(tiny_sidecar: RemoteSidecar) -> None:
    blockers = _ids("queued-blocker", 2)
    rid = "queued-expires"
    tiny_sidecar.client.submit([make_request(i, max_tokens=500) for i in blockers])
    tiny_sidecar.client.submit([make_request(rid, deadline_in_ms=400)])
    rows = wait_for_results(tiny_sidecar.results_dir, {rid, *blockers})
    assert rows[rid]["status"] == "timeout"
    assert rows[rid]["output_tokens"] == 0
    assert "queued" in rows[rid]["error"]
    assert all(rows[b]["status"] == "ok" for b in blockers)


def test_duplicate_request_id_is_generated_once(tiny_sidecar: RemoteSidecar) -> None:
    rid = "dup-1"
    before = tiny_sidecar.client.stats().duplicates
    first = tiny_sidecar.client.submit([make_request(rid), make_request(rid)])
    second = tiny_sidecar.client.submit([make_request(rid)])
    assert [(a.accepted, a.duplicate) for a in first.acks] == [(True, False), (True, True)]
    assert [(a.accepted, a.duplicate) for a in second.acks] == [(True, True)]
    # A wrong second copy would have been admitted with the first; a later request
    # that queues behind both is the barrier after which it would have landed.
    tiny_sidecar.client.submit([make_request("dup-1-barrier", max_tokens=4)])
    wait_for_results(tiny_sidecar.results_dir, {rid, "dup-1-barrier"})
    wait_until(lambda: not _busy(tiny_sidecar), what="sidecar idle")
    rows = [r for r in read_results(tiny_sidecar.results_dir) if r["request_id"] == rid]
    assert len(rows) == 1
    assert tiny_sidecar.client.stats().duplicates - before == 2


def _busy(sidecar: RemoteSidecar) -> int:
    return sum(p.queued + p.in_flight for p in sidecar.client.stats().pools)


def test_replay_of_refused_request_repeats_refusal(tiny_sidecar: RemoteSidecar) -> None:
    rid = "dup-refused"
    bad = make_request(rid, prompt="")
    tiny_sidecar.client.submit([bad])
    again = tiny_sidecar.client.submit([bad]).acks[0]
    assert (again.accepted, again.duplicate, again.reason) == (
        False, True, pb.REFUSAL_REASON_EMPTY_PROMPT)
    rows = wait_for_results(tiny_sidecar.results_dir, {rid})
    assert rows[rid]["status"] == "rejected"


INVALID = {
    "inv-empty": ({"prompt": ""}, pb.REFUSAL_REASON_EMPTY_PROMPT),
    "inv-blank": ({"prompt": "  \n "}, pb.REFUSAL_REASON_EMPTY_PROMPT),
    "inv-max0": ({"max_tokens": 0}, pb.REFUSAL_REASON_MAX_TOKENS_OUT_OF_RANGE),
    "inv-maxbig": ({"max_tokens": 100_000}, pb.REFUSAL_REASON_MAX_TOKENS_OUT_OF_RANGE),
    "inv-prio": ({"priority": "urgent"}, pb.REFUSAL_REASON_UNKNOWN_PRIORITY),
    "inv-prio-num": ({"priority": 7}, pb.REFUSAL_REASON_UNKNOWN_PRIORITY),
    "inv-past": ({"deadline_in_ms": -1000}, pb.REFUSAL_REASON_DEADLINE_PASSED),
    "inv-nodeadline": ({"deadline_ts": 0}, pb.REFUSAL_REASON_DEADLINE_PASSED),
    "inv-chars": ({"prompt": "x" * 70_000}, pb.REFUSAL_REASON_PROMPT_TOO_LONG),
    "inv-tokens": ({"prompt": "hello " * 4000}, pb.REFUSAL_REASON_PROMPT_TOO_LONG),
    "inv-model": ({"model": "gpt-9"}, pb.REFUSAL_REASON_UNKNOWN_MODEL),
    "inv-temp": ({"temperature": 5.0}, pb.REFUSAL_REASON_TEMPERATURE_OUT_OF_RANGE),
}


def test_each_invalid_input_is_refused_with_a_reason(tiny_sidecar: RemoteSidecar) -> None:
    requests = [make_request(rid, **extra) for rid, (extra, _) in INVALID.items()]
    requests.append(make_request("", prompt="no id"))
    requests.append(make_request("inv-control"))
    reply = tiny_sidecar.client.submit(requests)
    acks = {a.request_id: a for a in reply.acks}
    assert len(reply.acks) == len(requests)
    for rid, (_, reason) in INVALID.items():
        assert not acks[rid].accepted, rid
        assert acks[rid].reason == reason, (rid, acks[rid])
        assert acks[rid].detail, rid
    assert reply.acks[-2].reason == pb.REFUSAL_REASON_MISSING_REQUEST_ID
    assert acks["inv-control"].accepted
    rows = wait_for_results(tiny_sidecar.results_dir, set(INVALID) | {"inv-control"})
    for rid in INVALID:
        assert rows[rid]["status"] == "rejected", rows[rid]
        assert rows[rid]["error"], rid
    assert rows["inv-control"]["status"] == "ok"
    # the sidecar is still healthy after all that
    assert tiny_sidecar.client.is_serving()


def test_empty_batch_and_stats(tiny_sidecar: RemoteSidecar) -> None:
    assert list(tiny_sidecar.client.submit([]).acks) == []
    tiny_sidecar.client.submit([make_request("stats-1")])
    wait_for_results(tiny_sidecar.results_dir, {"stats-1"})
    before = tiny_sidecar.client.stats()
    tiny_sidecar.client.submit([make_request("stats-2")])
    wait_for_results(tiny_sidecar.results_dir, {"stats-2"})
    stats = tiny_sidecar.client.stats()
    assert stats.results_by_status["ok"] - before.results_by_status["ok"] == 1
    assert stats.prompt_tokens_total > before.prompt_tokens_total
    assert stats.engine == "vllm"
    assert stats.submitted - before.submitted == 1
    assert [p.priority for p in stats.pools] == [
        pb.PRIORITY_HIGH, pb.PRIORITY_NORMAL, pb.PRIORITY_LOW]


def test_garbage_bytes_get_a_grpc_error_not_a_crash(tiny_sidecar: RemoteSidecar) -> None:
    channel = grpc.insecure_channel(tiny_sidecar.target)
    call = channel.unary_unary("/sts.v1.Inference/SubmitBatch")
    with pytest.raises(grpc.RpcError) as err:
        call(b"\xff\xff\xff not a protobuf", timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    channel.close()
    assert tiny_sidecar.client.is_serving()


def test_generate_blocks_until_the_result_and_reports_it_once(
        tiny_sidecar: RemoteSidecar) -> None:
    from sidecar.pb.sts.v1 import inference_pb2 as pb

    result = tiny_sidecar.client.generate(make_request("gen-1", max_tokens=12), timeout_s=60)
    assert result.status == pb.STATUS_OK and result.output_tokens == 12 and result.text
    row = wait_for_results(tiny_sidecar.results_dir, {"gen-1"})["gen-1"]
    assert row["text"] == result.text  # the result channel has the same, single row
    again = tiny_sidecar.client.generate(make_request("gen-1"), timeout_s=10)
    assert again.status == pb.STATUS_REJECTED and "submitted before" in again.error
    refused = tiny_sidecar.client.generate(make_request("gen-2", max_tokens=0), timeout_s=10)
    assert refused.status == pb.STATUS_REJECTED
    assert refused.reason == pb.REFUSAL_REASON_MAX_TOKENS_OUT_OF_RANGE and refused.fallback_text


def test_attributes_submit_ts_and_file_names(tiny_sidecar: RemoteSidecar) -> None:
    from sidecar.contract import parse_result_file_name

    rid = "attrs-1"
    attributes = {"ticket_id": "T-9", "region": "eu-west"}
    tiny_sidecar.client.submit([make_request(rid, attributes=attributes, submit_ts=4242)])
    row = wait_for_results(tiny_sidecar.results_dir, {rid})[rid]
    assert (dict(row["attributes"]), row["submit_ts"], row["late"]) == (attributes, 4242, False)
    keys = [parse_result_file_name(p.name) for p in tiny_sidecar.results_dir.glob("*.parquet")]
    assert None not in keys
    (stream,) = {k.stream for k in keys}
    assert stream.startswith("tiny-sidecar@")
    assert sorted(k.seq for k in keys) == list(range(len(keys)))  # no gaps, from 0


def test_low_pool_finishes_and_backfills(tiny_sidecar: RemoteSidecar) -> None:
    """conf/sidecar.yaml gives `low` the finish_and_backfill policy: the timeout row
    comes at the deadline, then one late ok row when generation ends."""
    wait_until(lambda: not _busy(tiny_sidecar) and not tiny_sidecar.client.stats()
               .late_in_flight, what="sidecar idle")
    rid = "late-low"
    before = tiny_sidecar.client.stats()
    tiny_sidecar.client.submit([make_request(rid, priority="low", max_tokens=1000,
                                             deadline_in_ms=400)])

    def rows() -> list[dict]:
        return [r for r in read_results(tiny_sidecar.results_dir) if r["request_id"] == rid]

    wait_until(lambda: len(rows()) == 2, 60, what="timeout row and late row")
    wait_until(lambda: not tiny_sidecar.client.stats().late_in_flight, what="no late work")
    timeout, late = sorted(rows(), key=lambda r: r["late"])
    assert (timeout["status"], timeout["late"], timeout["text"]) == ("timeout", False, "")
    assert timeout["fallback_text"] and timeout["finish_ts"] - timeout["deadline_ts"] < 500
    assert (late["status"], late["late"], late["fallback_text"]) == ("ok", True, "")
    assert late["text"] and late["output_tokens"] > timeout["output_tokens"]
    assert late["finish_ts"] > timeout["finish_ts"] and late["tpot_ms"] is not None
    stats = tiny_sidecar.client.stats()
    assert stats.late_results - before.late_results == 1
    assert stats.results_by_status["timeout"] - before.results_by_status["timeout"] == 1
    assert stats.results_by_status["ok"] == before.results_by_status["ok"]
