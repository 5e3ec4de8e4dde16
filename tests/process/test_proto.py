"""The .proto contract: generated code matches it, and a client built from proto/ alone works."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from sidecar.pb.sts.v1 import inference_pb2, inference_pb2_grpc
from tests.utils import REPO, RemoteSidecar, wait_for_results

PROTO = "sts/v1/inference.proto"


def _compile_descriptor(tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    from grpc_tools import protoc

    out = tmp_path / "inference.pb"
    rc = protoc.main(["protoc", f"-I{REPO / 'proto'}", f"--descriptor_set_out={out}", PROTO])
    assert rc == 0
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (fd,) = [f for f in fds.file if f.name == PROTO]
    _clear_json_names(fd.message_type)  # the descriptor embedded in *_pb2.py omits them
    return fd


def _clear_json_names(messages) -> None:
    for message in messages:
        for field in message.field:
            field.ClearField("json_name")
        _clear_json_names(message.nested_type)


def test_generated_code_matches_proto(tmp_path: Path) -> None:
    fresh = _compile_descriptor(tmp_path)
    committed = descriptor_pb2.FileDescriptorProto.FromString(
        inference_pb2.DESCRIPTOR.serialized_pb)
    assert committed == fresh, "sidecar/pb is stale: run python scripts/gen_proto.py"
    service = fresh.service[0]
    stub_methods = {m for m in dir(inference_pb2_grpc.InferenceServicer) if not m.startswith("_")}
    assert {m.name for m in service.method} == stub_methods


def test_request_message_has_every_seed_field() -> None:
    fields = set(inference_pb2.InferenceRequest.DESCRIPTOR.fields_by_name)
    seed = {"request_id", "trace_id", "priority", "enqueue_ts", "deadline_ts", "model", "prompt",
            "max_tokens", "temperature", "cache_key", "callback_topic", "seed"}
    assert seed <= fields
    numbers = {f.name: f.number for f in inference_pb2.InferenceRequest.DESCRIPTOR.fields}
    assert (numbers["attributes"], numbers["submit_ts"]) == (13, 14)
    result = set(inference_pb2.Result.DESCRIPTOR.fields_by_name)
    design = {"request_id", "trace_id", "status", "text", "finish_reason", "prompt_tokens",
              "output_tokens", "cached_tokens", "enqueue_ts", "received_ts", "first_token_ts",
              "finish_ts", "ttft_ms", "tpot_ms", "error", "sidecar_id", "model"}
    assert design <= result


def test_result_schema_matches_result_message() -> None:
    """RESULT_SCHEMA has the Result message's fields, in field-number order, with
    matching types (enums are strings in the table, maps are Arrow maps)."""
    import pyarrow as pa
    from google.protobuf.descriptor import FieldDescriptor as F

    from sidecar.contract import RESULT_SCHEMA

    fields = sorted(inference_pb2.Result.DESCRIPTOR.fields, key=lambda f: f.number)
    assert RESULT_SCHEMA.names == [f.name for f in fields]
    arrow = {F.TYPE_STRING: pa.string(), F.TYPE_ENUM: pa.string(), F.TYPE_INT32: pa.int32(),
             F.TYPE_INT64: pa.int64(), F.TYPE_DOUBLE: pa.float64(), F.TYPE_BOOL: pa.bool_()}
    for f in fields:
        expected = (pa.map_(pa.string(), pa.string()) if f.message_type is not None
                    else arrow[f.type])
        assert RESULT_SCHEMA.field(f.name).type == expected, f.name
    assert [(f.name, f.number) for f in fields[-3:]] == [
        ("attributes", 23), ("submit_ts", 24), ("late", 25)]
    assert not RESULT_SCHEMA.field("late").nullable
    assert inference_pb2.REFUSAL_REASON_ATTRIBUTES_TOO_LARGE == 14


CLIENT = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    import grpc
    from sts.v1 import inference_pb2 as pb, inference_pb2_grpc as pbg
    now = int(time.time() * 1000)
    reqs = [pb.InferenceRequest(request_id=f"protoc-{i}", trace_id="t", priority=pb.PRIORITY_HIGH,
                                enqueue_ts=now, deadline_ts=now + 60000,
                                prompt="Reply with one word.", max_tokens=8, temperature=0.0)
            for i in range(3)]
    reqs.append(pb.InferenceRequest(request_id="protoc-bad", priority=pb.PRIORITY_LOW,
                                    deadline_ts=now + 60000, prompt="", max_tokens=8))
    with grpc.insecure_channel(sys.argv[2]) as ch:
        reply = pbg.InferenceStub(ch).SubmitBatch(pb.SubmitBatchRequest(requests=reqs), timeout=10)
    print(json.dumps([[a.request_id, a.accepted, pb.RefusalReason.Name(a.reason)]
                      for a in reply.acks]))
""")


@pytest.mark.timeout(300)
def test_client_generated_from_proto_alone(tmp_path: Path, tiny_sidecar: RemoteSidecar) -> None:
    out = tmp_path / "gen"
    out.mkdir()
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO / 'proto'}",
                    f"--python_out={out}", f"--grpc_python_out={out}", PROTO], check=True)
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    # A separate interpreter in an empty directory: nothing of the package is importable.
    done = subprocess.run([sys.executable, "-I", str(script), str(out), tiny_sidecar.target],
                          cwd=tmp_path, capture_output=True, text=True, check=True, timeout=60)
    acks = json.loads(done.stdout)
    assert acks == [[f"protoc-{i}", True, "REFUSAL_REASON_UNSPECIFIED"] for i in range(3)] + [
        ["protoc-bad", False, "REFUSAL_REASON_EMPTY_PROMPT"]]
    rows = wait_for_results(tiny_sidecar.results_dir, {f"protoc-{i}" for i in range(3)})
    assert {r["status"] for r in rows.values()} == {"ok"}
    assert all(r["text"] for r in rows.values())
