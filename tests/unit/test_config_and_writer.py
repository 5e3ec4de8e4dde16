"""Configuration loading/validation, the Parquet result channel, and model preparation."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sidecar.config import (
    PoolConfig,
    ResultChannelConfig,
    SchedulerConfig,
    SidecarConfig,
)
from sidecar.contract import RESULT_SCHEMA, parse_result_file_name, result_file_name
from sidecar.model_prep import default_model_dir, is_prepared, prepare_default_model
from sidecar.request_state import ResultRecord
from sidecar.result_channels import files as files_channel
from sidecar.result_channels.files import FilesResultChannel
from spark_ext import PipelineConfig
from spark_ext.exceptions import PipelineConfigError
from tests.conftest import CONF
from tests.utils import REPO


def test_repo_config_loads_and_flags_override() -> None:
    config = SidecarConfig.from_yaml(CONF)
    assert config.engine.kind == "vllm"
    assert config.results.flush_interval_s <= 0.2
    changed = config.with_overrides({"server.listen": "unix:///tmp/x.sock",
                                     "scheduler.max_in_flight": 3, "engine.model": None})
    assert changed.server.listen == "unix:///tmp/x.sock"
    assert changed.scheduler.max_in_flight == 3
    assert changed.engine.model == config.engine.model


@pytest.mark.parametrize("bad, field", [
    ({"scheduler": {"max_in_flight": 0}}, "max_in_flight"),
    ({"results": {"flush_interval_s": 1.0}}, "flush_interval_s"),
    ({"engine": {"kind": "tgi"}}, "kind"),
    ({"scheduler": {"max_inflight": 3}}, "max_inflight"),
    ({"schedular": {}}, "schedular"),
    ({"scheduler": {"pools": {"low": {"on_deadline": "finish"}}}}, "on_deadline"),
    ({"server": {"sidecar_id": "a/b"}}, "sidecar_id"),
])
def test_bad_config_names_the_field(bad: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SidecarConfig.from_dict(bad)


def test_late_result_policy_per_pool() -> None:
    assert {p.on_deadline for p in SchedulerConfig().pools.values()} == {"abort"}
    shipped = SidecarConfig.from_yaml(CONF).scheduler.pools
    assert {name: p.on_deadline for name, p in shipped.items()} == {
        "high": "abort", "normal": "abort", "low": "finish_and_backfill"}
    assert PoolConfig(on_deadline="finish_and_backfill").on_deadline == "finish_and_backfill"


def _record(i: int, **kw) -> ResultRecord:
    fields = dict(
        request_id=f"w{i}", trace_id="t", status="ok", text="hi", finish_reason="stop",
        prompt_tokens=3, output_tokens=1, cached_tokens=0, enqueue_ts=1, received_ts=2,
        first_token_ts=None, finish_ts=4, ttft_ms=None, tpot_ms=None, error=None,
        sidecar_id="s", model="m", priority="high", deadline_ts=9, callback_topic="")
    return ResultRecord(**(fields | kw))


def test_writer_flushes_within_interval_and_files_are_complete(tmp_path: Path) -> None:
    config = ResultChannelConfig(results_dir=str(tmp_path), flush_interval_s=0.05,
                                 max_rows_per_file=4)

    async def run() -> float:
        writer = FilesResultChannel(config, "s0")
        writer.start()
        start = time.monotonic()
        writer.emit(_record(0))
        while not list(tmp_path.glob("*.parquet")):
            await asyncio.sleep(0.005)
        first_file_s = time.monotonic() - start
        for i in range(1, 10):
            writer.emit(_record(i))
        await writer.close()
        return first_file_s

    first_file_s = asyncio.run(run())
    assert first_file_s < 1.0
    files = sorted(tmp_path.glob("*.parquet"))
    tables = [pq.read_table(f) for f in files]
    assert all(t.schema.equals(RESULT_SCHEMA) for t in tables)
    assert all(t.num_rows <= 4 for t in tables)
    ids = [i for t in tables for i in t.column("request_id").to_pylist()]
    assert sorted(ids) == sorted(f"w{i}" for i in range(10))
    assert not list(tmp_path.glob(".*")), "temporary files left behind"


def test_scheduler_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="max_tokens_cap"):
        SchedulerConfig(max_tokens_cap=0)


def test_model_prepare_is_idempotent_and_vllm_loadable(smollm2_dir: Path) -> None:
    assert smollm2_dir == default_model_dir() and is_prepared(smollm2_dir)
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["head_dim"] >= 64
    assert (smollm2_dir / "model.safetensors").stat().st_size > 100_000_000
    assert "im_start" in (smollm2_dir / "chat_template.jinja").read_text()
    start = time.monotonic()
    assert prepare_default_model() == smollm2_dir
    assert time.monotonic() - start < 2.0


def test_result_file_names_are_offsets_in_one_stream(tmp_path: Path) -> None:
    config = ResultChannelConfig(results_dir=str(tmp_path), flush_interval_s=0.05,
                                 max_rows_per_file=2)

    async def run() -> FilesResultChannel:
        writer = FilesResultChannel(config, "gpu-node.1_a")
        writer.start()
        writer.emit(_record(0, attributes={"ticket_id": "T-0", "shop": "s1"}, submit_ts=5))
        writer.emit(_record(1, status="timeout", text=""))
        writer.emit(_record(1, late=True))
        for i in range(2, 7):
            writer.emit(_record(i))
        await writer.close()
        return writer

    writer = asyncio.run(run())
    files = sorted(p.name for p in tmp_path.iterdir())
    keys = [parse_result_file_name(name) for name in files]
    assert {k.stream for k in keys} == {f"gpu-node.1_a@{writer.incarnation_ms}"}
    assert [k.seq for k in keys] == list(range(len(files))) == list(range(4))
    assert files[0] == result_file_name(writer.incarnation_ms, 0, "gpu-node.1_a")
    rows = [r for name in files for r in pq.read_table(tmp_path / name).to_pylist()]
    assert [(r["request_id"], r["late"]) for r in rows][:3] == [
        ("w0", False), ("w1", False), ("w1", True)]
    assert rows[0]["attributes"] == [("ticket_id", "T-0"), ("shop", "s1")]
    assert rows[0]["submit_ts"] == 5 and rows[1]["attributes"] == []


def test_a_flush_writes_what_was_pending_when_it_began(tmp_path: Path) -> None:
    """Rows emitted while a file is being written wait for the next flush (under steady
    load the writer no longer writes small file after small file back to back); close()
    writes everything."""
    writer = FilesResultChannel(ResultChannelConfig(results_dir=str(tmp_path)), "s0")

    async def run() -> None:
        writer.emit(_record(0))
        writer.emit(_record(1))
        flush = asyncio.create_task(writer.flush())
        await asyncio.sleep(0)  # the flush took its rows and is writing them
        writer.emit(_record(2))
        await flush
        assert writer.files_written == 1 and writer.rows_written == 2
        await writer.close()

    asyncio.run(run())
    files = sorted(tmp_path.iterdir(), key=lambda p: parse_result_file_name(p.name).seq)
    assert [pq.read_table(f).column("request_id").to_pylist() for f in files] == [
        ["w0", "w1"], ["w2"]]


def test_a_failed_write_keeps_its_seq(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real, calls = files_channel.write_parquet_atomically, []

    def flaky(table, directory, name):  # type: ignore[no-untyped-def]
        calls.append(name)
        if len(calls) == 1:
            raise OSError("disk full (simulated)")
        return real(table, directory, name)

    monkeypatch.setattr(files_channel, "write_parquet_atomically", flaky)
    writer = FilesResultChannel(ResultChannelConfig(results_dir=str(tmp_path)), "s0")

    async def run() -> None:
        writer.emit(_record(0))
        with pytest.raises(OSError):
            await writer.flush()
        writer.emit(_record(1))
        await writer.flush()

    asyncio.run(run())
    assert len(calls) == 2 and calls[0] == calls[1]  # the retry reuses seq 0
    (only,) = tmp_path.iterdir()
    assert parse_result_file_name(only.name).seq == 0
    assert pq.read_table(only).column("request_id").to_pylist() == ["w0", "w1"]


def test_close_during_a_write_loses_no_row(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """close() while the flush loop is writing a file: that file is finished, the rows
    pending after it get the next sequence number, and close() returns only once both
    are on disk. (close() used to cancel the loop mid-write: the write went on in its
    thread, close() wrote the pending rows under the same name, and whichever rename
    came last replaced the other file: a result row lost after a SIGTERM drain.)"""
    real = files_channel.write_parquet_atomically
    writing, release = threading.Event(), threading.Event()

    def slow_first(table, directory, name):  # type: ignore[no-untyped-def]
        if not writing.is_set():
            writing.set()
            release.wait(10)
        return real(table, directory, name)

    monkeypatch.setattr(files_channel, "write_parquet_atomically", slow_first)
    config = ResultChannelConfig(results_dir=str(tmp_path), flush_interval_s=0.01)
    writer = FilesResultChannel(config, "s0")

    async def run() -> None:
        writer.start()
        writer.emit(_record(0))
        await asyncio.to_thread(writing.wait, 10)  # the loop's write of w0 is under way
        writer.emit(_record(1))
        closing = asyncio.create_task(writer.close())
        # Given time to go wrong (it used to return at once): close() waits for the write.
        done, _ = await asyncio.wait({closing}, timeout=0.5)
        assert not done, "close() returned while a file was still being written"
        release.set()
        await closing

    asyncio.run(run())
    files = sorted(tmp_path.iterdir(), key=lambda p: parse_result_file_name(p.name).seq)
    assert [pq.read_table(f).column("request_id").to_pylist() for f in files] == [
        ["w0"], ["w1"]]
    assert (writer.rows_written, writer.files_written) == (2, 2)


def test_model_prepare_never_replaces_a_folder_it_did_not_write(tmp_path: Path) -> None:
    """``sts model prepare --cache-dir X --force`` refuses when the model folder holds
    someone else's files, instead of deleting them (the check runs before any conversion)."""
    from sidecar.exceptions import ModelPreparationError

    target = default_model_dir(tmp_path)
    target.mkdir(parents=True)
    (target / "weights-of-my-own.bin").write_text("precious")
    with pytest.raises(ModelPreparationError, match="did not write"):
        prepare_default_model(tmp_path, force=True)
    assert (target / "weights-of-my-own.bin").read_text() == "precious"


def test_event_fields_exclude_what_a_layer_fills() -> None:
    """An event must carry the key columns and the template's own fields, not what L2
    retrieval adds (``kb_context``): the Kafka demo with L1/L2 on parsed every event as a
    dead letter ("missing required field 'kb_context'") before this."""
    from spark_ext.config import PipelineConfig

    with_kb = {"knowledge_base": {"enabled": True},
               "source": {"format": "kafka", "options": {"subscribe": "ev"}},
               "kafka": {"bootstrap_servers": "127.0.0.1:9"},
               "template": {"dynamic": "Ticket: {text}\nContext: {kb_context}"}}
    assert PipelineConfig.from_dict(with_kb).required_event_fields() == ["event_id", "text"]
    assert PipelineConfig.from_dict({**with_kb, "source": {
        **with_kb["source"], "required": ["text"]}}).required_event_fields() == ["text"]


@pytest.mark.parametrize("section, missing", [
    ({"template": {"dynamic": "Ticket: {text}\nContext: {kb_context}"}}, "kb_context"),
    ({"template": {"dynamic": "{subject}: {text}"}}, "subject"),
    ({"tagging": {"key_columns": ["ticket_id"]}}, "ticket_id"),
])
def test_a_field_no_event_carries_and_no_layer_adds_is_refused(section, missing) -> None:
    from spark_ext.config import PipelineConfig
    from spark_ext.exceptions import PipelineConfigError

    with pytest.raises(PipelineConfigError, match=f"names {missing}, which neither"):
        PipelineConfig.from_dict(section)


@pytest.mark.parametrize("change, message", [
    ({"source": {"format": "json"}}, "needs source.format: kafka"),
    ({"sidecar": {"result_channel": "files"}}, "needs sidecar.result_channel: kafka"),
    ({"routing": {"enabled": True}}, "routing.enabled runs Python UDFs"),
    ({"output": {"triggers": {"answers": "realtime"}}}, "is for the submit and publish queries"),
    ({"output": {"triggers": {"submit": "real-time"}}}, "is neither a number of seconds nor"),
    ({"kafka": {"requests_topic": "ev"}}, "kafka.requests_topic 'ev' is also"),
])
def test_a_realtime_submit_query_is_refused_where_it_cannot_run(change, message) -> None:
    """``output.triggers.submit: realtime`` only where Spark's Real-Time Mode runs it."""
    data = {"source": {"format": "kafka", "options": {"subscribe": "ev"}},
            "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
            "sidecar": {"result_channel": "kafka"},
            "output": {"triggers": {"submit": "realtime"}}}
    for section, values in change.items():
        data[section] = {**data.get(section, {}), **values}
    with pytest.raises(PipelineConfigError, match=message):
        PipelineConfig.from_dict(data)


@pytest.mark.parametrize("change, message", [
    ({"answers": {"topic": None}}, "needs answers.topic"),
    ({"sidecar": {"result_channel": "files"}}, "needs sidecar.result_channel: kafka"),
    ({"validation": {"enabled": True}}, "set validation.enabled: false"),
    ({"rollout": {"mode": "shadow"}}, "rollout.mode 'shadow' decides"),
    ({"tagging": {"key_columns": ["event_id", "text"]}}, "needs one tagging.key_columns"),
])
def test_a_realtime_publisher_is_refused_where_it_cannot_run(change, message) -> None:
    """``output.triggers.publish: realtime`` only where the model's text can go from the
    result topics to the answers topic with built-in expressions."""
    data = {"source": {"format": "kafka", "options": {"subscribe": "ev"}},
            "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
            "sidecar": {"result_channel": "kafka"}, "answers": {"topic": "answers"},
            "validation": {"enabled": False},
            "output": {"triggers": {"publish": "realtime"}}}
    assert PipelineConfig.from_dict(data).output.realtime_publish
    for section, values in change.items():
        data[section] = {**data.get(section, {}), **values}
    with pytest.raises(PipelineConfigError, match=message):
        PipelineConfig.from_dict(data)


def test_the_kafka_intake_needs_brokers_and_keeps_its_own_consumer_settings() -> None:
    """``intake.topic`` needs brokers (its own, else the result channel's); the consumer
    settings the intake's at-least-once reading rests on cannot be changed."""
    from sidecar.config import SidecarConfig
    from sidecar.exceptions import SidecarConfigError

    with pytest.raises(SidecarConfigError, match="intake.topic needs intake.bootstrap_servers"):
        SidecarConfig.from_dict({"intake": {"topic": "llm.requests"}})
    shared = SidecarConfig.from_dict({"intake": {"topic": "llm.requests"}, "results": {
        "kind": "kafka", "kafka": {"bootstrap_servers": "b:9092"}}})
    assert shared.intake_bootstrap() == "b:9092"
    for key in ("enable.auto.offset.store", "group.id"):
        with pytest.raises(SidecarConfigError, match=f"intake.consumer\\[{key!r}\\] is set by"):
            SidecarConfig.from_dict({"intake": {"consumer": {key: "x"}}})
    settings = SidecarConfig.from_dict({"intake": {
        "topic": "t", "bootstrap_servers": "a:1", "group_id": "g",
        "consumer": {"auto.offset.reset": "latest"}}}).intake.consumer_settings("a:1")
    assert (settings["group.id"], settings["auto.offset.reset"],
            settings["enable.auto.offset.store"]) == ("g", "latest", False)


def test_the_pipeline_reference_lists_every_key_at_its_default() -> None:
    """``conf/pipeline-reference.yaml`` is the one place every pipeline key is listed: it
    loads to the defaults, and names every field of every section (nothing missing when a
    key is added to ``spark_ext.config``)."""
    import dataclasses

    from sidecar import read_yaml

    reference = read_yaml(REPO / "conf" / "pipeline-reference.yaml")
    assert PipelineConfig.from_dict(reference) == PipelineConfig()

    def missing(section: object, listed: dict, path: str) -> list[str]:
        out = []
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if f.name not in listed:
                out.append(path + f.name)
            elif dataclasses.is_dataclass(value) and isinstance(listed[f.name], dict):
                out += missing(value, listed[f.name], f"{path}{f.name}.")
        return out

    assert missing(PipelineConfig(), reference, "") == []



@pytest.mark.parametrize("value", [-1, 600_001, 1.5, "1500"])
def test_the_answer_path_sent_to_the_sidecar_is_a_whole_number_of_ms(value) -> None:
    """``answers.delivery_ms`` (sent with every request) names itself when wrong."""
    assert PipelineConfig.from_dict({}).answers.delivery_ms == 1500
    assert PipelineConfig.from_dict({"answers": {"delivery_ms": 0}}).answers.delivery_ms == 0
    with pytest.raises(PipelineConfigError, match=r"delivery_ms=.* must be an integer in \[0, 600000\]"):
        PipelineConfig.from_dict({"answers": {"delivery_ms": value}})
