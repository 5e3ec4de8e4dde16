"""Property-based tests (``hypothesis``): whatever a client sends and whatever a config
file holds, the sidecar answers with acks or a clear error, writes one terminal row per
request id, stays alive, and a config either loads or fails in one line.

One sidecar (``serve`` in a background thread, simulated engine, real socket) takes every
generated ``SubmitBatch``. The suite is kept to a few seconds (``max_examples``)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.client import SidecarClient
from sidecar.config import (
    EngineConfig,
    PoolConfig,
    ResultChannelConfig,
    SchedulerConfig,
    ServerConfig,
    SidecarConfig,
)
from sidecar.contract import now_ms
from sidecar.exceptions import ConfigError
from sidecar.pb.sts.v1 import inference_pb2 as pb
from sidecar.server import serve
from tests.utils import free_port, wait_for_results

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=40)


@dataclasses.dataclass
class Sidecar:
    target: str
    results: Path
    client: SidecarClient


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """A sidecar on its own event loop in a background thread."""
    results = tmp_path_factory.mktemp("fuzz") / "results"
    target = f"127.0.0.1:{free_port()}"
    config = SidecarConfig.from_dict({
        "server": {"listen": target, "sidecar_id": "fuzz", "max_message_mb": 4},
        "engine": {"kind": "simulated",
                   "simulated": {"step_base_ms": 0.5, "step_per_seq_ms": 0.0}},
        "scheduler": {"max_in_flight": 64, "max_tokens_cap": 16, "drain_timeout_s": 5},
        "results": {"results_dir": str(results)},
    })
    loop = asyncio.new_event_loop()
    stop: list[asyncio.Event] = []

    async def main() -> None:
        stop.append(asyncio.Event())
        await serve(config, stop=stop[0])

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    client = SidecarClient(target, timeout_s=30)
    client.wait_until_serving(30)
    try:
        yield Sidecar(target, results, client)
    finally:
        client.close()
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(30)
        loop.close()


@st.composite
def requests(draw: st.DrawFn) -> pb.InferenceRequest:
    """Any field values the wire allows, with enough valid ones that some are admitted."""
    deadline = draw(st.one_of(INT64, st.integers(-1000, 60_000).map(lambda d: -d - 1),
                              st.integers(1, 60_000)))
    fields = dict(
        request_id=draw(st.one_of(st.just(""), TEXT, st.sampled_from(["dup-a", "dup-b"]))),
        trace_id=draw(TEXT),
        priority=draw(st.one_of(st.sampled_from([0, 1, 2, 3]), INT32)),
        enqueue_ts=draw(INT64),
        # a small magnitude is relative to now (admissible or just past), else absolute
        deadline_ts=deadline,
        model=draw(st.one_of(st.just(""), st.just("simulated-llm"), TEXT)),
        prompt=draw(st.one_of(st.just("hello"), st.text(max_size=300))),
        max_tokens=draw(st.one_of(st.integers(1, 16), INT32)),
        temperature=draw(st.floats(width=32)),
        cache_key=draw(TEXT),
        callback_topic=draw(TEXT),
        attributes=draw(st.dictionaries(st.text(max_size=12), st.text(max_size=60),
                                        max_size=40)),
        submit_ts=draw(INT64),
    )
    if (seed := draw(st.none() | INT64)) is not None:
        fields["seed"] = seed
    return pb.InferenceRequest(**fields)


def _resolve_deadlines(batch: list[pb.InferenceRequest]) -> list[pb.InferenceRequest]:
    now = now_ms()
    for msg in batch:
        if -61_001 <= msg.deadline_ts <= 60_000:
            msg.deadline_ts = now + msg.deadline_ts
    return batch


def test_any_submit_batch_gets_acks_or_a_clear_error_and_one_row_per_id(
        sidecar: Sidecar) -> None:
    sent: set[str] = set()

    @FUZZ
    @given(batch=st.lists(requests(), max_size=20))
    def check(batch: list[pb.InferenceRequest]) -> None:
        batch = _resolve_deadlines(batch)
        try:
            reply = sidecar.client.submit(batch)
        except grpc.RpcError as e:  # only a clear refusal of the whole call
            assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                grpc.StatusCode.RESOURCE_EXHAUSTED), e
        else:
            assert [a.request_id for a in reply.acks] == [m.request_id for m in batch]
            for ack, msg in zip(reply.acks, batch):
                assert ack.accepted or ack.reason != pb.REFUSAL_REASON_UNSPECIFIED or \
                    ack.duplicate, (ack, msg)
            sent.update(m.request_id for m in batch if m.request_id)
        assert sidecar.client.is_serving()

    check()
    # Exactly one terminal row per request id ever sent (raises on a second one).
    rows = wait_for_results(sidecar.results, sent, timeout_s=60)
    assert set(rows) == sent


@FUZZ
@given(raw=st.binary(max_size=3000))
def test_any_bytes_get_an_answer_and_the_sidecar_lives(sidecar: Sidecar, raw: bytes) -> None:
    with grpc.insecure_channel(sidecar.target) as channel:
        call = channel.unary_unary("/sts.v1.Inference/SubmitBatch")
        try:
            reply = pb.SubmitBatchResponse.FromString(call(raw, timeout=30))
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        else:
            assert len(reply.acks) == len(pb.SubmitBatchRequest.FromString(raw).requests)
    assert sidecar.client.is_serving()


# ------------------------------------------------------------------ the config loader

_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
_VALUE = st.recursive(_LEAF, lambda c: st.lists(c, max_size=3)
                      | st.dictionaries(st.text(max_size=8), c, max_size=3), max_leaves=8)


def _keys(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)] + ["bogus"]


def _section(cls: type) -> st.SearchStrategy:
    return st.one_of(_VALUE, st.dictionaries(st.sampled_from(_keys(cls)), _VALUE, max_size=4))


_POOLS = st.dictionaries(st.sampled_from(["high", "normal", "low", "urgent"]),
                         _section(PoolConfig), max_size=3)
_CONFIGS = st.fixed_dictionaries({}, optional={
    "server": _section(ServerConfig),
    "engine": _section(EngineConfig),
    "scheduler": st.one_of(_section(SchedulerConfig), st.fixed_dictionaries(
        {"pools": st.one_of(_POOLS, _VALUE)},
        optional={"load_shedding": _VALUE, "preemption": _VALUE})),
    "results": _section(ResultChannelConfig),
    "extra": _VALUE,
})


def _loads_or_one_line(path: Path) -> None:
    try:
        SidecarConfig.from_yaml(path)
    except ConfigError as e:
        message = str(e)
        assert message and "\n" not in message and message.endswith(")"), message
        assert "Traceback" not in message


@FUZZ
@given(data=_CONFIGS)
def test_any_config_mapping_loads_or_fails_in_one_line(tmp_path: Path, data: dict) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    _loads_or_one_line(path)


@FUZZ
@given(text=st.text(max_size=200))
def test_any_config_text_loads_or_fails_in_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text(text, encoding="utf-8")
    _loads_or_one_line(path)
